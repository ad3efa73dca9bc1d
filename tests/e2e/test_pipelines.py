"""End to end: one GRPO job with both data-processor pipelines.

The task pipeline turns a raw file (every task twice, plus some too short to keep) into the
explorer's taskset; the experience pipeline runs a Data-Juicer recipe in an auto-started
Data-Juicer service (its LLM operator scoring with the job's auxiliary model ``judge``), doubles each reward with ``reward_shaping_mapper``
(``varied_reward``'s ``length_class`` stat added once more) and drops the groups whose rollouts
all scored the same with ``reward_std_filter``. The SQL buffer then holds exactly the shaped
rewards of the groups kept, the trainer trained on those, and the dropped groups are counted.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from trinity.run_status import read_run_status
from trinity.testing.jobs import tiny_job, write_job

from .conftest import PLUGINS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS, BATCH, REPEAT = 3, 4, 2


def _config(root: Path) -> dict:
    data_juicer = {
        "process": [
            {"text_length_filter": {"min_len": 0}},
            # Scores each experience with the auxiliary model `judge`, served by the job; the
            # tiny judge's replies hold no scores, so every score is 0 and every row is kept.
            {"llm_quality_score_filter": {"api_or_hf_model": "judge", "min_score": 0.0, "try_num": 1}},
        ]
    }
    shaping = [{"stats_key": "length_class", "op_type": "ADD", "weight": 1.0}]
    judge = {
        "name": "judge",
        "model_path": f"{root}/model",
        "engine_type": "transformers",
        "dtype": "float32",
        "max_prompt_tokens": 3500,
        "max_response_tokens": 4,
        "enable_log_requests": True,
    }
    return tiny_job(
        root,
        name="pipelines",
        algorithm={"repeat_times": REPEAT, "optimizer": {"lr": 1.0e-3}},
        data_processor={
            "task_pipeline": {
                "inputs": [f"{root}/raw.jsonl"],
                "target_fields": ["question", "answer"],
                "operators": [
                    {"name": "length_filter", "args": {"text_keys": "question", "min_len": 3}},
                    {"name": "deduplicator"},
                ],
            },
            "experience_pipeline": {
                "operators": [
                    # Real Data-Juicer operators, in the service the explorer started.
                    {"name": "data_juicer", "args": data_juicer},
                    {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": shaping}},
                    {"name": "reward_std_filter"},
                ],
                "save_input": True,
            },
        },
        buffer={
            "total_steps": STEPS,
            "batch_size": BATCH,
            "explorer_input": {
                # The task pipeline writes the taskset the explorer reads.
                "taskset": {"path": f"{root}/unused"},
                "default_reward_fn_type": "varied_reward",
            },
        },
        explorer={"auxiliary_models": [judge]},
        service={"data_juicer": {"auto_start": True}},
        synchronizer={"sync_method": "memory", "sync_interval": 1},
    )


def test_task_and_experience_pipelines_shape_what_is_trained(tmp_path, math_job, trinity_run):
    from trinity.monitor.tensorboard import read_scalars

    pytest.importorskip("data_juicer", reason="Data-Juicer is the optional extra trinity-core[data-juicer]")
    root = math_job(tmp_path, train=16, test=2)
    tasks = [json.loads(line) for line in (root / "data" / "train.jsonl").read_text().splitlines()]
    raw = tasks + tasks + [{"question": "1", "answer": "1"}] * 3  # duplicates and too-short rows
    (root / "raw.jsonl").write_text("".join(json.dumps(t) + "\n" for t in raw))
    out = trinity_run(write_job(root / "job.yaml", _config(root)), "--plugin-dir", str(PLUGINS)).stdout
    assert f"[trinity] task pipeline: {len(raw)} rows -> {len(tasks)} tasks" in out, out[-2000:]
    job = root / "ckpt" / "e2e" / "pipelines"
    assert read_run_status(job)["status"] == "finished"
    assert len((job / "task_pipeline" / "train.jsonl").read_text().splitlines()) == len(tasks)

    explorer = read_scalars(job / "monitor" / "tensorboard" / "explorer")
    assert [v for _, v in explorer["pipeline/data_juicer/dropped"]] == [0.0] * STEPS
    # The recipe ran in the Data-Juicer service, and its LLM operator asked the judge once per
    # experience (try_num 1) through the judge's OpenAI API in the explorer actor.
    log = (job / "log" / "explorer.log").read_text()
    assert "Data-Juicer service started at http://127.0.0.1:" in log
    assert log.count("judge POST /v1/chat/completions 200") == STEPS * BATCH * REPEAT, log[-3000:]
    dropped_groups = sum(v for _, v in explorer["pipeline/reward_std_filter/dropped_groups"])
    dropped = sum(v for _, v in explorer["pipeline/dropped"])
    written = STEPS * BATCH * REPEAT
    with sqlite3.connect(root / "buffer.db") as db:
        rows = db.execute("select task_id, reward, consumed from exp").fetchall()
    # Every unprocessed experience was saved too, with its reward before shaping.
    raw_rows = (job / "experience_pipeline_input.jsonl").read_text().splitlines()
    assert len(raw_rows) == written
    raw_rewards = {
        (r["eid"]["batch"], r["eid"]["task"], r["eid"]["run"]): r["reward"] for r in map(json.loads, raw_rows)
    }
    assert set(raw_rewards.values()) <= {0.0, 0.5, 1.0}

    # Kept groups: every stored reward is the shaped one (twice varied_reward's), and a group's
    # rewards differ; dropped groups: counted, and none of their rollouts reached the buffer.
    assert len(rows) == written - dropped and dropped == REPEAT * dropped_groups
    assert dropped_groups > 0, "this seed's rollouts gave no group without signal to drop"
    assert all(consumed == 1 for _, _, consumed in rows), "the trainer did not train on every kept row"
    assert {reward for _, reward, _ in rows} <= {0.0, 1.0, 2.0} and max(r for _, r, _ in rows) > 1.0
    by_group: dict[str, set[float]] = {}
    for task_id, reward, _ in rows:
        by_group.setdefault(task_id, set()).add(reward)
    assert all(len(rewards) > 1 for rewards in by_group.values())
    trainer = read_scalars(job / "monitor" / "tensorboard" / "trainer")
    trained = sum(v for _, v in trainer["trainer/num_experiences"])
    assert trained == len(rows)
