"""Trinity-RFT's judge examples (grpo_gsm8k_ruler, grpo_gsm8k_trainable_ruler,
grpo_rubric_as_reward), stored unchanged under upstream_configs/, load with the real loader and
pass ``trinity run --dry-run``; their tasksets' rows become tasks the workflows run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import load_config
from trinity.plugins import get_component
from trinity_math.rubric import RubricJudgeWorkflow
from trinity_math.ruler import MathRULERWorkflow, MathTrainableRULERWorkflow

UPSTREAM = Path(__file__).parent / "upstream_configs"
GSM8K = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}
RAR = {
    "question": "Most sensitive imaging for a ureteric stone?",
    "reference_answer": "Non-contrast helical CT.",
    "rubric": [{"description": "Names non-contrast CT.", "title": "Modality", "weight": 5}],
}
GSM8K_CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
"""


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    """The environment Trinity-RFT's configs read, a model folder, and the tasksets: GSM8K rows
    at $TRINITY_TASKSET_PATH, RaR-Medicine rows at the relative path the rubric config names."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    # openai/gsm8k's layout: subset "main" (the configs' subset_name) declared in its README
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "README.md").write_text(GSM8K_CARD)
    for folder, row in (
        (tmp_path / "gsm8k" / "main", GSM8K),
        (tmp_path / "anisha2102" / "RaR-Medicine", RAR),
    ):
        folder.mkdir(parents=True)
        for split in ("train", "test"):
            (folder / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(model))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "gsm8k"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the judges are hub ids; a dry run stays offline
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


CONFIGS = [
    ("grpo_gsm8k_ruler.yaml", "math_ruler_workflow", MathRULERWorkflow, ["Qwen/Qwen2.5-32B-Instruct"]),
    ("grpo_gsm8k_trainable_ruler.yaml", "math_trainable_ruler_workflow", MathTrainableRULERWorkflow, []),
    (
        "grpo_rubric_as_reward.yaml",
        "rubric_judge_workflow",
        RubricJudgeWorkflow,
        ["Qwen/Qwen3-30B-A3B-Instruct-2507"],
    ),
]


@pytest.mark.parametrize(("name", "workflow", "cls", "judges"), CONFIGS)
def test_the_configs_load_unchanged_and_read_their_tasks(upstream_env, name, workflow, cls, judges):
    config = load_config(UPSTREAM / name)
    [taskset] = config.buffer.explorer_input.tasksets
    assert taskset.default_workflow_type == workflow and get_component("workflow", workflow) is cls
    assert [a.model_path for a in config.explorer.auxiliary_models] == judges
    assert config.algorithm.algorithm_type == "grpo" and config.algorithm.repeat_times == 8
    reader = TasksetReader(taskset, config.buffer)
    [task] = reader.read_batch(1)
    assert task.workflow is cls and task.repeat_times == 8 and not reader.skipped
    if cls is RubricJudgeWorkflow:
        assert task.raw_task["rubric"] == RAR["rubric"] and task.truth == RAR["reference_answer"]
    else:
        assert task.task_desc == GSM8K["question"] and task.truth == GSM8K["answer"]


def test_the_ruler_judges_limits_load_as_trinity_rft_gives_them(upstream_env, caplog):
    # 12288 + 12288 tokens in a max_model_len of 16384: a warning for an auxiliary model (its
    # replies stop at max_model_len), as Trinity-RFT checks only the trained model's limits.
    config = load_config(UPSTREAM / "grpo_gsm8k_ruler.yaml")
    [judge] = config.explorer.auxiliary_models
    assert (judge.max_prompt_tokens, judge.max_response_tokens, judge.max_model_len) == (12288, 12288, 16384)
    assert "max_prompt_tokens + max_response_tokens (12288 + 12288) exceed max_model_len 16384" in caplog.text


@pytest.mark.parametrize(("name", "workflow", "cls", "judges"), CONFIGS)
def test_trinity_run_dry_run(upstream_env, name, workflow, cls, judges):
    from click.testing import CliRunner

    from trinity.cli import cli

    result = CliRunner().invoke(cli, ["run", "--config", str(UPSTREAM / name), "--dry-run"])
    assert result.exit_code == 0, result.output[-2000:]
    assert f"default_workflow_type: {workflow}" in result.output


def test_the_trainable_rulers_geometry_counts_its_judgings(upstream_env):
    # Trinity-RFT sizes the train batch to an explore step's experiences: 96 tasks x 8 answers,
    # and a judging beside each answer of the 20% of tasks that use their reference (960 ~ 921.6).
    g = load_config(UPSTREAM / "grpo_gsm8k_trainable_ruler.yaml").geometry
    assert g.experiences_per_rollout == pytest.approx(1.2)
    assert g.experiences_per_explore_step == pytest.approx(96 * 8 * 1.2)
    assert g.explore_steps_per_train_step == pytest.approx(960 / 921.6)
    # Rollouts alone would call a train step 1.25 explore steps: the trainer would fall behind.
    assert [g.explore_steps_through(t) for t in (1, 4, 24)] == [2, 5, 25]


def test_a_ground_truth_probability_out_of_range_is_a_config_error_at_its_key(upstream_env, tmp_path):
    import yaml

    from trinity.config import ConfigError

    data = yaml.safe_load((UPSTREAM / "grpo_gsm8k_trainable_ruler.yaml").read_text())
    data["buffer"]["explorer_input"]["taskset"]["workflow_args"] = {"ground_truth_probability": 1.5}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tasksets\[0\]\.workflow_args.*must be in \[0, 1\], got 1.5"):
        load_config(tmp_path / "bad.yaml")
