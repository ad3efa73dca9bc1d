"""``trinity log``: actor logs merged by time, --actor, --follow, a missing folder."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from trinity.cli import cli
from trinity.logs import show_logs

EXPLORER = """\
2026-01-02 03:04:05,100 INFO trinity.explorer: explore step 1
2026-01-02 03:04:05,300 ERROR trinity.explorer: workflow failed
Traceback (most recent call last):
  File "workflow.py", line 3, in run
ValueError: bad task
2026-01-02 03:04:06,000 INFO trinity.explorer: explore step 2
"""
TRAINER = """\
2026-01-02 03:04:05,200 INFO trinity.trainer: train step 1
2026-01-02 03:04:05,900 INFO trinity.trainer: train step 2
"""


@pytest.fixture
def job_dir(tmp_path) -> Path:
    log = tmp_path / "job" / "log"
    log.mkdir(parents=True)
    (log / "explorer.log").write_text(EXPLORER)
    (log / "trainer.log").write_text(TRAINER)
    return tmp_path / "job"


def _log(*args: str):
    return CliRunner().invoke(cli, ["log", *args])


def test_lines_are_merged_by_time_with_continuation_lines_attached(job_dir):
    result = _log("--job-dir", str(job_dir))

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "explorer | 2026-01-02 03:04:05,100 INFO trinity.explorer: explore step 1",
        "trainer  | 2026-01-02 03:04:05,200 INFO trinity.trainer: train step 1",
        "explorer | 2026-01-02 03:04:05,300 ERROR trinity.explorer: workflow failed",
        "explorer | Traceback (most recent call last):",
        'explorer |   File "workflow.py", line 3, in run',
        "explorer | ValueError: bad task",
        "trainer  | 2026-01-02 03:04:05,900 INFO trinity.trainer: train step 2",
        "explorer | 2026-01-02 03:04:06,000 INFO trinity.explorer: explore step 2",
    ]


def test_actor_filter(job_dir):
    (job_dir / "log" / "rollout.log").write_text("2026-01-02 03:04:05,150 INFO trinity.rollout: up\n")

    result = _log("--job-dir", str(job_dir), "--actor", "trainer", "--actor", "rollout")

    assert result.exit_code == 0, result.output
    assert [line.split(" | ")[0].strip() for line in result.stdout.splitlines()] == [
        "rollout",
        "trainer",
        "trainer",
    ]


def test_unknown_actor_names_the_ones_found(job_dir):
    result = _log("--job-dir", str(job_dir), "--actor", "critic")
    assert result.exit_code == 1
    assert (
        result.stderr == f"Error: no log for actor critic in {job_dir / 'log'} (found: explorer, trainer)\n"
    )


def test_logs_grouped_by_node(tmp_path):
    node = tmp_path / "job" / "log" / "10.0.0.7"
    node.mkdir(parents=True)
    (node / "trainer.log").write_text(TRAINER)
    result = _log("--job-dir", str(tmp_path / "job"), "--actor", "trainer")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("10.0.0.7/trainer | 2026-01-02 03:04:05,200")


def test_missing_log_folder_is_one_line_and_exit_1(tmp_path):
    result = _log("--job-dir", str(tmp_path / "job"))
    assert result.exit_code == 1
    assert result.stderr == f"Error: no log folder at {tmp_path / 'job' / 'log'} (has the job started?)\n"


def test_needs_exactly_one_of_config_and_job_dir(job_dir):
    assert _log().exit_code == 2
    assert _log("--job-dir", str(job_dir), "-c", "x.yaml").exit_code == 2


def test_config_points_at_its_job_dir(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(
        f"project: proj\nname: exp\ncheckpoint_root_dir: {tmp_path / 'ckpt'}\nmodel:\n  model_path: /nowhere\n"
    )
    log = tmp_path / "ckpt" / "proj" / "exp" / "log"
    log.mkdir(parents=True)
    (log / "trainer.log").write_text(TRAINER)

    result = _log("-c", str(config))

    assert result.exit_code == 0, result.output
    assert (
        result.stdout.splitlines()[1]
        == "trainer | 2026-01-02 03:04:05,900 INFO trinity.trainer: train step 2"
    )


def test_follow_in_process_prints_appended_lines(job_dir, capsys):
    # max_polls bounds the loop; the appends happen before the first poll.
    def append_soon():
        time.sleep(0.2)
        with open(job_dir / "log" / "trainer.log", "a") as f:
            f.write("2026-01-02 03:04:07,000 INFO trinity.trainer: train step 3\n")

    thread = threading.Thread(target=append_soon)
    thread.start()
    assert show_logs(job_dir / "log", follow=True, poll_interval=0.5, max_polls=2) == 0
    thread.join()
    assert capsys.readouterr().out.splitlines()[-1].endswith("train step 3")


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


def _wait_for(lines: queue.Queue, text: str, seen: list[str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in seen):
        try:
            seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"{text!r} not printed within {timeout}s; got {seen}") from None


def test_follow_picks_up_appended_lines_and_new_files_until_ctrl_c(job_dir):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "log", "--follow", "--job-dir", str(job_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        _wait_for(lines, "explore step 2", seen)
        with open(job_dir / "log" / "explorer.log", "a") as f:
            f.write("2026-01-02 03:04:08,000 INFO trinity.explorer: explore step 3\n")
            f.write("2026-01-02 03:04:08,500 ERROR trinity.explorer: failed again\n")
            f.flush()
            _wait_for(lines, "explore step 3", seen)
            f.write("  continuation written ")  # half a line: held back until its newline
            f.flush()
            time.sleep(0.7)
            f.write("later\n")
        (job_dir / "log" / "rollout.log").write_text(
            "2026-01-02 03:04:09,000 INFO trinity.rollout: new actor\n"
        )
        _wait_for(lines, "new actor", seen)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "explorer | 2026-01-02 03:04:08,500 ERROR trinity.explorer: failed again" in seen
    assert "explorer |   continuation written later" in seen
    assert seen[-1] == "rollout  | 2026-01-02 03:04:09,000 INFO trinity.rollout: new actor"
