"""The built-in experience operators and the experience pipeline (no Ray, no model)."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.data.experience_ops import EXPERIENCE_OPERATORS
from trinity.data.pipeline import ExperiencePipeline, PipelineWriter
from trinity.experience import EID, Experience
from trinity.plugins import get_component
from trinity.testing import check_component


def _exp(task: int, run: int, reward: float | None, response: list[int] | None = None, **info) -> Experience:
    response = response if response is not None else [10 + run, 11]
    return Experience(
        tokens=torch.tensor([1, 2, 3, *response]),
        prompt_length=3,
        reward=reward,
        eid=EID(batch=1, task=task, run=run),
        info=dict(info),
        response_text=" ".join(map(str, response)),
    )


def _step(rewards: dict[int, list[float | None]]) -> list[Experience]:
    return [_exp(task, run, r) for task, rs in rewards.items() for run, r in enumerate(rs)]


@pytest.mark.parametrize("name", sorted(EXPERIENCE_OPERATORS))
def test_every_builtin_is_registered_and_conforms(name):
    cls = get_component("operator", name)
    assert cls is EXPERIENCE_OPERATORS[name]
    check_component("operator", cls)


def test_reward_shaping_adds_weighted_stats_and_reports_the_change():
    op = EXPERIENCE_OPERATORS["reward_shaping_mapper"](
        reward_shaping_configs=[
            {"stats_key": "quality", "op_type": "ADD", "weight": 0.5},
            {"stats_key": "scale", "op_type": "mul", "weight": 2.0},
        ]
    )
    exps = [
        _exp(0, 0, 1.0, quality=1.0, scale=1.5),
        _exp(0, 1, 0.0, quality=0.2),
        _exp(1, 0, None, quality=3.0),
    ]
    out, metrics = op.process(exps)
    assert [e.reward for e in out] == [pytest.approx((1.0 + 0.5) * 3.0), pytest.approx(0.1), None]
    assert metrics["missing_stats"] == 1.0  # the second lacks `scale`; the unrewarded one is skipped
    assert metrics["reward_diff/max"] == pytest.approx(3.5) and metrics["reward_diff/min"] == pytest.approx(
        0.1
    )


def test_reward_shaping_refuses_an_unknown_op_type_in_one_line():
    with pytest.raises(ValueError, match=r"reward_shaping_configs\[0\]\.op_type 'POW' is not one of"):
        EXPERIENCE_OPERATORS["reward_shaping_mapper"](
            reward_shaping_configs=[{"stats_key": "x", "op_type": "POW"}]
        )


def test_reward_std_filter_drops_groups_without_signal_and_singletons():
    exps = _step({0: [1.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0], 2: [0.0, 0.0, 0.0], 3: [1.0]})
    out, metrics = EXPERIENCE_OPERATORS["reward_std_filter"]().process(exps)
    assert {e.eid.task for e in out} == {1} and len(out) == 3
    assert metrics == {"dropped_groups": 3.0}


def test_reward_std_filter_sees_equal_shaped_rewards_as_equal():
    # 1.0 + 0.1, eight times: a float mean of 1.1000000000000003 must not make a signal.
    exps = _step({0: [1.1] * 8, 1: [1.1] * 7 + [1.2]})
    out, metrics = EXPERIENCE_OPERATORS["reward_std_filter"]().process(exps)
    assert {e.eid.task for e in out} == {1} and metrics == {"dropped_groups": 1.0}


def test_reward_and_invalid_reward_filters():
    exps = _step({0: [1.0, 0.0, None, math.nan, math.inf, -1.0]})
    kept, _ = EXPERIENCE_OPERATORS["reward_filter"](threshold=0.0).process(list(exps))
    assert [e.reward for e in kept] == [1.0, 0.0]  # non-finite rewards never pass a threshold
    kept, _ = EXPERIENCE_OPERATORS["invalid_reward_filter"]().process(list(exps))
    assert [e.reward for e in kept] == [1.0, 0.0, -1.0]


def test_pass_rate_calculator_writes_each_groups_rate():
    exps = _step({0: [1.0, 0.0, 1.0, 0.0], 1: [1.0, 1.0], 2: [0.0, 0.0]})
    out, metrics = EXPERIENCE_OPERATORS["pass_rate_calculator"]().process(exps)
    assert [e.info["pass_rate"] for e in out] == [0.5] * 4 + [1.0] * 2 + [0.0] * 2
    assert metrics["valid_ratio"] == pytest.approx(1 / 3) and metrics["all_pass_ratio"] == pytest.approx(
        1 / 3
    )
    assert metrics["mean_pass_rate"] == pytest.approx(0.5)


def test_duplicate_filter_by_group_or_step():
    exps = [_exp(0, 0, 1.0, [5, 6]), _exp(0, 1, 1.0, [5, 6]), _exp(1, 0, 0.0, [5, 6]), _exp(1, 1, 0.0, [7])]
    kept, _ = EXPERIENCE_OPERATORS["duplicate_filter"]().process(list(exps))
    assert [(e.eid.task, e.eid.run) for e in kept] == [(0, 0), (1, 0), (1, 1)]
    kept, _ = EXPERIENCE_OPERATORS["duplicate_filter"](scope="step", by="text").process(list(exps))
    assert [(e.eid.task, e.eid.run) for e in kept] == [(0, 0), (1, 1)]


class _ListWriter:
    def __init__(self):
        self.rows, self.ended, self.finished = [], [], False

    def write(self, experiences):
        self.rows.extend(experiences)

    def end_step(self, step):
        self.ended.append(step)

    def finish(self):
        self.finished = True

    def metrics(self):
        return {"buffer/written": float(len(self.rows))}


def test_pipeline_writer_runs_the_operators_in_order_and_counts_drops():
    ops = EXPERIENCE_OPERATORS
    pipeline = ExperiencePipeline(
        [
            (
                "reward_shaping_mapper",
                ops["reward_shaping_mapper"]([{"stats_key": "bonus", "op_type": "ADD"}]),
            ),
            ("reward_std_filter", ops["reward_std_filter"]()),
        ]
    )
    inner, raw = _ListWriter(), _ListWriter()
    writer = PipelineWriter(inner, pipeline, raw)
    # Task 0 has no signal until the bonus reshapes one rollout; task 1 never has any.
    step = [_exp(0, 0, 1.0, bonus=0.5), _exp(0, 1, 1.0, bonus=0.0), _exp(1, 0, 0.0), _exp(1, 1, 0.0)]
    writer.write(step)
    writer.end_step(1)
    assert [(e.eid.task, e.reward) for e in inner.rows] == [(0, 1.5), (0, 1.0)]
    assert len(raw.rows) == 4 and inner.ended == [1]
    metrics = writer.metrics()
    assert metrics["pipeline/reward_std_filter/dropped"] == 2.0 and metrics["pipeline/dropped"] == 2.0
    assert metrics["pipeline/reward_std_filter/dropped_groups"] == 1.0
    assert metrics["pipeline/reward_shaping_mapper/reward_diff/max"] == 0.5
    assert metrics["buffer/written"] == 2.0 and metrics["pipeline/dropped_total"] == 2.0
    writer.finish()
    assert inner.finished and raw.finished


def test_a_failing_operator_names_itself():
    class Broken:
        def process(self, experiences):
            raise KeyError("quality")

    with pytest.raises(RuntimeError, match=r"experience operator 'broken' failed on 1 experiences: KeyError"):
        ExperiencePipeline([("broken", Broken())]).process([_exp(0, 0, 1.0)])
