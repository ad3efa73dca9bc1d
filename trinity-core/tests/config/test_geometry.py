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


def test_workflows_that_train_more_than_their_rollouts_fill_a_batch_in_fewer_explore_steps():
    # Each rollout makes two experiences (an answer and a judging, say): a train batch of 24 is
    # one explore step of 3 tasks x 4 rollouts, not two.
    g = BatchGeometry("grpo", 3, 4, experiences_per_train_step=24, experiences_per_rollout=2.0)
    assert (g.experiences_per_explore_step, g.explore_steps_per_train_step) == (24.0, 1.0)
    assert [g.explore_steps_through(t) for t in (1, 2, 3)] == [1, 2, 3]


def test_workflows_train_one_experience_per_rollout_unless_they_say_otherwise():
    from trinity.workflow import Workflow

    assert Workflow.experiences_per_rollout({}) == 1.0
    assert resolved().geometry.experiences_per_rollout == 1.0


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
