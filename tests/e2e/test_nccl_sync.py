"""End to end: `trinity run` with `synchronizer.sync_method: nccl` on CPU.

The trainer and two transformers rollout engines form a weight-sync group over gloo (no CUDA
here; the group, metadata, broadcast order, loading and versioning are the code NCCL uses on
GPUs). Checked from the outside: the explorer's model version advances with every sync in the
stored experiences; the logprobs it recorded match a fresh forward pass of the trainer's
checkpoint of that version; and after the final sync the explorer's weights give the same score
as the trainer's final checkpoint (the ``weights_probe`` eval workflow of tests/e2e/plugins
scores a fixed token sequence and reports the weights' version).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

from .conftest import PLUGINS, probe_taskset

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(root: Path) -> dict:
    return tiny_job(
        root,
        name="nccl",
        mode="both",
        algorithm={"optimizer": {"lr": 1.0e-2}, "entropy_loss_fn_args": {"entropy_coef": 0.01}},
        buffer={"total_steps": 3, "explorer_input": {"eval_tasksets": [probe_taskset(root)]}},
        explorer={"eval_interval": 2, "runner_per_model": 1, "rollout_model": {"engine_num": 2}},
        synchronizer={"sync_method": "nccl", "sync_interval": 1, "sync_offset": 0, "sync_timeout": 60},
        trainer={"save_interval": 1},
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory, math_job, trinity_run) -> tuple[Path, subprocess.CompletedProcess]:
    root = math_job(tmp_path_factory.mktemp("nccl"), train=32, test=2)
    return root, trinity_run(write_job(root / "job.yaml", _config(root)), "--plugin-dir", str(PLUGINS))


def test_the_backend_is_chosen_and_logged_once(job):
    root, proc = job
    lines = [line for line in proc.stderr.splitlines() if "sync_method nccl:" in line]
    assert lines == [
        "[trinity] INFO trinity.launcher: sync_method nccl: no CUDA device, broadcasting over gloo to 2 rank(s)"
    ]
    assert "syncing through memory" not in proc.stderr  # the old fallback is gone
    logs = "\n".join(p.read_text() for p in (root / "ckpt" / "e2e" / "nccl" / "log").glob("*.log"))
    # Two syncs before explore steps 2 and 3, and the final one before the last eval.
    for version in (1, 2, 3):
        assert f"loaded weights version {version} from the trainer's broadcast" in logs
        assert f"sent weights version {version} over gloo" in logs


def test_explorer_versions_advance_and_match_the_trainers_checkpoints(job, check_on_policy_rollouts):
    root, _ = job
    # Strictly on-policy (sync_interval 1, offset 0): step b explores with the weights of step
    # b-1, and the logprobs it recorded are those of the trainer's checkpoint of that version.
    check_on_policy_rollouts(root / "buffer.db", root / "ckpt" / "e2e" / "nccl", "e2e/nccl")


def test_after_the_final_sync_the_explorer_holds_the_final_checkpoint(job, probe_score):
    from trinity.monitor.tensorboard import read_scalars

    root, _ = job
    job_dir = root / "ckpt" / "e2e" / "nccl"
    assert (job_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    scalars = read_scalars(job_dir / "monitor" / "tensorboard" / "explorer")
    versions = dict(scalars["eval/probe/probe_version"])
    probes = dict(scalars["eval/probe/probe_logprob"])
    # The eval due at step 2 ran on the weights of trainer step 2 (once they were synced); the
    # final eval, after the final sync, on version 3.
    assert versions == {2: 2.0, 3: 3.0}
    assert dict(scalars["eval/model_version"]) == {2: 2.0, 3: 3.0}
    expected = {step: probe_score(job_dir / f"global_step_{v}") for step, v in ((2, 2), (3, 3))}
    for step in (2, 3):
        assert probes[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-4), (step, probes, expected)
    # The probe tells the versions apart: training moved the weights.
    assert abs(probe_score(job_dir / "global_step_3") - probe_score(job_dir / "global_step_2")) > 1e-3
    assert abs(expected[3] - probe_score(root / "model")) > 1e-3
