"""End to end: the three judge workflows of trinity-plugins-math train two steps each through
`trinity run` (one job, one stage per workflow, tiny models on CPU).

The judge of ``math_ruler_workflow`` and ``rubric_judge_workflow`` is the tiny model itself,
served by the job as the auxiliary model ``judge``: its replies hold no scores, so every judging
takes the counted fallback, which the step's metrics must show (``rollout/judge_success`` 0, the
failure kinds adding up to every rollout, the fallback reward). ``math_trainable_ruler_workflow``
judges with the policy, its reference answer always used: its judgings are trained too, as a
group of their own (``<task>-ruler``) beside the answers'.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH, REPEAT, STEPS = 2, 2, 2
STAGES = ["ruler", "trainable_ruler", "rubric"]


def _config(root: Path) -> dict:
    judge = {
        "name": "judge",
        "model_path": f"{root}/model",
        "engine_type": "transformers",
        "dtype": "float32",
        "max_prompt_tokens": 2048,
        "max_response_tokens": 8,
    }
    rubric_taskset = {
        "path": f"{root}/rubric",
        "format": {"prompt_key": "question", "response_key": "reference_answer", "system_prompt": None},
    }
    stages = [
        {
            "stage_name": "ruler",
            "buffer": {"explorer_input": {"default_workflow_type": "math_ruler_workflow"}},
        },
        {
            "stage_name": "trainable_ruler",
            # The answers and as many judgings: twice the usual batch, still one explore step
            # (the workflow's experiences_per_rollout is 2 with its reference always used), so
            # the stage runs strictly on-policy.
            "buffer": {
                "train_batch_size": 2 * BATCH * REPEAT,
                "explorer_input": {
                    "default_workflow_type": "math_trainable_ruler_workflow",
                    "taskset": {"workflow_args": {"ground_truth_probability": 1.0}},
                },
            },
            "explorer": {"auxiliary_models": []},
        },
        {
            "stage_name": "rubric",
            "buffer": {
                "explorer_input": {
                    "default_workflow_type": "rubric_judge_workflow",
                    "taskset": rubric_taskset,
                }
            },
        },
    ]
    return tiny_job(
        root,
        name="judges",
        algorithm={"repeat_times": REPEAT},
        # The judging prompt holds the question and every answer (one token per character).
        model={"max_prompt_tokens": 1536},
        buffer={
            "total_steps": STEPS,
            "batch_size": BATCH,
            "explorer_input": {"default_reward_fn_type": None},
        },
        explorer={"auxiliary_models": [judge]},
        stages=stages,
    )


def test_judge_workflows_train_two_steps_with_a_tiny_judge(tmp_path, math_job, trinity_run):
    from trinity.experience import Experience
    from trinity.monitor.tensorboard import read_scalars

    root = math_job(tmp_path, train=4, test=1)
    (root / "rubric").mkdir()
    rows = [
        {
            "question": f"{a}+{a}?",
            "reference_answer": str(2 * a),
            "rubric": [{"description": "Right sum.", "weight": 5}],
        }
        for a in range(4)
    ]
    (root / "rubric" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trinity_run(write_job(root / "job.yaml", _config(root)))

    job = root / "ckpt" / "e2e" / "judges"
    explorer = {s: read_scalars(job / s / "monitor" / "tensorboard" / "explorer") for s in STAGES}
    trainer = {s: read_scalars(job / s / "monitor" / "tensorboard" / "trainer") for s in STAGES}

    def last(scalars: dict, tag: str) -> float:
        assert tag in scalars, sorted(scalars)
        return scalars[tag][-1][1]

    # Every stage trained each of its steps on what its explorer wrote.
    for s, per_step in zip(STAGES, [4.0, 8.0, 4.0]):
        assert [v for _, v in trainer[s]["trainer/num_experiences"]] == [per_step] * STEPS, s
    for stage in ("ruler", "rubric"):
        e = explorer[stage]
        # the tiny judge's replies hold no scores: every judging fell back, counted by kind
        assert last(e, "rollout/judge_success") == 0.0
        assert len(e["rollout/judge_success"]) == STEPS
        assert sum(last(e, f"rollout/judge_{r}") for r in ("timeout", "error", "refused", "malformed")) == 1.0
        assert last(e, "rollout/reward_mean") == last(e, "rollout/reward_max") == 0.0  # fallback_reward
        assert last(e, "rollout/failed_tasks") == 0.0
    assert "rollout/gold_reward" in explorer["ruler"] and "rollout/accuracy" in explorer["ruler"]
    assert "rollout/reward_for_judge" in explorer["trainable_ruler"]

    # The trainable judge's experiences: a group of their own beside each task's answers.
    with sqlite3.connect(root / "buffer.db") as db:
        blobs = [Experience.deserialize(b) for (b,) in db.execute("select blob from exp_blobs")]
    judgings = [x for x in blobs if x.info.get("ruler") == "judge"]
    assert len(judgings) == STEPS * BATCH * REPEAT
    assert all(str(x.eid.task).endswith("-ruler") and "judge_success" in x.metrics for x in judgings)
    answers = {x.eid.tid for x in blobs if x.info.get("ruler") != "judge" and "gold_reward" in x.metrics}
    assert not answers & {x.eid.tid for x in judgings}
    fallbacks = [x for x in blobs if "judge_failure" in x.info and x.info.get("ruler") != "judge"]
    assert len(fallbacks) == 2 * STEPS * BATCH * REPEAT  # every answer of the ruler and rubric stages
