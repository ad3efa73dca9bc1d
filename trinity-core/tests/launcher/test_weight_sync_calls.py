"""The launcher's side of ``sync_method: nccl``: calls that must run together (the trainer's
broadcast and the explorer's receive) end in a clear :class:`JobFailed` — naming every side's
error — when one side fails, and when a side hangs past the sync timeout, instead of waiting."""

from __future__ import annotations

import time

import pytest

from trinity.launcher import JobFailed, _get_together

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@ray.remote
def _answer(value, delay=0.0):
    time.sleep(delay)
    return value


@ray.remote
def _fail(message, delay=0.0):
    from trinity.sync.nccl import WeightSyncError

    time.sleep(delay)
    raise WeightSyncError(message)


def test_results_in_submission_order(local_ray):
    refs = [_answer.remote("sent", 0.2), _answer.remote("received")]
    assert _get_together(local_ray, refs, "weight sync", timeout=30) == ["sent", "received"]


def test_one_side_failing_fails_the_job_with_every_sides_reason(local_ray, monkeypatch):
    monkeypatch.setattr("trinity.launcher._COLLECT_ERRORS_S", 2.0)
    refs = [
        _fail.remote("rank 1 refused the weights", 0.3),  # the trainer learns it in the handshake
        _fail.remote("refused the weights: x.weight is not in the model"),
    ]
    with pytest.raises(JobFailed) as failed:
        _get_together(local_ray, refs, "weight sync (broadcast of version 3)", timeout=60)
    message = str(failed.value)
    assert message.startswith("weight sync (broadcast of version 3): WeightSyncError(")
    assert "x.weight is not in the model" in message and "rank 1 refused the weights" in message


def test_a_failure_does_not_wait_for_a_hanging_side(local_ray, monkeypatch):
    monkeypatch.setattr("trinity.launcher._COLLECT_ERRORS_S", 1.0)
    start = time.monotonic()
    with pytest.raises(JobFailed, match="could not join"):
        _get_together(
            local_ray,
            [_answer.remote("never", 60), _fail.remote("could not join")],
            "weight sync",
            timeout=60,
        )
    assert time.monotonic() - start < 15


def test_a_side_hanging_past_the_timeout_fails_the_job(local_ray):
    start = time.monotonic()
    with pytest.raises(JobFailed, match=r"no answer within synchronizer.sync_timeout \(1 s\)"):
        _get_together(
            local_ray, [_answer.remote("late", 60), _answer.remote("ok")], "weight sync", 1, grace=0.5
        )
    assert time.monotonic() - start < 10
