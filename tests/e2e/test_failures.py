"""End to end: a job stops cleanly — clear message, non-zero exit, no Ray processes left behind —
when an actor dies mid-run and when the user presses Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trinity.run_status import read_run_status
from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# A workflow that kills its whole process: the explorer actor dies, not just a task.
DYING_PLUGIN = """
import os
from trinity import hookimpl
from trinity.workflow import Workflow

class DyingWorkflow(Workflow):
    def run(self):
        os._exit(13)

@hookimpl
def register_workflows(register):
    register("dying_workflow", DyingWorkflow)
"""

# A sample strategy that, from step 2 on, holds the batch it read (and says so in a file):
# Ctrl-C then lands while the trainer has claimed rows it will never train on.
HOLDING_PLUGIN = """
import os, time
from pathlib import Path
from trinity import hookimpl
from trinity_algos.sample_strategy import DefaultSampleStrategy

class Holding(DefaultSampleStrategy):
    def sample(self, step):
        batch, metrics = super().sample(step)
        if step >= 2:
            Path(os.environ["TRINITY_TEST_HOLDING"]).write_text(str(len(batch)))
            time.sleep(600)
        return batch, metrics

@hookimpl
def register_sample_strategies(register):
    register("holding", Holding)
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory, math_job) -> Path:
    root = math_job(tmp_path_factory.mktemp("failures"), train=200, test=4, difficulty=3)
    (root / "plugins").mkdir()
    (root / "plugins" / "dying.py").write_text(DYING_PLUGIN)
    (root / "plugins" / "holding.py").write_text(HOLDING_PLUGIN)
    return root


def _ray_pids(driver_pid: int) -> set[int]:
    """The Ray server processes of the local cluster a driver started (its session dir, under
    /tmp/ray/session_<date>_<time>_<driver pid>, is on their command lines)."""
    out = subprocess.run(["pgrep", "-af", "raylet|gcs_server"], capture_output=True, text=True).stdout
    session = re.compile(rf"session_[0-9_-]+_{driver_pid}\b")
    return {int(line.split()[0]) for line in out.splitlines() if session.search(line)}


def _config(root: Path, name: str, workflow: str, steps: int, sample_strategy: str = "default") -> Path:
    config = tiny_job(
        root,
        name=name,
        algorithm={"sample_strategy": sample_strategy},
        buffer={
            "total_steps": steps,
            "explorer_input": {"default_workflow_type": workflow},
            "trainer_input": {"experience_buffer": {"path": f"sqlite:///{root}/{name}.db"}},
        },
        explorer={
            "max_retry_times": 0,
            "eval_on_startup": None,
            "runner_per_model": None,
            "rollout_model": {"seed": None},
        },
    )
    return write_job(root / f"{name}.yaml", config)


def _start(
    root: Path, name: str, workflow: str, steps: int, env: dict[str, str], sample_strategy: str = "default"
) -> subprocess.Popen:
    config = _config(root, name, workflow, steps, sample_strategy)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trinity.cli",
            "run",
            "--config",
            str(config),
            "--plugin-dir",
            str(root / "plugins"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait_gone(driver_pid: int, seconds: float = 20) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = _ray_pids(driver_pid)
        if not left:
            return left
        time.sleep(0.5)
    return _ray_pids(driver_pid)


def test_dead_actor_fails_the_job_cleanly(root, job_env):
    proc = _start(root, "dying", "dying_workflow", steps=3, env=job_env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-3000:]
    assert "job failed: explorer step: an actor died" in out
    assert "Traceback" not in out
    assert not _wait_gone(proc.pid), "Ray processes were left running"
    status = read_run_status(root / "ckpt" / "e2e" / "dying")  # what the studio's Runs page shows
    assert status["status"] == "failed" and "an actor died" in status["reason"]


def _read_until_first_step(proc: subprocess.Popen) -> list[str]:
    """The job's output lines up to its first training step (the job is then under way)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[trainer] step 1/" in line:
            return lines
    pytest.fail("the job ended before its first step: " + "".join(lines)[-3000:])


def test_sigterm_stops_the_job_cleanly(root, job_env):
    # Ctrl-C (SIGINT) in the same checks: test_ctrl_c_stops_the_job_cleanly_and_gives_back_...
    proc = _start(root, "terminated", "math_workflow", steps=1000, env=job_env)
    # Wait until training is under way, then stop it as a scheduler would.
    lines = _read_until_first_step(proc)
    # The job's own Ray servers are found while it runs (so the check below can fail).
    assert _ray_pids(proc.pid), "could not find the job's Ray processes"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, "".join(lines)[-2000:] + out[-2000:]
    assert "interrupted" in out
    assert not _wait_gone(proc.pid), "Ray processes were left running"
    status = read_run_status(root / "ckpt" / "e2e" / "terminated")
    assert status["status"] == "interrupted" and status["reason"] == "stopped by SIGTERM", status


# examples/quickstart/run.py's wrapper running this module's job (as run.py runs the quickstart).
WRAPPER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("quickstart_run", {run_py!r})
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
command = [sys.executable, "-m", "trinity.cli", "run", "--config", {config!r}]
sys.exit(run.run_to_the_end(command, dict(os.environ)))
"""


def _session_pids(sid: int) -> set[int]:
    """Every process of session ``sid`` (Ray's servers, agents and actor workers included)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True).stdout
    return {
        int(pid)
        for pid, s, stat in (line.split() for line in out.splitlines())
        if int(s) == sid and stat[0] != "Z"
    }


def test_ctrl_c_in_a_terminal_through_the_quickstart_wrapper_leaves_nothing_running(root, job_env):
    # A terminal's Ctrl-C reaches its whole foreground process group: the wrapper (which then
    # SIGKILLed trinity mid-shutdown in subprocess.call, leaving Ray's agents for ~1.5 min) and
    # trinity run. The wrapper runs in a session of its own here; os.killpg is the Ctrl-C.
    config = _config(root, "wrapped", "math_workflow", steps=1000)
    run_py = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run.py"
    script = WRAPPER.format(run_py=str(run_py), config=str(config))
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_env,
        start_new_session=True,
    )
    lines = _read_until_first_step(proc)
    assert len(_session_pids(proc.pid)) > 3, "could not find the job's processes"
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines)[-2000:] + out[-2000:]
    assert "[trinity] interrupted; actors stopped." in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    deadline = time.monotonic() + 20
    while _session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _session_pids(proc.pid)
    assert not left, subprocess.run(
        ["ps", "-o", "pid,args", "-p", ",".join(map(str, left))], capture_output=True, text=True
    ).stdout


def test_ctrl_c_stops_the_job_cleanly_and_gives_back_the_rows_of_the_unfinished_train_step(
    root, job_env, tmp_path
):
    # One job for both checks: Ctrl-C while training is under way stops it cleanly, and the
    # rows the trainer had claimed for its unfinished step are unread again.
    holding = tmp_path / "holding"
    env = {**job_env, "TRINITY_TEST_HOLDING": str(holding)}
    proc = _start(root, "held", "math_workflow", steps=1000, env=env, sample_strategy="holding")
    deadline = time.monotonic() + 240
    while not holding.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert holding.exists(), "the trainer never reached step 2"
    assert holding.read_text() == "4"  # it holds step 2's batch
    # The job's own Ray servers are found while it runs (so the check below can fail).
    assert _ray_pids(proc.pid), "could not find the job's Ray processes"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted" in out
    assert not _wait_gone(proc.pid), "Ray processes were left running"
    status = read_run_status(root / "ckpt" / "e2e" / "held")
    assert status["status"] == "interrupted" and status["reason"] == "stopped by SIGINT", status
    assert "4 experiences read for the unfinished train step are unread again" in out
    with sqlite3.connect(root / "held.db") as conn:
        rows = dict(conn.execute("SELECT consumed, COUNT(*) FROM exp GROUP BY consumed").fetchall())
    # Step 1's 4 rows were trained on; step 2's are unread again, as if never claimed.
    assert rows == {0: 4, 1: 4}
