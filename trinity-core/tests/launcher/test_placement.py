"""Actor resource requests per role (the GPU split) and CPU thread shares, as pure logic."""

from __future__ import annotations

import os

import pytest

from trinity.actors import use_cpu_share
from trinity.config import Config, ConfigError, resolve_config
from trinity.placement import actor_resources, cpu_shares, takes_turns


def _config(mode="both", engine="transformers", engine_num=1, trainer="native", **sync) -> Config:
    return Config.model_validate(
        {
            "mode": mode,
            "explorer": {"rollout_model": {"engine_type": engine, "engine_num": engine_num}},
            "trainer": {"trainer_type": trainer},
            "synchronizer": sync,
        }
    )


def test_cpu_cluster_asks_for_no_gpus():
    assert actor_resources(_config(), 0) == {"explorer": {"num_cpus": 1}, "trainer": {"num_cpus": 1}}


@pytest.mark.parametrize("gpus", [0, 8])
def test_the_verl_driver_leaves_its_cpu_to_the_verl_ranks(gpus):
    # veRL's ranks reserve a CPU each; a CPU held by the driver would be one rank fewer.
    assert actor_resources(_config(trainer="verl"), gpus)["trainer"]["num_cpus"] == 0
    assert actor_resources(_config(trainer="verl"), gpus)["explorer"]["num_cpus"] == 1


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


@pytest.mark.parametrize(
    "sync",
    [
        {"sync_offset": 1},
        {"sync_interval": 2},
        {"sync_style": "dynamic"},
        {"sync_style": "explorer_driven"},
        {"sync_style": "trainer_driven"},
    ],
)
def test_cpu_roles_that_may_compute_at_once_split_the_cores(sync):
    assert not takes_turns(_config(**sync))
    assert cpu_shares(_config(**sync), 0) == {"explorer": 0.5, "trainer": 0.5}


@pytest.mark.parametrize("mode", ["both", "colocate"])
def test_roles_taking_turns_each_get_every_core(mode):
    # Strictly on-policy (the default sync): no explore step or eval overlaps a train step
    # (test_sync_styles.py), so each role may use every core while it computes.
    assert takes_turns(_config(mode=mode))
    assert cpu_shares(_config(mode=mode), 0) == {"explorer": 1.0, "trainer": 1.0}


@pytest.mark.parametrize(
    ("mode", "role"), [("train", "trainer"), ("explore", "explorer"), ("bench", "explorer")]
)
def test_a_role_alone_gets_every_core(mode, role):
    assert cpu_shares(_config(mode=mode, sync_offset=1), 0) == {role: 1.0}


def test_roles_on_gpus_or_external_backends_keep_rays_thread_count():
    assert cpu_shares(_config(), 2) == {}
    # vLLM computes in its own GPU workers even when the explorer actor asks for no GPU.
    assert cpu_shares(_config(engine="vllm", trainer="verl"), 8) == {}
    assert cpu_shares(_config(engine="vllm"), 0) == {"trainer": 1.0}


def test_use_cpu_share_sets_torch_threads_from_the_cores_it_may_use():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert use_cpu_share(None) is None
        assert torch.get_num_threads() == before
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        assert use_cpu_share(1.0) == cores == torch.get_num_threads()
        # A share never rounds down to zero threads.
        assert use_cpu_share(1 / (cores + 1)) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


# -- mode colocate: trainer and explorer share one GPU (on CPU, the cores) ---------------------


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_colocate_shares_one_gpu_however_many_the_cluster_has(gpus):
    res = actor_resources(_config(mode="colocate"), gpus)
    assert res["explorer"]["num_gpus"] == pytest.approx(0.5)
    assert res["trainer"]["num_gpus"] == pytest.approx(0.5)


def test_colocate_on_cpu_runs_as_both_sharing_the_cores():
    assert actor_resources(_config(mode="colocate"), 0) == actor_resources(_config(mode="both"), 0)
    assert cpu_shares(_config(mode="colocate"), 0) == cpu_shares(_config(mode="both"), 0)
    assert cpu_shares(_config(mode="colocate", sync_offset=1), 0) == {"explorer": 0.5, "trainer": 0.5}


def _colocate(**keys) -> Config:
    source = {
        "mode": "colocate",
        "model": {"model_path": "m", "max_model_len": 64},
        "algorithm": {"algorithm_type": "ppo"},
        "buffer": {"batch_size": 2, "explorer_input": {"tasksets": [{"path": "t.jsonl"}]}},
        **keys,
    }
    return resolve_config(Config.model_validate(source))


def test_colocate_syncs_weights_through_memory_by_default():
    assert _colocate().synchronizer.sync_method == "memory"
    assert _colocate(synchronizer={"sync_method": "checkpoint"}).synchronizer.sync_method == "checkpoint"


@pytest.mark.parametrize(
    ("keys", "key", "message"),
    [
        ({"synchronizer": {"sync_method": "nccl"}}, "synchronizer.sync_method", "cannot use nccl"),
        ({"synchronizer": {"sync_method": "online"}}, "synchronizer.sync_method", "cannot use nccl"),
        ({"explorer": {"rollout_model": {"engine_num": 2}}}, "explorer.rollout_model.engine_num", "is 2;"),
        (
            {"explorer": {"rollout_model": {"tensor_parallel_size": 2}}},
            "explorer.rollout_model.tensor_parallel_size",
            "is 2;",
        ),
        (
            {"explorer": {"auxiliary_models": [{"model_path": "judge"}]}},
            "explorer.auxiliary_models",
            "runs no auxiliary models",
        ),
        (
            {"trainer": {"ulysses_sequence_parallel_size": 2}},
            "trainer.ulysses_sequence_parallel_size",
            "is 2;",
        ),
        ({"cluster": {"node_num": 1, "gpu_per_node": 2}}, "mode", "node_num * cluster.gpu_per_node is 2"),
        (
            {"buffer": {"batch_size": 2}},
            "buffer.explorer_input.tasksets",
            "needs at least one training taskset",
        ),
    ],
)
def test_colocate_refuses_what_one_gpu_cannot_hold(keys, key, message):
    with pytest.raises(ConfigError) as info:
        _colocate(**keys)
    assert info.value.key == key
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_colocate_on_one_gpu_is_accepted():
    config = _colocate(cluster={"node_num": 1, "gpu_per_node": 1})
    assert config.mode == "colocate"
