"""The explore job of a decoupled pair (trinity.sync.explore_job): across its polls, when it
waits for its train job's weights, for how long, and what of it is news for the console."""

from __future__ import annotations

from trinity.sync import Synchronizer
from trinity.sync.explore_job import ExploreJobStep, ExploreJobSync
from trinity.sync.trainer_job import GONE_GRACE_S, TrainerJob

RUNS = TrainerJob("running", "pid 7 on h")
GONE = TrainerJob("gone", "pid 7 on h", 0.0)
NONE = TrainerJob("none")


def _job(timeout=60.0, interval=2, style="fixed"):
    return ExploreJobSync(Synchronizer(interval, 0, style), timeout)


def _step(job, explorer_step=2, latest=0, version=0, trainer=RUNS, now=0.0, resumed=False):
    reads = []

    def trainer_job():
        reads.append(now)
        return trainer

    answer = job.checkpoint_step(
        explorer_step, latest, version, resumed=resumed, trainer_job=trainer_job, now=now
    )
    return answer, len(reads)


def test_a_sync_step_waits_for_a_running_train_job_then_loads_its_checkpoint():
    job = _job()
    first, reads = _step(job, now=0.0)
    assert (first.action, first.version, first.note) == ("wait", 2, "wait_starts") and reads == 1
    assert "the train job runs (pid 7 on h)" in first.reason
    again, _ = _step(job, now=5.0)
    assert (again.action, again.note) == ("wait", "")  # nothing new to say
    loaded, reads = _step(job, latest=2, now=6.0)
    assert loaded == ExploreJobStep("sync", 2, "load checkpoint of step 2") and reads == 0


def test_what_a_wait_waits_on_is_news_when_it_changes():
    job = _job(timeout=3600)
    assert _step(job, trainer=GONE, now=0.0)[0].note == "wait_starts"
    changed, _ = _step(job, trainer=RUNS, now=1.0)  # a restarted train job
    assert (changed.action, changed.note) == ("wait", "wait_changes")
    assert _step(job, trainer=RUNS, now=2.0)[0].note == ""


def test_a_wait_ends_after_sync_timeout_and_that_version_is_never_waited_for_again():
    job = _job(timeout=10)
    _step(job, now=0.0)
    gave_up, _ = _step(job, now=10.0)
    assert (gave_up.action, gave_up.version, gave_up.note) == ("run", 2, "gives_up")
    assert "synchronizer.sync_timeout" in gave_up.reason
    later, reads = _step(job, now=20.0)  # the same sync step asked again: no second wait
    assert later == ExploreJobStep("run", 0, "gave up waiting for version 2") and reads == 0
    next_sync, _ = _step(job, explorer_step=4, now=30.0)  # the next sync step waits anew
    assert (next_sync.action, next_sync.version, next_sync.note) == ("wait", 4, "wait_starts")


def test_a_gone_train_job_gets_its_grace_then_the_explorer_goes_on():
    job = _job(timeout=3600)
    assert _step(job, trainer=GONE, now=0.0)[0].action == "wait"
    gone_long = TrainerJob("gone", "pid 7 on h", GONE_GRACE_S)
    answer, _ = _step(job, trainer=gone_long, now=GONE_GRACE_S)
    assert (answer.action, answer.note) == ("run", "gives_up") and "none took over" in answer.reason


def test_without_a_train_job_it_never_waits_and_says_so_once_per_reason():
    job = _job()
    notes = [_step(job, explorer_step=e, trainer=NONE, now=float(e))[0] for e in (2, 4, 6)]
    assert [a.action for a in notes] == ["run"] * 3
    assert [a.note for a in notes] == ["goes_on", "", ""]
    assert "no train job runs" in notes[0].reason


def test_no_wait_outside_sync_steps_nor_in_styles_that_never_wait():
    assert _step(_job(), explorer_step=1) == (ExploreJobStep("run", 0, "not a sync step"), 0)
    for style in ("explorer_driven", "trainer_driven", "fully_async"):
        answer, reads = _step(_job(style=style), explorer_step=2)
        assert answer.action == "run" and reads == 0


def test_a_broadcast_wait_is_bounded_by_sync_timeout():
    job = _job(timeout=10)
    assert job.broadcast_step(1, 0, now=0.0).action == "run"  # not a sync step
    first = job.broadcast_step(2, 0, now=0.0)
    assert (first.action, first.version) == ("wait", 2)
    assert job.broadcast_step(2, 0, now=9.0).action == "wait"
    gave_up = job.broadcast_step(2, 0, now=10.0)
    assert (gave_up.action, gave_up.version, gave_up.note) == ("run", 2, "gives_up")
    assert job.broadcast_step(2, 0, now=11.0) == ExploreJobStep("run", 0, "gave up waiting for version 2")
    assert job.broadcast_step(4, 4, now=12.0).action == "run"  # the train job's version arrived
