"""End to end: `explore` and `train` modes in separate processes sharing an SQL buffer."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COMMON = """
project: e2e
checkpoint_root_dir: {root}/ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 4
  optimizer: {{lr: 1.0e-3}}
  entropy_loss_fn_args: {{entropy_coef: 0.01}}
model:
  model_path: {root}/model
  max_prompt_tokens: 256
  max_response_tokens: 16
buffer:
  batch_size: 4
  total_epochs: 1
  explorer_input:
    taskset:
      name: arith
      storage_type: file
      path: {root}/data
      split: train
      format: {{prompt_key: question, response_key: answer, system_prompt: ""}}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: sql
      path: sqlite:///{root}/buffer.db
explorer:
  runner_per_model: 2
  rollout_model: {{engine_type: transformers, engine_num: 1, dtype: float32, seed: 1}}
trainer: {{trainer_type: native, save_interval: 0, dtype: float32}}
monitor: {{monitor_type: tensorboard}}
"""


def _run(root: Path, name: str, extra: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    config = root / f"{name}.yaml"
    config.write_text(textwrap.dedent(COMMON.format(root=root)) + f"name: {name}\n" + textwrap.dedent(extra))
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_explore_then_train(tmp_path, math_job, job_env):
    math_job(tmp_path, train=12, test=4)

    # 12 tasks in batches of 4: the explorer stops when the taskset ends (one epoch).
    explore = _run(tmp_path, "explore", "mode: explore\n", job_env)
    assert explore.returncode == 0, explore.stderr[-3000:]
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        assert db.execute("select count(*), sum(consumed) from exp").fetchone() == (48, 0)

    # The trainer, in another process, trains until the buffer is exhausted: 48 / 16 = 3 steps.
    train = _run(tmp_path, "train", "mode: train\n", job_env)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "done: 3 train steps" in train.stdout
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        assert db.execute("select count(*), sum(consumed) from exp").fetchone() == (48, 48)
    assert (tmp_path / "ckpt" / "e2e" / "train" / "global_step_3" / "config.json").is_file()
