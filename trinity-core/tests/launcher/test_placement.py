"""Actor resource requests per role (the GPU split), as pure logic."""

from __future__ import annotations

import pytest

from trinity.config import Config
from trinity.placement import actor_resources


def _config(mode="both", engine="transformers", engine_num=1, trainer="native") -> Config:
    return Config.model_validate(
        {
            "mode": mode,
            "explorer": {"rollout_model": {"engine_type": engine, "engine_num": engine_num}},
            "trainer": {"trainer_type": trainer},
        }
    )


def test_cpu_cluster_asks_for_no_gpus():
    assert actor_resources(_config(), 0) == {"explorer": {"num_cpus": 1}, "trainer": {"num_cpus": 1}}


def test_one_gpu_is_shared_by_both_roles():
    res = actor_resources(_config(), 1)
    assert res["explorer"]["num_gpus"] == pytest.approx(0.5)
    assert res["trainer"]["num_gpus"] == pytest.approx(0.5)


def test_enough_gpus_each_role_gets_its_own():
    res = actor_resources(_config(engine_num=2), 4)
    assert res["explorer"]["num_gpus"] == 2
    assert res["trainer"]["num_gpus"] == 1


@pytest.mark.parametrize(
    ("engine", "trainer"), [("vllm", "verl"), ("vllm", "native"), ("transformers", "verl")]
)
def test_backends_that_reserve_their_own_gpus_leave_the_actor_without(engine, trainer):
    res = actor_resources(_config(engine=engine, trainer=trainer), 8)
    assert ("num_gpus" in res["explorer"]) == (engine == "transformers")
    assert ("num_gpus" in res["trainer"]) == (trainer == "native")


def test_single_role_modes():
    assert "num_gpus" not in actor_resources(_config(mode="train"), 1)["explorer"]
    assert actor_resources(_config(mode="train"), 1)["trainer"]["num_gpus"] == 1
    assert actor_resources(_config(mode="explore"), 1)["explorer"]["num_gpus"] == 1
