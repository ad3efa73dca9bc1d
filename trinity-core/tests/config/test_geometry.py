"""The batch geometry resolve_config derives once (trinity.config.geometry) and what reads it."""

from __future__ import annotations

import pickle

import pytest

from trinity.config import Config, resolve_config, stage_configs
from trinity.config.geometry import BatchGeometry

TASKSETS = {"explorer_input": {"tasksets": [{"path": "t.jsonl"}]}}


def resolved(**algorithm_and_buffer):
    algorithm = algorithm_and_buffer.pop("algorithm", {"algorithm_type": "grpo", "repeat_times": 4})
    buffer = {"batch_size": 3, **TASKSETS, **algorithm_and_buffer}
    return resolve_config(
        Config(model={"model_path": "m", "max_model_len": 64}, algorithm=algorithm, buffer=buffer)
    )


def test_the_default_train_batch_is_one_explore_step():
    g = resolved().geometry
    assert g == BatchGeometry("grpo", tasks_per_explore_step=3, repeat_times=4, experiences_per_train_step=12)
    assert (g.rollouts_per_explore_step, g.explore_steps_per_train_step) == (12, 1.0)
    assert [g.explore_steps_through(t) for t in (1, 2, 5)] == [1, 2, 5]
    assert [g.train_step_reading(e) for e in (1, 2, 5)] == [1, 2, 5]


@pytest.mark.parametrize(
    ("train_batch_size", "through", "reading"),
    [
        (24, [2, 4, 6], [1, 1, 2, 2, 3]),  # a train step reads two explore steps
        (6, [1, 1, 2], [2, 4, 6, 8, 10]),  # two train steps share an explore step
        (18, [2, 3, 5], [1, 2, 2, 3, 4]),  # 1.5 explore steps per train step
    ],
)
def test_train_steps_and_explore_steps_map_both_ways(train_batch_size, through, reading):
    g = resolved(train_batch_size=train_batch_size).geometry
    assert [g.explore_steps_through(t) for t in (1, 2, 3)] == through
    assert [g.train_step_reading(e) for e in (1, 2, 3, 4, 5)] == reading


def test_the_geometry_travels_with_the_config():
    config = resolved(train_batch_size=24)
    assert pickle.loads(pickle.dumps(config)).geometry == config.geometry  # to Ray actors
    assert config.model_copy(deep=True).geometry == config.geometry
    with pytest.raises(RuntimeError, match="resolve_config"):
        Config().geometry  # noqa: B018 - the property raises


def test_each_stage_has_its_own_geometry():
    config = resolve_config(
        Config(
            model={"model_path": "m", "max_model_len": 64},
            algorithm={"algorithm_type": "grpo", "repeat_times": 4},
            buffer={"batch_size": 3, **TASKSETS},
            stages=[
                {"stage_name": "a"},
                {"stage_name": "b", "buffer": {"batch_size": 5}, "algorithm": {"repeat_times": 2}},
            ],
        )
    )
    a, b = stage_configs(config)
    assert (a.geometry.rollouts_per_explore_step, b.geometry.rollouts_per_explore_step) == (12, 10)
