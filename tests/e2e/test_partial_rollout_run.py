"""End to end: `trinity run` with partial rollouts (``explorer.over_rollout.partial_rollout``) on
CPU: a step ends without its slow task (one in four waits for the next weights before answering,
a ``--plugin-dir`` workflow), which is carried over the weight sync, resumed and finished in the
next step (``wait_after_min`` gives it 2 s) under the new weights; the experiences carry
their per-token versions through the SQL buffer."""

from __future__ import annotations

import sqlite3

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLUGIN = """
import time

from trinity import hookimpl
from trinity_math.workflows import MathWorkflow


class SlowMath(MathWorkflow):
    def run(self):
        if self.task.index % 4 == 0 and not self.task.is_eval:  # waits for new weights: cut, carried
            start, deadline = self.model.model_version, time.monotonic() + 30
            while self.model.model_version == start and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().run()


@hookimpl
def register_workflows(register):
    register("slow_math_partial", SlowMath)
"""


def test_a_cut_task_resumes_in_the_next_step(tmp_path, math_job, trinity_run):
    from trinity.experience import Experience
    from trinity.monitor.tensorboard import read_scalars

    root = math_job(tmp_path, train=16, test=4)
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "slow_math_partial.py").write_text(PLUGIN)
    config = tiny_job(
        root,
        name="partial",
        buffer={
            "total_steps": 2,
            "batch_size": 4,
            "explorer_input": {"default_workflow_type": "slow_math_partial"},
        },
        explorer={
            "runner_per_model": 4,
            "over_rollout": {"ratio": 0.25, "wait_after_min": 2, "partial_rollout": True, "max_staleness": 2},
        },
        synchronizer={
            "sync_method": "memory",
            "sync_style": "explorer_driven",
            "sync_interval": 1,
            "sync_offset": 0,
        },
    )
    trinity_run(write_job(root / "job.yaml", config), "--plugin-dir", str(plugins))
    scalars = read_scalars(root / "ckpt" / "e2e" / "partial" / "monitor" / "tensorboard" / "explorer")
    resumed = sum(v for _, v in scalars["rollout/partial_rollout/resumed_tasks"])
    assert resumed >= 1 and "rollout/partial_rollout/token_version_lag_max" in scalars
    with sqlite3.connect(root / "buffer.db") as db:
        blobs = [bytes(b) for (b,) in db.execute("select blob from exp_blobs")]
    versioned = [e for e in map(Experience.deserialize, blobs) if e.token_versions is not None]
    # The resumed task's experiences, with the version of each of their tokens.
    assert versioned and all(e.token_versions.shape[0] == e.response_length for e in versioned)
