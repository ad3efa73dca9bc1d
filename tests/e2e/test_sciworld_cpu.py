"""End to end: ``sciworld_workflow`` (trinity-plugins-agents) trains one GRPO step in a `trinity
run` job on CPU, with the tiny model, against ScienceWorld's real simulator (the `sciworld` extra,
on Java), over rows written from the simulator's own task list (``python -m trinity_agents.tasks
sciworld``).

The untrained model never writes an ``<action>`` block: every turn sends the simulator "" (as
Trinity-RFT does), which it rejects, so each episode is ``TURNS`` malformed actions with reward 0.
Oracle and random players on the same simulator are covered by
trinity-plugins-agents/tests/test_sciworld.py.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH, REPEAT, TURNS = 2, 2, 1


def _simulators_started_since(start: float) -> list[int]:
    """Simulator VMs started since ``start`` that no test process holds (a test module on another
    pytest-xdist worker may run its own meanwhile): one the job left behind."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "scienceworld" in cmdline and "java" in cmdline and (proc.info["create_time"] or 0) >= start:
            try:
                parent = " ".join(proc.parent().cmdline()) if proc.parent() else ""
            except psutil.Error:
                parent = ""
            if "pytest" not in parent:
                found.append(proc.pid)
    return found


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model, trinity_run) -> Path:
    pytest.importorskip("scienceworld", reason="sciworld_workflow needs the sciworld extra")
    if shutil.which("java") is None:
        pytest.skip("ScienceWorld's simulator needs Java (.ci/run installs it)")
    from trinity.testing.jobs import tiny_job, write_job
    from trinity_agents.tasks import main as make_tasks

    root = tmp_path_factory.mktemp("sciworld")
    make_tasks(["sciworld", str(root / "data"), "--percentage", "0.02"])
    config = tiny_job(
        root,
        name="sciworld",
        algorithm={"repeat_times": REPEAT},
        # Trinity-RFT's system prompt and the first room: ~2,500 characters (tokens, here).
        model={"model_path": str(tiny_model()), "max_prompt_tokens": 4000, "max_model_len": 4096},
        buffer={
            "total_steps": 1,
            "batch_size": BATCH,
            "explorer_input": {
                "taskset": {
                    "path": str(root / "data"),
                    "format": {"prompt_key": "task_desc", "response_key": None, "system_prompt": None},
                    "workflow_args": {"max_env_steps": TURNS},
                },
                "default_workflow_type": "sciworld_workflow",
                "default_reward_fn_type": None,
            },
        },
    )
    (root / "started").write_text(str(time.time()))
    trinity_run(write_job(root / "job.yaml", config))
    return root


def test_episodes_on_the_simulator_reach_the_buffer_and_are_trained(job):
    from trinity.experience import Experience
    from trinity.monitor.tensorboard import read_scalars

    with sqlite3.connect(job / "buffer.db") as db:
        rows = db.execute("select e.consumed, b.blob from exp e join exp_blobs b on b.id = e.id").fetchall()
    exps = [Experience.deserialize(blob) for _, blob in rows]
    assert len(exps) == BATCH * REPEAT and all(consumed for consumed, _ in rows)
    train = {(json.loads(r)["task_desc"]) for r in (job / "data" / "train.jsonl").read_text().splitlines()}
    for exp in exps:
        info = exp.info
        assert info["env_steps"] == TURNS and info["malformed_actions"] == TURNS and exp.reward == 0.0
        assert info["golden_rounds"] > 0  # the simulator loaded the task and made its gold path
        task = json.dumps({"task_name": info["task_name"], "var_num": info["var_num"]})[:-1]
        assert any(t.startswith(task) for t in train)
        assert "Task Description: Your task is to" in exp.prompt_text
    trainer = read_scalars(job / "ckpt" / "e2e" / "sciworld" / "monitor" / "tensorboard" / "trainer")
    assert [v for _, v in trainer["trainer/num_experiences"]] == [BATCH * REPEAT]
    # every episode closed its simulator's VM (and none outlived the job)
    assert not _simulators_started_since(float((job / "started").read_text()))
