"""End to end: SIGKILL the driver mid-run, restart with continue_from_checkpoint, and check the
job resumes at the right step with no experience lost or trained on twice."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOTAL, BATCH = 6, 16  # train steps; experiences per step (4 tasks x 4 rollouts)


def _config(root: Path) -> dict:
    return tiny_job(
        root,
        name="resume",
        mode="both",
        continue_from_checkpoint=True,
        algorithm={
            "repeat_times": 4,
            "optimizer": {"lr": 1.0e-3},
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
        },
        model={"max_response_tokens": 12},
        buffer={"total_steps": TOTAL, "batch_size": 4},
        explorer={"eval_on_startup": None},
        synchronizer={"sync_method": "memory", "sync_interval": 2, "sync_offset": 1},
        trainer={"save_interval": 2},
    )


def _start(root: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(root / "job.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # so the kill below hits only the driver, as a crash would
    )


def test_sigkill_then_resume(tmp_path, math_job, job_env):
    math_job(tmp_path, train=200, test=4, difficulty=3)
    write_job(tmp_path / "job.yaml", _config(tmp_path))

    first = _start(tmp_path, job_env)
    seen = []
    for line in first.stdout:
        seen.append(line)
        if f"[trainer] step 3/{TOTAL}" in line:  # checkpoint 2 is saved; step 3's weights are not
            break
    else:
        pytest.fail("the first run ended before step 3: " + "".join(seen)[-3000:])
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    time.sleep(3)  # let Ray's reaper take down the orphaned local cluster
    # The orphaned trainer may finish the step it was running (and save checkpoint 4) before
    # the reaper gets to it: the run resumes after whichever checkpoint is the newest.
    job_dir = tmp_path / "ckpt" / "e2e" / "resume"
    saved = sorted(int(p.name.split("_")[-1]) for p in job_dir.glob("global_step_*"))
    assert saved and saved[-1] in (2, 4), saved

    second = _start(tmp_path, job_env)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    steps = [line for line in out.splitlines() if line.startswith("[trainer] step ")]
    resumed = saved[-1] + 1
    assert steps[0].startswith(f"[trainer] step {resumed}/{TOTAL}"), (
        f"did not resume after checkpoint {resumed - 1}"
    )
    assert steps[-1].startswith(f"[trainer] step {TOTAL}/{TOTAL}")
    assert (job_dir / f"global_step_{TOTAL}" / "config.json").is_file()
    assert not list((tmp_path / "ckpt" / "e2e").glob("resume_*")), "the resumed run was renamed"
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        per_step = dict(
            db.execute("select consumed_step, count(*) from exp where consumed = 1 group by consumed_step")
        )
        unread = db.execute("select count(*) from exp where consumed = 0").fetchone()[0]
        uids = db.execute("select count(*), count(distinct uid) from exp").fetchone()
    # Every training step of the surviving history trained on exactly one batch; rows read by the
    # lost step 3 were given back and trained again by the new step 3, never twice.
    assert per_step == {step: BATCH for step in range(1, TOTAL + 1)}
    assert uids[0] == uids[1], "an experience was stored twice"
    # Nothing is lost: what was not trained is only what the explorer produced ahead of the trainer.
    assert uids[0] == TOTAL * BATCH + unread and unread % BATCH == 0
