"""End to end: Trinity-RFT's BOTS reference-evaluation job (examples/bots/ref_eval_collect.yaml,
stored unchanged in trinity-plugins-math/tests/upstream_configs/) runs two explore steps on CPU
with the tiny model, and the log its workflow writes merges into the pass-rate column BOTS's
selector reads.

The job is upstream's YAML with only what a CPU machine needs changed (tiny model, the data
file, batch and repeat sizes, the transformers engine; its nccl sync becomes checkpoint sync, as
for any explore-only job on a Ray of its own, which has nobody to broadcast to).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trinity.testing.jobs import deep_merge, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UPSTREAM = Path(__file__).parents[2] / "trinity-plugins-math" / "tests" / "upstream_configs"


def test_ref_eval_collect_runs_and_its_log_feeds_the_selector(
    tmp_path, math_job, trinity_run, job_env, monkeypatch
):
    import pandas as pd

    from trinity_math.bots import merge_ref_eval

    root = math_job(tmp_path, train=1, test=1)
    data = root / "guru.parquet"
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{a}="}], "reward_model": {"ground_truth": str(2 * a)}}
        for a in range(4)
    ]
    pd.DataFrame(rows).to_parquet(data, index=False)
    log = root / "ref_eval" / "log.jsonl"
    monkeypatch.setitem(job_env, "BOTS_REF_EVAL_LOG_FILE", str(log))

    upstream = yaml.safe_load((UPSTREAM / "bots_ref_eval_collect.yaml").read_text())
    config = deep_merge(
        upstream,
        {
            "checkpoint_root_dir": f"{root}/ckpt",
            "algorithm": {"repeat_times": 2},
            "model": {"model_path": f"{root}/model", "max_prompt_tokens": 64, "max_response_tokens": 6},
            "cluster": None,
            "buffer": {
                "batch_size": 2,
                "explorer_input": {"taskset": {"path": str(data)}},
                "trainer_input": {"experience_buffer": {"path": f"sqlite:///{root}/buffer.db"}},
            },
            "explorer": {
                "runner_per_model": 2,
                "rollout_model": {"engine_type": "transformers", "engine_num": 1, "dtype": "float32"},
            },
            "trainer": {"trainer_type": "native", "dtype": "float32"},
        },
    )
    assert config["mode"] == "explore"
    assert (
        config["buffer"]["explorer_input"]["default_workflow_type"]
        == "bots_ref_eval_collect_math_boxed_workflow"
    )
    trinity_run(write_job(root / "job.yaml", config))

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # Two steps of two tasks: every row once, each with its two rollouts' rewards.
    assert sorted(line["truth"] for line in lines) == ["0", "2", "4", "6"]
    assert all(len(line["rewards"]) == 2 and set(line["rewards"]) <= {0.0, 1.0} for line in lines)
    assert {line["model_version"] for line in lines} == {0}
    assert sorted(json.dumps(line["question"]) for line in lines) == sorted(
        json.dumps(r["prompt"]) for r in rows
    )

    report = merge_ref_eval(str(data), str(log), "tiny_pass_rate")
    assert report["matched"] == 4 and report["unmatched"] == 0
    by_truth = {line["truth"]: sum(line["rewards"]) / 2 for line in lines}
    frame = pd.read_parquet(data)
    assert frame["tiny_pass_rate"].tolist() == [by_truth[str(2 * a)] for a in range(4)]
