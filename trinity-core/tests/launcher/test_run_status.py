"""``run_status.json`` written by two launchers sharing a job dir (a decoupled run)."""

from __future__ import annotations

import os
import signal

import pytest

from trinity import run_status
from trinity.run_status import FILE, read_run_status, write_run_status


def test_a_write_landing_in_the_middle_of_another_loses_nothing(tmp_path, monkeypatch):
    """The train job writes while the explore job's write is between its temporary file and
    its rename (as in tests/e2e/test_decoupled.py): both writes complete, the later rename wins."""
    real_replace = os.replace
    nested = []

    def replace(src, dst):
        if not nested:  # the other job's whole write happens here, once
            nested.append(True)
            write_run_status(tmp_path, "finished")
        real_replace(src, dst)

    monkeypatch.setattr(run_status.os, "replace", replace)
    write_run_status(tmp_path, "running")
    assert nested
    assert read_run_status(tmp_path)["status"] == "running"
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE]  # no temporary file left behind


# -- what stopped a run -----------------------------------------------------------------------

STOPPED_CONFIG = """
project: p
name: stopped
checkpoint_root_dir: {root}
model: {{model_path: {root}/model, max_prompt_tokens: 8, max_response_tokens: 8}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer: {{batch_size: 2, explorer_input: {{taskset: {{name: t, path: {root}/tasks.jsonl}}}}}}
explorer: {{rollout_model: {{engine_type: transformers}}}}
trainer: {{trainer_type: native}}
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_run_stopped_by_a_signal_records_that_signal_and_exits_128_plus_it(
    tmp_path, monkeypatch, sig, code
):
    from trinity import launcher
    from trinity.config import load_config

    path = tmp_path / "job.yaml"
    path.write_text(STOPPED_CONFIG.format(root=tmp_path))
    config = load_config(path)

    def stage_stopped_by_the_signal(stage, *_args):
        # As when the signal lands while the stage runs: the launcher's handler raises.
        (tmp_path / "p" / "stopped" / "global_step_1").mkdir(parents=True)  # results worth keeping
        launcher._interrupt(sig, None)

    monkeypatch.setattr(launcher, "_run_stage", stage_stopped_by_the_signal)
    assert launcher.run(config) == code
    status = read_run_status(tmp_path / "p" / "stopped")
    assert status["status"] == "interrupted" and status["reason"] == f"stopped by {sig.name}"
    launcher._INTERRUPTED.clear()
