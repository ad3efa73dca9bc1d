"""End to end: a decoupled pair, as upstream's ``async_gsm8k`` runs it: an ``explore`` job and a
``train`` job (two ``trinity run`` processes, each with a Ray of its own) share a ``queue``
buffer through its SQL path and the weights through checkpoints. The explorer is SIGKILLed
mid-run and restarted, then the trainer; nothing is lost or trained twice. Then a killed explorer that nobody
restarts: the trainer stops waiting with a line that says why."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOTAL, BATCH = 6, 16  # steps; experiences per step (4 tasks x 4 rollouts)

COMMON = f"""
project: e2e
name: pair
checkpoint_root_dir: {{root}}/ckpt
continue_from_checkpoint: true
algorithm:
  algorithm_type: grpo
  repeat_times: 4
  optimizer: {{{{lr: 1.0e-3}}}}
model: {{{{model_path: {{root}}/model, max_prompt_tokens: 128, max_response_tokens: 12}}}}
buffer:
  total_steps: {TOTAL}
  batch_size: 4
  explorer_input:
    taskset:
      name: arith
      storage_type: file
      path: {{root}}/data
      format: {{{{prompt_key: question, response_key: answer, system_prompt: ""}}}}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer:
      name: pair_buffer
      storage_type: queue
      path: sqlite:///buffer.db
      max_read_timeout: {{timeout}}
explorer:
  runner_per_model: 2
  rollout_model: {{{{engine_type: transformers, dtype: float32, seed: 1}}}}
synchronizer: {{{{sync_method: checkpoint, sync_interval: 2}}}}
trainer: {{{{trainer_type: native, save_interval: 2, dtype: float32}}}}
monitor: {{{{monitor_type: tensorboard}}}}
"""


def _write(root: Path, mode: str, timeout: int = 300) -> Path:
    path = root / f"{mode}.yaml"
    path.write_text(textwrap.dedent(COMMON.format(root=root, timeout=timeout)) + f"mode: {mode}\n")
    return path


def _start(root: Path, mode: str, env: dict[str, str]) -> subprocess.Popen:
    # Both jobs start in `root`: the queue's relative sqlite path must name one file for both.
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(root / f"{mode}.yaml")],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # a SIGKILL hits the driver only, as a crash would
    )


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(3)  # let Ray's reaper take down the orphaned local cluster (and its explorer)


def _read_until(proc: subprocess.Popen, marker: str) -> str:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return "".join(seen)
    pytest.fail(f"ended before {marker!r}: " + "".join(seen)[-3000:])


def test_explore_and_train_jobs_survive_a_killed_explorer(tmp_path, math_job, job_env):
    math_job(tmp_path, train=200, test=4, difficulty=3)
    _write(tmp_path, "explore")
    _write(tmp_path, "train")
    trainer = _start(tmp_path, "train", job_env)
    explorer = _start(tmp_path, "explore", job_env)
    try:
        _read_until(explorer, f"[explorer] step 2/{TOTAL}")
        _kill(explorer)
        explorer = _start(tmp_path, "explore", job_env)
        # Then the trainer dies after step 3 (checkpoint 2 saved, step 3's weights not).
        _read_until(trainer, f"[trainer] step 3/{TOTAL}")
        _kill(trainer)
        trainer = _start(tmp_path, "train", job_env)
        explore_out, _ = explorer.communicate(timeout=600)
        train_out, _ = trainer.communicate(timeout=600)
    finally:
        for proc in (explorer, trainer):
            if proc.poll() is None:
                proc.kill()
    assert explorer.returncode == 0, explore_out[-3000:]
    assert trainer.returncode == 0, train_out[-3000:]
    assert f"done: {TOTAL} train steps" in train_out, train_out[-3000:]
    logs = tmp_path / "ckpt" / "e2e" / "pair" / "log"
    assert "resumed explorer" in (logs / "explorer.log").read_text()
    assert "resumed trainer at step" in (logs / "trainer.log").read_text()
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        per_step = dict(
            db.execute("select consumed_step, count(*) from pair_buffer where consumed = 1 group by 1")
        )
        unread = db.execute("select count(*) from pair_buffer where consumed = 0").fetchone()[0]
        uids = db.execute("select count(*), count(distinct uid) from pair_buffer").fetchone()
        steps = dict(db.execute("select explorer_step, count(*) from pair_buffer group by 1"))
    # The redone explorer step wrote nothing twice; the rows the killed trainer read after its
    # checkpoint were given back and trained by the resumed trainer's steps; each training step
    # trained on exactly one explorer step's batch, and nothing is left over.
    assert uids[0] == uids[1] == TOTAL * BATCH and unread == 0
    assert steps == {step: BATCH for step in range(1, TOTAL + 1)}
    assert per_step == {step: BATCH for step in range(1, TOTAL + 1)}


def test_a_trainer_whose_explorer_was_killed_stops_waiting_and_says_why(tmp_path, math_job, job_env):
    math_job(tmp_path, train=200, test=4, difficulty=3)
    _write(tmp_path, "explore")
    _write(tmp_path, "train", timeout=20)
    explorer = _start(tmp_path, "explore", job_env)
    trainer = None
    try:
        _read_until(explorer, f"[explorer] step 1/{TOTAL}")
        _kill(explorer)
        trainer = _start(tmp_path, "train", job_env)
        out, _ = trainer.communicate(timeout=300)
    finally:
        for proc in (explorer, trainer):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert trainer.returncode == 1, out[-3000:]
    assert "every writer of SQL buffer 'pair_buffer' is gone without finishing" in out, out[-3000:]
