"""The statistics and the background load that benchmarks/vs_trl.py reports with."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _stats
import vs_trl


def test_interval_covers_the_mean_of_a_known_distribution():
    rng = random.Random(3)
    samples = [rng.gauss(10.0, 2.0) for _ in range(400)]
    low, high = _stats.interval(_stats.bootstrap(samples, statistics.mean, resamples=1000))
    # The standard error is 2 / sqrt(400) = 0.1: a 95% interval is about +-0.2 around the sample mean.
    assert low < statistics.mean(samples) < high
    assert 0.3 < high - low < 0.5


def test_interval_ignores_resamples_without_a_value():
    # The 2.5th and 97.5th percentiles of 1, 2, 3 (linear between the sorted values).
    assert _stats.interval([None, 1.0, None, 3.0, 2.0]) == pytest.approx((1.05, 2.95))
    assert _stats.interval([None, 1.0]) is None


def test_reach_interpolates_between_evaluated_steps():
    curve = {0: 0.2, 10: 0.4, 20: 0.6}
    times = {0: 0.0, 10: 5.0, 20: 10.0}
    step, seconds = vs_trl.reach([curve], [times], 0.5)
    assert (step, seconds) == pytest.approx((15.0, 7.5))
    assert vs_trl.reach([curve], [times], 0.7) is None


def test_time_to_accuracy_is_the_time_ratio_when_the_curves_are_the_same():
    rng = random.Random(0)
    curves, times = {"trinity": [], "trl": []}, {"trinity": [], "trl": []}
    for _ in range(5):
        curve = {0: 0.3, 10: 0.3 + rng.uniform(0.1, 0.2), 20: 0.3 + rng.uniform(0.2, 0.4)}
        per_step = rng.uniform(0.2, 0.4)
        for name, scale in (("trinity", 1.0), ("trl", 2.0)):
            curves[name].append(dict(curve))
            times[name].append({s: scale * per_step * s for s in curve})
    found = vs_trl.time_to_accuracy(curves, times, resamples=200)
    assert found["ratio_trl_over_trinity"] == pytest.approx(2.0)
    assert found["interval"] == pytest.approx((2.0, 2.0))
    assert found["resamples_unreached"] == 0


def test_time_to_accuracy_says_when_a_side_never_improved():
    flat = [{0: 0.4, 10: 0.4}]
    found = vs_trl.time_to_accuracy(
        {"trinity": flat, "trl": flat}, {"trinity": [{0: 0, 10: 1}]} | {"trl": [{0: 0, 10: 1}]}
    )
    assert "never improved" in found["note"]


def test_step_ratio_of_uniformly_slower_steps():
    rng = random.Random(1)
    trinity = [[rng.uniform(0.2, 0.3) for _ in range(20)] for _ in range(3)]
    trl = [[2.5 * s for s in run] for run in trinity]
    found = vs_trl.step_ratio({"trinity": trinity, "trl": trl}, warmup=2, resamples=200)
    assert found["ratio"] == pytest.approx(2.5)
    low, high = found["interval"]
    assert low < 2.5 < high  # steps are drawn independently per side: the interval has width


def test_cpu_load_runs_one_busy_process_each_and_stops_them():
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    with _stats.cpu_load(2) as count:
        burners = [p for p in me.children() if p.pid not in before]
        assert count == 2 and len(burners) == 2
        assert all(p.is_running() for p in burners)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in burners)
