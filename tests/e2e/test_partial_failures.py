"""End to end: partial failure never stalls a job or fakes success; bad data never kills one.

A ``chaos_workflow`` (``--plugin-dir``) fails in a different way on each task of a step: it
raises, hangs past ``max_timeout``, returns nothing, returns NaN rewards, returns one infinite
reward, or works. The taskset also holds hostile rows (200k-deep nesting, a 5000-digit integer,
invalid UTF-8). The job must train on what arrived — never wait for experiences that will not
come — report the failures on the console, and say ``done`` only when it trained every step.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLUGIN = """
import time
from trinity import hookimpl
from trinity_math.workflows import MathWorkflow

class Chaos(MathWorkflow):
    # By task: 0 raises, 1 hangs, 2 returns nothing, 3 NaN rewards, 4 one inf reward, 5 works.
    def run(self):
        kind = self.task.index % 6
        if kind == 0:
            raise RuntimeError(f"chaos on task {self.task.index}")
        if kind == 1:
            time.sleep(60)
        if kind == 2:
            return []
        experiences = super().run()
        if kind == 3:
            for e in experiences:
                e.reward = float("nan")
        if kind == 4:
            experiences[0].reward = float("inf")
        return experiences

class AlwaysFails(MathWorkflow):
    def run(self):
        raise ValueError("the environment is down")

@hookimpl
def register_workflows(register):
    register("chaos_workflow", Chaos)
    register("always_fails", AlwaysFails)
"""

# Appended to the train file (rows 31-33): each once killed the job.
HOSTILE_ROWS = [
    b"[" * 200_000 + b"]" * 200_000,
    b'{"question": "1+1", "answer": ' + b"7" * 5000 + b"}",
    b'{"question": "1+\xff\xfe", "answer": "2"}',
]


@pytest.fixture(scope="module")
def root(tmp_path_factory, math_job) -> Path:
    root = math_job(tmp_path_factory.mktemp("partial"), train=30, test=2)
    with open(root / "data" / "train.jsonl", "ab") as fh:
        fh.write(b"".join(row + b"\n" for row in HOSTILE_ROWS))
    (root / "plugins").mkdir()
    (root / "plugins" / "chaos.py").write_text(PLUGIN)
    return root


def _run(
    root: Path, job_env, *, name: str, workflow: str, steps: int, db: str = "buffer", timeout: float = 600
):
    config = tiny_job(
        root,
        name=name,
        continue_from_checkpoint=False,
        buffer={
            "total_steps": steps,
            "batch_size": 6,
            "explorer_input": {
                # The train file itself: HOSTILE_ROWS are appended to it.
                "taskset": {"path": f"{root}/data/train.jsonl"},
                "default_workflow_type": workflow,
            },
            "trainer_input": {
                "experience_buffer": {"path": f"sqlite:///{root}/{db}.db", "max_read_timeout": 1000}
            },
        },
        explorer={
            "max_timeout": 3,
            "max_retry_times": 0,
            "runner_per_model": 6,
            "max_consecutive_failed_steps": 2,
            "eval_on_startup": None,
            "rollout_model": {"seed": None},
        },
    )
    command = [
        sys.executable,
        "-m",
        "trinity.cli",
        "run",
        "--config",
        str(write_job(root / f"{name}.yaml", config)),
    ]
    command += ["--plugin-dir", str(root / "plugins")]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=job_env)


def _scalars(job_dir: Path, role: str) -> dict[str, list[tuple[int, float]]]:
    from trinity.monitor.tensorboard import read_scalars

    return read_scalars(job_dir / "monitor" / "tensorboard" / role)


def _uids(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT uid FROM exp ORDER BY id")]


@pytest.fixture(scope="module")
def chaos_run(root, job_env) -> subprocess.CompletedProcess:
    return _run(root, job_env, name="chaos", workflow="chaos_workflow", steps=2)


def test_failing_tasks_are_reported_and_the_step_trains_on_what_arrived(root, chaos_run):
    out = chaos_run.stdout + chaos_run.stderr
    assert chaos_run.returncode == 0, out[-4000:]
    # Per step, one console line: counts and the first error with its task id.
    for step, first in ((1, 0), (2, 6)):
        lines = [x for x in out.splitlines() if x.startswith(f"[trinity] explorer step {step}: ")]
        assert len(lines) == 1, out[-4000:]
        line = lines[0]
        # raised, hung, returned nothing, all NaN: each counted once, adding up
        assert "4 of 6 tasks gave no experience (1 failed, 1 timed out, 2 empty)" in line, line
        assert ", 3 results dropped (3 non-finite reward)" in line, line
        assert f"first: arith#{first}: RuntimeError: chaos on task {first}" in line, line
        assert "log/explorer.log" in line
    assert "[trinity] done: 2 train steps, 2 explore steps" in out
    assert "Traceback" not in out
    job_dir = root / "ckpt" / "e2e" / "chaos"
    explorer, trainer = _scalars(job_dir, "explorer"), _scalars(job_dir, "trainer")
    # 3 of 12 experiences per step: the inf task's finite one and the working task's two.
    assert [v for _, v in explorer["rollout/num_experiences"]] == [3.0, 3.0]
    assert [v for _, v in trainer["trainer/num_experiences"]] == [3.0, 3.0]
    assert [v for _, v in explorer["rollout/failed_tasks"]] == [1.0, 1.0]  # timeouts apart
    assert [v for _, v in explorer["rollout/timeout_tasks"]] == [1.0, 1.0]
    assert [v for _, v in explorer["rollout/empty_tasks"]] == [2.0, 2.0]
    assert [v for _, v in explorer["rollout/dropped_experiences"]] == [3.0, 3.0]
    # The trainer did not wait for the 9 that never came (max_read_timeout is 1000 s).
    trainer_log = (job_dir / "log" / "trainer.log").read_text()
    assert "training on 3 of 12 experiences (step ended" in trainer_log
    # The full tracebacks are in the explorer's log.
    explorer_log = (job_dir / "log" / "explorer.log").read_text()
    assert "Traceback" in explorer_log and "RuntimeError: chaos on task 0" in explorer_log


def test_hostile_taskset_rows_are_skipped_counted_and_logged(root, chaos_run):
    assert chaos_run.returncode == 0, (chaos_run.stdout + chaos_run.stderr)[-4000:]
    job_dir = root / "ckpt" / "e2e" / "chaos"
    explorer = _scalars(job_dir, "explorer")
    assert explorer["buffer/arith/skipped_rows"][-1][1] == 3.0
    assert explorer["buffer/arith/rows"][-1][1] == 30.0
    explorer_log = (job_dir / "log" / "explorer.log").read_text()
    for row in (31, 32, 33):
        assert f"train.jsonl:{row}" in explorer_log


def test_a_fresh_run_on_a_used_sql_buffer_writes_beside_the_old_rows(root, chaos_run, job_env):
    assert chaos_run.returncode == 0
    first = _uids(root / "buffer.db")
    assert first and all(uid.startswith("e2e/chaos:") for uid in first)
    # Same name, continue_from_checkpoint false: the run is renamed chaos_<timestamp>. One step
    # is enough: it explores the same first tasks the first run's step 1 did.
    again = _run(root, job_env, name="chaos", workflow="chaos_workflow", steps=1)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert "running as 'chaos_" in out
    assert "[trinity] done: 1 train steps" in out
    assert "already stored" not in out
    second = [uid for uid in _uids(root / "buffer.db") if uid not in first]
    assert len(first) == 6 and len(second) == 3  # its step's rows, beside both steps' of the first run
    assert all(uid.startswith("e2e/chaos_") for uid in second)


def test_a_buffer_a_killed_job_left_ends_a_step_without_experience_as_a_fresh_one(root, job_env):
    # A job stopped by Ctrl-C, a failure or SIGKILL never finishes its SQL writer (its explorer
    # actor is killed). A later run on that buffer whose step has no experience (every task
    # failed) waited for that writer's steps until max_read_timeout (1000 s here). On a fresh
    # buffer the same job ends in seconds: "finished short", exit 1.
    url = f"sqlite:///{root}/left_open.db"
    left_open = "from trinity.buffer.sql import SQLStorage, SQLWriter\n"
    left_open += f"SQLWriter(SQLStorage({url!r}, 'exp'), run='e2e/killed').end_step(0)\n"
    subprocess.run([sys.executable, "-c", left_open], check=True, timeout=120, env=job_env)
    proc = _run(
        root, job_env, name="after_killed", workflow="always_fails", steps=1, db="left_open", timeout=180
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "finished short: the trainer stopped after 0 of 1 steps (no more experiences)" in out, out[-4000:]
    assert "[trinity] waiting" not in out and "Traceback" not in out, out[-4000:]


def test_unread_rows_of_another_run_are_refused_at_start(root, job_env):
    import torch

    from trinity.buffer.sql import SQLStorage, SQLWriter
    from trinity.experience import Experience

    writer = SQLWriter(SQLStorage(f"sqlite:///{root}/leftover.db", "exp"), run="e2e/crashed")
    writer.write([Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=1.0)] * 2)
    proc = _run(root, job_env, name="leftover", workflow="chaos_workflow", steps=1, db="leftover")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    error = [line for line in proc.stderr.splitlines() if "job failed" in line]
    assert len(error) == 1, proc.stderr
    assert "holds 2 unread experiences of another run (e2e/crashed)" in error[0]
    assert "Traceback" not in proc.stderr


def test_a_job_whose_every_task_fails_stops_with_one_line_and_exit_1(root, job_env):
    proc = _run(root, job_env, name="down", workflow="always_fails", steps=20, db="down")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "done" not in out
    failed = [line for line in out.splitlines() if line.startswith("[trinity] job failed")]
    assert failed == [
        "[trinity] job failed: explore steps 1-2 gave no experience (2 in a row, "
        "explorer.max_consecutive_failed_steps): 6 of 6 tasks gave no experience (6 failed); first: arith#6: "
        "ValueError: the environment is down"
    ]
