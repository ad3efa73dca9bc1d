"""End to end: `explore` and `train` modes in separate processes sharing an SQL buffer."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _run(root: Path, name: str, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    config = tiny_job(
        root,
        name=name,
        mode=mode,
        algorithm={
            "repeat_times": 4,
            "optimizer": {"lr": 1.0e-3},
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
        },
        model={"max_prompt_tokens": 256, "max_response_tokens": 16},
        buffer={"batch_size": 4, "total_epochs": 1},
        explorer={"eval_on_startup": None},
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trinity.cli",
            "run",
            "--config",
            str(write_job(root / f"{name}.yaml", config)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_explore_then_train(tmp_path, math_job, job_env):
    math_job(tmp_path, train=12, test=4)

    # 12 tasks in batches of 4: the explorer stops when the taskset ends (one epoch).
    explore = _run(tmp_path, "explore", "explore", job_env)
    assert explore.returncode == 0, explore.stderr[-3000:]
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        assert db.execute("select count(*), sum(consumed) from exp").fetchone() == (48, 0)

    # The trainer, in another process, trains until the buffer is exhausted: 48 / 16 = 3 steps.
    train = _run(tmp_path, "train", "train", job_env)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "done: 3 train steps" in train.stdout
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        assert db.execute("select count(*), sum(consumed) from exp").fetchone() == (48, 48)
    assert (tmp_path / "ckpt" / "e2e" / "train" / "global_step_3" / "config.json").is_file()
