"""The train job's heartbeat (trinity.sync.trainer_job): what an explore job reads from it and
whether it waits for a checkpoint because of it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from trinity.sync.trainer_job import (
    FILE,
    GONE_GRACE_S,
    STALE_S,
    TrainerHeartbeat,
    TrainerJob,
    checkpoint_wait,
    read_trainer_job,
)


def _heartbeat(job_dir, *, pid=None, host=None, age=0.0):
    updated = time.time() - age
    record = {
        "pid": pid or os.getpid(),
        "host": host or socket.gethostname(),
        "started": updated,
        "updated": updated,
    }
    (job_dir / FILE).write_text(json.dumps(record))


def _ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- what the file shows ---------------------------------------------------------------------------


def test_no_heartbeat_is_no_train_job(tmp_path):
    assert read_trainer_job(tmp_path) == TrainerJob("none")
    (tmp_path / FILE).write_text("{half a rec")  # unreadable: as if absent
    assert read_trainer_job(tmp_path).state == "none"


def test_a_fresh_heartbeat_of_a_live_process_is_a_running_train_job(tmp_path):
    _heartbeat(tmp_path)
    job = read_trainer_job(tmp_path)
    assert job.state == "running" and job.who == f"pid {os.getpid()} on {socket.gethostname()}"


def test_a_heartbeat_whose_process_is_gone_on_this_host_is_a_gone_train_job(tmp_path):
    _heartbeat(tmp_path, pid=_ended_pid(), age=4.0)
    job = read_trainer_job(tmp_path)
    assert job.state == "gone" and 4.0 <= job.gone_for < 10.0


def test_on_another_host_only_the_heartbeats_age_tells(tmp_path):
    # Its pid cannot be checked from here: a pid that means nothing on this host is no sign.
    _heartbeat(tmp_path, pid=_ended_pid(), host="another-host")
    assert read_trainer_job(tmp_path).state == "running"
    _heartbeat(tmp_path, pid=_ended_pid(), host="another-host", age=STALE_S + 1)
    job = read_trainer_job(tmp_path)
    assert job.state == "gone" and job.gone_for > STALE_S


# -- whether the explorer waits --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trainer", "waited", "timeout", "action", "says"),
    [
        (TrainerJob("none"), 0, 3600, "go_on", "no train job runs"),
        (TrainerJob("running", "pid 1 on h"), 0, 3600, "wait", "the train job runs (pid 1 on h)"),
        (TrainerJob("running", "pid 1 on h"), 3599, 3600, "wait", "runs"),
        (
            TrainerJob("running", "pid 1 on h"),
            3600,
            3600,
            "go_on",
            "waited 3600s (synchronizer.sync_timeout)",
        ),
        (
            TrainerJob("gone", "pid 1 on h", 10),
            0,
            3600,
            "wait",
            f"waiting up to {GONE_GRACE_S:g}s for a restarted",
        ),
        (TrainerJob("gone", "pid 1 on h", 10), 0, 60, "wait", "waiting up to 60s for a restarted"),
        (TrainerJob("gone", "pid 1 on h", GONE_GRACE_S), 0, 3600, "go_on", "none took over"),
        (TrainerJob("gone", "pid 1 on h", 10), 60, 60, "go_on", "synchronizer.sync_timeout"),
    ],
)
def test_the_explorer_waits_while_a_train_job_runs_or_may_be_restarted(
    trainer, waited, timeout, action, says
):
    verdict = checkpoint_wait(trainer, waited, timeout)
    assert verdict.action == action and says in verdict.why


def test_the_reason_of_a_wait_stays_the_same_while_nothing_changes():
    """The launcher prints a line when the reason changes: it must not change with time alone."""
    first = checkpoint_wait(TrainerJob("gone", "pid 1 on h", 5), 1, 3600)
    later = checkpoint_wait(TrainerJob("gone", "pid 1 on h", 50), 40, 3600)
    assert first == later


# -- the train job's side --------------------------------------------------------------------------


def test_the_heartbeat_is_kept_fresh_while_the_train_job_runs_and_removed_at_its_end(tmp_path):
    with TrainerHeartbeat(tmp_path, refresh_s=0.05):
        first = json.loads((tmp_path / FILE).read_text())
        assert read_trainer_job(tmp_path).state == "running"
        deadline = time.time() + 10
        while json.loads((tmp_path / FILE).read_text())["updated"] == first["updated"]:
            assert time.time() < deadline, "the heartbeat was never refreshed"
            time.sleep(0.02)
        assert json.loads((tmp_path / FILE).read_text())["started"] == first["started"]
    assert not (tmp_path / FILE).exists()
    assert read_trainer_job(tmp_path).state == "none"


def test_the_heartbeat_is_removed_when_the_train_job_fails(tmp_path):
    with pytest.raises(RuntimeError), TrainerHeartbeat(tmp_path, refresh_s=10):
        raise RuntimeError("the trainer failed")
    assert not (tmp_path / FILE).exists()


def test_a_heartbeat_another_train_job_took_over_is_left_alone(tmp_path):
    with TrainerHeartbeat(tmp_path, refresh_s=10):
        _heartbeat(tmp_path, pid=os.getpid() + 1, host="another-host")  # a restarted train job
    assert json.loads((tmp_path / FILE).read_text())["host"] == "another-host"


@pytest.mark.parametrize(("mode", "writes"), [("train", True), ("explore", False), ("both", False)])
def test_only_a_train_only_stage_keeps_a_heartbeat(tmp_path, mode, writes):
    from trinity.config import Config
    from trinity.launcher import _trainer_job_heartbeat

    config = Config.model_validate({"mode": mode, "checkpoint_root_dir": str(tmp_path)})
    with _trainer_job_heartbeat(config):
        assert (os.path.isfile(os.path.join(config.checkpoint_job_dir, FILE))) == writes
