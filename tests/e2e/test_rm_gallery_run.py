"""End to end: Trinity-RFT's grpo_math example (math_rm_workflow + rm_gallery_reward with
RM-Gallery's math_verify_reward; stored unchanged in trinity-plugins-math/tests/upstream_configs/)
trains two steps on CPU with the tiny model, RM-Gallery scoring in the explorer's runners.

The job is upstream's YAML with only what a CPU machine needs changed (tiny model and data, batch
and repeat sizes, the transformers engine and native trainer, the default synchronizer instead
of nccl). It needs RM-Gallery, which the main test venv cannot have: ``nox -s rm_gallery`` runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trinity.testing.jobs import upstream_on_cpu, write_job

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("rm_gallery") is None,
        reason="rm-gallery is not installed here (it pins transformers<5 and math-verify<0.8, which this "
        "venv cannot have); `nox -s rm_gallery` installs it and runs this test",
    ),
]

UPSTREAM = Path(__file__).parents[2] / "trinity-plugins-math" / "tests" / "upstream_configs"
STEPS = 2


def test_grpo_math_trains_steps_scored_by_rm_gallery(tmp_path, math_job, trinity_run):
    from trinity.monitor.tensorboard import read_scalars

    root = math_job(tmp_path, train=4, test=1)
    # Upstream's taskset reads question / gt_answer.
    rows = [json.loads(line) for line in (root / "data" / "train.jsonl").read_text().splitlines()]
    (root / "math").mkdir()
    (root / "math" / "train.jsonl").write_text(
        "".join(json.dumps({"question": r["question"], "gt_answer": r["answer"]}) + "\n" for r in rows)
    )
    upstream = yaml.safe_load((UPSTREAM / "grpo_math.yaml").read_text())
    config = upstream_on_cpu(
        upstream,
        {
            "checkpoint_root_dir": f"{root}/ckpt",
            "algorithm": {"repeat_times": 2},
            "model": {"model_path": f"{root}/model", "max_prompt_tokens": 128, "max_response_tokens": 8},
            "buffer": {
                "batch_size": 2,
                "total_steps": STEPS,
                "explorer_input": {"taskset": {"path": f"{root}/math"}},
                "trainer_input": {
                    "experience_buffer": {"storage_type": "sql", "path": f"sqlite:///{root}/buffer.db"}
                },
            },
        },
    )
    taskset = config["buffer"]["explorer_input"]["taskset"]
    assert (taskset["default_workflow_type"], taskset["default_reward_fn_type"]) == (
        "math_rm_workflow",
        "rm_gallery_reward",
    )
    trinity_run(write_job(root / "job.yaml", config))

    job = root / "ckpt" / "grpo_math" / "grpo_math_example"
    explorer = read_scalars(job / "monitor" / "tensorboard" / "explorer")
    trainer = read_scalars(job / "monitor" / "tensorboard" / "trainer")
    # RM-Gallery scored every rollout (its dimension is the reward's part), none failed.
    assert "rollout/math_verify" in explorer, sorted(explorer)
    assert [v for _, v in explorer["rollout/reward_failed"]] == [0.0] * STEPS
    assert [v for _, v in trainer["trainer/num_experiences"]] == [4.0] * STEPS
