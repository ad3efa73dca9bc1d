"""End to end: the RAFT ALFWorld workflows in a `trinity run` job on CPU, with the tiny model.

Two explore/train steps of ``algorithm_type: raft`` with ``RAFT_reflect_alfworld_workflow`` on a
scripted household (``household_plugin/``: the registered workflows with their environment
swapped, TextWorld needs the optional extra and downloaded games), and an eval of
``RAFT_alfworld_workflow`` after each. The tiny model never answers in the three-block format, so
every first attempt is lost and followed by a second one with the first in its context; every
Experience is a placeholder carrying the attempts' metrics, and the SFT step trains on none of
them. (Attempts that are kept are covered with scripted policies in
trinity-plugins-agents/tests/test_raft_alfworld.py.)
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PLUGIN = Path(__file__).parent / "household_plugin"
GAME = {"task": "put a mug on desk 1", "receptacles": ["shelf 1", "table 1"], "where": "shelf 1"}
GAME["goal"] = ["mug 1", "desk 1"]
STEPS = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model, trinity_run) -> Path:
    from trinity.testing.jobs import tiny_job, tiny_taskset, write_job

    root = tmp_path_factory.mktemp("raft_alfworld")
    games = root / "games"
    games.mkdir()
    rows = []
    for i in range(2 * STEPS + 1):  # two games a step (batch_size 2), one to evaluate
        path = games / f"game_{i}.json"
        path.write_text(json.dumps(GAME))
        rows.append(json.dumps({"game_file": str(path), "target": ""}) + "\n")
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text("".join(rows[:-1]))
    (root / "data" / "test.jsonl").write_text(rows[-1])
    fmt = {"prompt_key": "game_file", "response_key": "task_desc", "system_prompt": None}
    args = {"max_env_steps": 2}
    config = tiny_job(
        root,
        name="raft",
        algorithm={"algorithm_type": "raft", "repeat_times": 1},
        # The RAFT system prompt alone is ~2,200 characters (tokens, for the character-level model).
        model={"model_path": str(tiny_model()), "max_prompt_tokens": 4000, "max_model_len": 4096},
        buffer={
            "total_steps": STEPS,
            "explorer_input": {
                "taskset": tiny_taskset(
                    root,
                    "household",
                    format=fmt,
                    workflow_args=args,
                    default_workflow_type="household_RAFT_reflect_alfworld_workflow",
                ),
                "eval_tasksets": [
                    tiny_taskset(
                        root,
                        "household-eval",
                        split="test",
                        format=fmt,
                        workflow_args=args,
                        default_workflow_type="household_RAFT_alfworld_workflow",
                    )
                ],
                "default_workflow_type": None,
                "default_reward_fn_type": None,
            },
        },
        explorer={"eval_interval": 1},
    )
    trinity_run(write_job(root / "job.yaml", config), "--plugin-dir", str(PLUGIN))
    return root


def test_reflect_attempts_reach_the_buffer_as_placeholders_and_are_trained_on(job):
    from trinity.experience import Experience

    with sqlite3.connect(job / "buffer.db") as db:
        rows = db.execute("select e.consumed, b.blob from exp e join exp_blobs b on b.id = e.id").fetchall()
    assert len(rows) == 2 * STEPS and all(consumed for consumed, _ in rows)
    for _, blob in rows:
        exp = Experience.deserialize(blob)
        assert exp.info["raft_kept"] is False and exp.info["second_attempt_failed"] is False
        assert exp.info["second_steps"] == 2 and exp.info["second_reward"] == 0.0  # it tried twice
        assert exp.info["format_valid"] is False and exp.reward == 0.0
        assert not bool(exp.action_mask.any())


def test_metrics_of_both_workflows_are_logged(job):
    from trinity.monitor.tensorboard import read_scalars

    monitor = job / "ckpt" / "e2e" / "raft" / "monitor" / "tensorboard"
    explorer = read_scalars(monitor / "explorer")
    assert [v for _, v in explorer["rollout/raft_kept"]] == [0.0] * STEPS
    assert [v for _, v in explorer["rollout/second_steps"]] == [2.0] * STEPS
    assert [v for _, v in explorer["eval/household-eval/accuracy"]] == [0.0] * STEPS
    assert [v for _, v in explorer["eval/household-eval/steps"]] == [2.0] * STEPS
    trainer = read_scalars(monitor / "trainer")
    # Each raft step ran on its two placeholders: nothing kept, nothing in the SFT loss.
    assert [v for _, v in trainer["advantage/kept_count"]] == [0.0] * STEPS
    assert [v for _, v in trainer["actor/loss"]] == [0.0] * STEPS
