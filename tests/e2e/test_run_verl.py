"""End to end: `trinity run` with `trainer_type: verl` on CPU — veRL's FSDP workers on gloo, the
transformers rollout engine, weights synced in memory after every step. Run by ``nox -s verl``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="veRL is installed only in the `nox -s verl` session")

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _write(root: Path, name: str, trainer_config: dict | None = None) -> Path:
    config = tiny_job(
        root,
        name=name,
        algorithm={
            "repeat_times": 4,
            "optimizer": {"lr": 1.0e-3},
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
        },
        model={"max_prompt_tokens": 64, "max_response_tokens": 16},
        buffer={
            "total_steps": 3,
            "trainer_input": {"experience_buffer": {"path": f"sqlite:///{root}/{name}.db"}},
        },
        synchronizer={"sync_method": "memory", "sync_interval": 1},
        # veRL's own dtype handling, as before (the tiny job pins the native trainer to float32).
        trainer={
            "trainer_type": "verl",
            "save_interval": 3,
            "trainer_config": trainer_config or {},
            "dtype": None,
        },
    )
    return write_job(root / f"{name}.yaml", config)


@pytest.fixture(scope="module")
def root(tmp_path_factory, math_job) -> Path:
    return math_job(tmp_path_factory.mktemp("verl_job"), train=32, test=4)


@pytest.fixture(scope="module")
def job(root, trinity_run) -> Path:
    proc = trinity_run(_write(root, "verl"))
    assert "step 3/3" in proc.stdout + proc.stderr
    return root


def test_training_steps_ran_and_the_explorer_got_each_steps_weights(job):
    with sqlite3.connect(job / "verl.db") as db:
        rows = db.execute(
            "select model_version, count(*), sum(consumed) from exp group by model_version"
        ).fetchall()
    # 3 explore steps x 2 tasks x 4 rollouts; on-policy (sync_interval 1): step N+1 ran on the
    # weights of train step N, which reached the explorer through memory sync.
    assert {version: (count, consumed) for version, count, consumed in rows} == {
        0: (8, 8),
        1: (8, 8),
        2: (8, 8),
    }


def test_the_final_checkpoint_is_a_trained_hugging_face_model(job):
    import torch
    from transformers import AutoModelForCausalLM

    step = job / "ckpt" / "e2e" / "verl" / "global_step_3"
    assert (step / "actor" / "model_world_size_1_rank_0.pt").is_file()  # veRL's FSDP shard
    trained = AutoModelForCausalLM.from_pretrained(step)
    initial = AutoModelForCausalLM.from_pretrained(job / "model")
    diffs = [
        (a - b).abs().max().item()
        for a, b in zip(trained.state_dict().values(), initial.state_dict().values())
    ]
    assert max(diffs) > 0, "training did not change the weights"
    assert all(torch.isfinite(t).all() for t in trained.state_dict().values())


def test_the_trainer_measures_the_engine_agreement_every_step(job):
    from trinity.monitor.tensorboard import read_scalars

    scalars = read_scalars(job / "ckpt" / "e2e" / "verl" / "monitor" / "tensorboard" / "trainer")
    worst = dict(scalars["rollout/logprob_diff/max"])
    assert sorted(worst) == [1, 2, 3]
    # The transformers engine (fp32) against veRL's FSDP forward (fp32 on CPU, padding removed):
    # round-off only; a sync that did not reach the engine would be off by > 0.1 after step 1.
    assert max(worst.values()) < 1e-3, worst


def test_an_impossible_rank_count_fails_within_a_minute_in_one_line(root, job_env):
    """More ranks than the machine has cores: refused as soon as Ray is up, not left pending."""
    config = _write(root, "too_many", {"trainer": {"n_gpus_per_node": 512}})
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=job_env,
    )
    assert time.monotonic() - start < 60
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    failed = [line for line in out.splitlines() if "job failed" in line]
    assert len(failed) == 1, out[-3000:]
    assert (
        "the veRL trainer runs on CPU here (the local Ray has no GPU): 1 node(s) x 512 rank(s)" in failed[0]
    )
    assert "Traceback" not in out
