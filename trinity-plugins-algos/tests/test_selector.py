"""offline_easy2hard and difficulty_based (BOTS): orders, the estimator's updates, sampling,
resume, and use from a taskset config as upstream's BOTS example writes it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import yaml

from trinity import hookimpl
from trinity.buffer.taskset import TasksetError, TasksetScheduler
from trinity.config import TasksetConfig
from trinity.testing import check_component
from trinity.workflow import Workflow
from trinity_algos.selector import SELECTORS, DifficultyBasedSelector, OfflineEasy2HardSelector


class EchoWorkflow(Workflow):
    def run(self):
        return []


class Plugin:
    """What trinity_algos.hooks registers for selectors, plus a workflow for the tasksets."""

    @hookimpl
    def register_selectors(self, register):
        for name, cls in SELECTORS.items():
            register(name, cls)

    @hookimpl
    def register_workflows(self, register):
        register("echo", EchoWorkflow)


@pytest.fixture
def plugin(register_plugin):
    register_plugin(Plugin(), "algos-selectors")


def pass_rates(n: int, seed: int = 0) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 17, n) / 16
    high = np.minimum(1.0, low + rng.integers(0, 9, n) / 16)
    return {"small": low.tolist(), "large": high.tolist()}


# -- conformance -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,init_args",
    [
        ("offline_easy2hard", {}),
        ("difficulty_based", {}),
        ("difficulty_based", {"tau": 0, "do_sample": True, "target_reward": 0.5, "m": 8}),
        ("difficulty_based", {"tau": 0.05, "adaptive_rho": True, "lamb": 0.0, "rho": 1.0}),
    ],
)
def test_conformance(name, init_args):
    check_component("selector", SELECTORS[name], init_args=init_args)


def test_default_args_are_upstreams():
    assert OfflineEasy2HardSelector.default_args() == {}
    assert DifficultyBasedSelector.default_args() == {
        "m": 16,
        "lamb": 0.2,
        "rho": 0.2,
        "adaptive_rho": False,
        "target_reward": 1.0,
        "tau": 1.0,
        "do_sample": False,
        "cap_coef_update_discount": 0.9,
    }


def test_hooks_module_stays_light():
    code = (
        "import json, sys, trinity_algos.selector\n"
        "print(json.dumps([m in sys.modules for m in ('numpy', 'torch')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False]


# -- offline_easy2hard ----------------------------------------------------------------------------


def test_easy2hard_reads_highest_features_first_every_epoch():
    a = [0.9, 0.1, 0.5, 0.9, 0.5, 0.3]
    b = [1, 2, 3, 0, 3, 7]
    sel = OfflineEasy2HardSelector(6, features={"a": a, "b": b})
    # Upstream: sorted([features..., index])[::-1] -> by a, then b, then the later row, descending.
    reference = [row[-1] for row in sorted([[a[i], b[i], i] for i in range(6)])[::-1]]
    assert reference == [0, 3, 4, 2, 5, 1]
    assert sel.indices(0, 6) == reference
    assert sel.indices(6, 8) == reference + reference[:2]
    assert sel.state_dict() == {}


def test_easy2hard_needs_numeric_features():
    with pytest.raises(ValueError, match="needs feature_keys"):
        OfflineEasy2HardSelector(3)
    with pytest.raises(ValueError, match=r"2 of 4 rows have none \(first: usable row 1, value None\)"):
        OfflineEasy2HardSelector(4, features={"d": [0.1, None, "0.3", 0.2]})


# -- difficulty_based: the estimator ------------------------------------------------------------


def reference_update(state, anchors, rows, observed, *, m, lamb, rho, adaptive_rho, discount=0.9):
    """Trinity-RFT's InterpolationBetaPREstimator.update, written out for one step."""
    alphas, betas, cap = state["alphas"], state["betas"], state["cap"]
    low, high = anchors[rows].mean(axis=0)
    estimate = (np.mean(observed) - low) / (high - low + 1e-6)
    cap = estimate if cap is None else discount * cap + (1 - discount) * estimate
    n = len(alphas)
    s_bar, f_bar = np.zeros(n), np.zeros(n)
    s_bar[rows] = observed * m
    f_bar[rows] = (1 - observed) * m
    p = np.clip((anchors[:, 1] - anchors[:, 0]) * cap + anchors[:, 0], 0, 1)
    if adaptive_rho and np.mean(np.abs(p[rows] - observed)) >= 0.25:
        rho *= 0.5
    p[rows] = observed
    alphas = (1 - lamb) * alphas + lamb + (1 - rho) * s_bar + rho * p * m
    betas = (1 - lamb) * betas + lamb + (1 - rho) * f_bar + rho * (1 - p) * m
    return {"alphas": alphas, "betas": betas, "cap": cap, "rho": rho}


@pytest.mark.parametrize("adaptive_rho", [False, True])
def test_difficulty_estimates_follow_upstreams_update(adaptive_rho):
    features = pass_rates(20)
    anchors = np.array([features["small"], features["large"]]).T
    args = {"m": 16, "lamb": 0.1, "rho": 0.4, "adaptive_rho": adaptive_rho}
    sel = DifficultyBasedSelector(20, features=features, **args)
    state = {"alphas": np.ones(20), "betas": np.ones(20), "cap": None, "rho": 0.4}
    steps = [([3, 7, 11], [1.0, 0.0, 0.0]), ([0, 7, 19, 5], [0.5, 0.25, 1.0, 0.0]), ([2], [0.9375])]
    for rows, observed in steps:
        sel.update(rows, observed)
        state = reference_update(
            state, anchors, np.array(rows), np.array(observed), **{**args, "rho": state["rho"]}
        )
        np.testing.assert_allclose(sel.alphas, state["alphas"])
        np.testing.assert_allclose(sel.betas, state["betas"])
        assert sel.cap_coef == pytest.approx(state["cap"]) and sel.rho == pytest.approx(state["rho"])
    assert (sel.rho < 0.4) == adaptive_rho  # the first step misses by far more than 0.25


def test_update_merges_repeats_clips_and_skips_non_finite(caplog):
    features = pass_rates(6)
    a = DifficultyBasedSelector(6, features=features)
    b = DifficultyBasedSelector(6, features=features)
    with caplog.at_level(logging.WARNING, logger="trinity_algos.selector"):
        a.update([1, 1, 2, 4, 5], [1.0, 0.0, 2.0, float("nan"), -1.0])
    b.update([1, 2, 5], [0.5, 1.0, 0.0])
    np.testing.assert_allclose(a.alphas, b.alphas)
    assert "clipped" in caplog.text
    before = a.alphas.copy()
    a.update([3], [float("inf")])
    a.update([], [])
    np.testing.assert_array_equal(a.alphas, before)
    with pytest.raises(ValueError, match="2 indices but 1 values"):
        a.update([0, 1], [1.0])


# -- difficulty_based: selection ------------------------------------------------------------------


def test_tau_zero_takes_the_rows_closest_to_the_target():
    features = {"small": [0.0] * 8, "large": [1.0] * 8}
    sel = DifficultyBasedSelector(8, features=features, tau=0, target_reward=0.5, m=4)
    sel.alphas = np.array([1, 9, 5, 2, 1, 4, 3, 6], dtype=float)
    sel.betas = np.full(8, 4.0)  # means 0.2 .69 .56 .33 .2 .5 .43 .6
    assert sel.indices(0, 3) == [5, 2, 6]
    assert sel.indices(100, 3) == [5, 2, 6]  # no randomness without do_sample
    whole = sel.indices(0, 8)
    assert sorted(whole) == list(range(8))  # without replacement
    assert sel.indices(0, 10) == whole + whole[:2]  # more than the rows: the ranking again


def test_sampling_is_seeded_without_replacement_and_prefers_the_target():
    features = {"small": [0.0] * 50, "large": [1.0] * 50}
    sel = DifficultyBasedSelector(50, features=features, tau=0.05, target_reward=1.0, seed=3)
    sel.alphas = np.linspace(1, 50, 50)
    sel.betas = np.full(50, 5.0)  # later rows look easier: closer to target 1.0
    batch = sel.indices(10, 20)
    assert len(set(batch)) == 20
    twin = DifficultyBasedSelector(50, features=features, tau=0.05, target_reward=1.0, seed=3)
    twin.alphas, twin.betas = sel.alphas.copy(), sel.betas.copy()
    assert twin.indices(10, 20) == batch
    assert sel.indices(11, 20) != batch  # another position, another draw
    counts = np.zeros(50)
    for start in range(200):
        counts[sel.indices(start, 5)] += 1
    assert counts[40:].sum() > 5 * counts[:10].sum()


def test_do_sample_draws_from_the_posteriors_seeded_by_position():
    features = pass_rates(30)
    sel = DifficultyBasedSelector(30, features=features, do_sample=True, tau=0, target_reward=0.5)
    assert sel.indices(4, 6) == sel.indices(4, 6)
    assert sel.indices(4, 6) != sel.indices(5, 6)


# -- resume ------------------------------------------------------------------------------------------


def test_state_round_trip_gives_the_same_future_order():
    features = pass_rates(40)
    args = {"tau": 0.2, "target_reward": 0.5, "do_sample": True, "adaptive_rho": True}
    sel = DifficultyBasedSelector(40, features=features, seed=5, **args)
    position = 0
    for _ in range(3):
        batch = sel.indices(position, 8)
        position += 8
        sel.update(batch, [(i % 5) / 4 for i in batch])
    state = json.loads(json.dumps(sel.state_dict()))
    resumed = DifficultyBasedSelector(40, features=features, seed=5, **args)
    resumed.load_state_dict(state)
    for start in (position, position + 8):
        assert resumed.indices(start, 8) == sel.indices(start, 8)
    resumed.update([1, 2], [1.0, 0.0])
    sel.update([1, 2], [1.0, 0.0])
    np.testing.assert_allclose(resumed.alphas, sel.alphas)
    assert resumed.rho == sel.rho and resumed.cap_coef == sel.cap_coef
    with pytest.raises(ValueError, match="holds 40 rows but the taskset has 39"):
        DifficultyBasedSelector(39, features={k: v[:39] for k, v in features.items()}).load_state_dict(state)


# -- arguments -------------------------------------------------------------------------------------


def test_arguments_are_checked(caplog):
    features = pass_rates(4)
    with pytest.raises(ValueError, match="exactly 2 feature_keys"):
        DifficultyBasedSelector(4, features={"small": features["small"]})
    for bad in ({"tau": -1}, {"lamb": 1.5}, {"rho": "high"}, {"m": 0}, {"target_reward": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DifficultyBasedSelector(4, features=features, **bad)
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.selector"):
        DifficultyBasedSelector(4, features=features, temperature=0.5)
    assert "ignores data_selector.kwargs temperature" in caplog.text


# -- from a config, as upstream's examples/bots/bots.yaml writes it ------------------------------------

BOTS_SELECTOR = """
data_selector:
  selector_type: difficulty_based
  feature_keys: [ "qwen2.5_7b_pass_rate", "qwen3_30b_pass_rate" ]
  kwargs:
    m: 16
    lamb: 0.1
    rho: 0.1
    target_reward: 0.5
    tau: 0
    do_sample: true
"""


def _taskset(tmp_path, selector_yaml: str, rows: int = 12) -> TasksetConfig:
    features = pass_rates(rows, seed=1)
    path = tmp_path / "math.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": f"q{i}",
                    "qwen2.5_7b_pass_rate": features["small"][i],
                    "qwen3_30b_pass_rate": features["large"][i],
                    "difficulty": features["large"][i],
                }
            )
            + "\n"
            for i in range(rows)
        )
    )
    return TasksetConfig(
        name="math-train",
        path=str(path),
        default_workflow_type="echo",
        **yaml.safe_load(selector_yaml),
    )


def test_bots_config_reads_batches_learns_from_feedback_and_resumes(tmp_path, plugin):
    cfg = _taskset(tmp_path, BOTS_SELECTOR)
    sched = TasksetScheduler([cfg])
    selector = sched.readers[0].selector
    assert isinstance(selector, DifficultyBasedSelector)
    assert (selector.m, selector.lamb, selector.rho, selector.target_reward, selector.tau) == (
        16,
        0.1,
        0.1,
        0.5,
        0,
    )
    first = sched.read_batch(4)
    assert len({t.index for t in first}) == 4  # one request per step: no row twice
    sched.feedback({"math-train": {t.index: 1.0 for t in first}})  # all solved: they get easier
    means = selector.predicted_pass_rates()
    assert all(means[t.index] > 0.5 for t in first)
    state = json.loads(json.dumps(sched.state_dict()))
    upcoming = [t.index for t in sched.read_batch(4)]
    again = TasksetScheduler([cfg])
    again.load_state_dict(state)
    assert [t.index for t in again.read_batch(4)] == upcoming


def test_easy2hard_config_reads_the_curriculum(tmp_path, plugin):
    cfg = _taskset(tmp_path, "task_selector: {selector_type: offline_easy2hard, feature_keys: [difficulty]}")
    cfg.data_selector, cfg.task_selector = cfg.task_selector, None  # what resolve_config does
    sched = TasksetScheduler([cfg])
    read = [t.raw_task["difficulty"] for t in sched.read_batch(12)]
    assert read == sorted(read, reverse=True)


def test_missing_feature_column_names_the_taskset(tmp_path, plugin):
    cfg = _taskset(tmp_path, BOTS_SELECTOR.replace("qwen3_30b_pass_rate", "qwen3_pass_rate"))
    with pytest.raises(TasksetError) as info:
        TasksetScheduler([cfg])
    assert str(info.value).startswith(
        "taskset 'math-train': data_selector: selector 'difficulty_based': difficulty_based needs a "
        "finite number in feature 'qwen3_pass_rate' of every row; 12 of 12 rows have none"
    )
