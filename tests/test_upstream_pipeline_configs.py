"""Upstream's data-processor examples (stored unchanged under ``upstream_configs/``) load with
their operators' names and arguments checked through the registry, and their operators bind
before the job starts (``trinity run`` checks it before Ray): the task pipeline's LLM difficulty
filter, the experience pipeline's Data-Juicer recipe and reward shaping; what they lack stops
them with one line naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.config.errors import ConfigError
from trinity.data.checks import check_operator_needs

UPSTREAM = Path(__file__).parent / "upstream_configs"


def test_the_task_pipeline_example_loads_with_its_scoring_model_address(upstream_env, monkeypatch):
    pytest.importorskip("openai", reason="llm_difficulty_score_filter talks to the scoring model with openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    config = load_config(UPSTREAM / "grpo_gsm8k_task_pipeline" / "gsm8k.yaml")
    tp = config.data_processor.task_pipeline
    assert [op.name for op in tp.operators] == ["llm_difficulty_score_filter"]
    assert tp.inputs == [str(upstream_env / "data")] and tp.target_fields == ["question", "answer"]


def test_the_task_pipeline_example_without_an_address_names_the_operator(upstream_env):
    pytest.importorskip("openai", reason="llm_difficulty_score_filter talks to the scoring model with openai")
    config = load_config(UPSTREAM / "grpo_gsm8k_task_pipeline" / "gsm8k.yaml")  # names and args: fine
    with pytest.raises(ConfigError) as info:
        check_operator_needs(config)  # what `trinity run` checks before Ray starts
    message = str(info.value)
    assert "\n" not in message and "data_processor.task_pipeline.operators[0]" in message
    assert "args.base_url or $OPENAI_BASE_URL" in message


def test_trinity_run_checks_what_the_operators_need_before_ray(upstream_env):
    pytest.importorskip("openai", reason="llm_difficulty_score_filter talks to the scoring model with openai")
    from click.testing import CliRunner

    from trinity.cli import cli

    config = str(UPSTREAM / "grpo_gsm8k_task_pipeline" / "gsm8k.yaml")
    result = CliRunner().invoke(cli, ["run", "--config", config, "--dry-run"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "data_processor.task_pipeline.operators[0]" in lines[0]
    assert "args.base_url or $OPENAI_BASE_URL" in lines[0]


def test_the_experience_pipeline_example_loads_with_its_data_juicer_recipe(upstream_env, monkeypatch):
    pytest.importorskip("data_juicer", reason="Data-Juicer is the optional extra trinity-core[data-juicer]")
    # The recipe path is relative to where the job starts (the repository root upstream).
    recipe = upstream_env / "examples" / "grpo_gsm8k_experience_pipeline" / "dj_scoring_exp.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text((UPSTREAM / "grpo_gsm8k_experience_pipeline" / "dj_scoring_exp.yaml").read_text())
    # Its llm_quality_score_filter scores with qwen2.5-32b-instruct: without an address for it
    # every experience would score 0 (Data-Juicer logs the failed call and goes on).
    with pytest.raises(ConfigError) as info:
        check_operator_needs(load_config(UPSTREAM / "grpo_gsm8k_experience_pipeline" / "gsm8k.yaml"))
    message = str(info.value)
    assert "\n" not in message and "data_processor.experience_pipeline.operators[0]" in message
    assert "llm_quality_score_filter calls model 'qwen2.5-32b-instruct'" in message
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")  # as upstream's users set it
    config = load_config(UPSTREAM / "grpo_gsm8k_experience_pipeline" / "gsm8k.yaml")
    check_operator_needs(config)
    ops = config.data_processor.experience_pipeline.operators
    assert [op.name for op in ops] == ["data_juicer", "reward_shaping_mapper"]
    assert ops[0].args["config_path"] == str(recipe)  # absolute: the explorer actor finds it too
    # It names a running Data-Juicer service (upstream starts it by hand); it is used, not ignored.
    assert config.service.data_juicer.server_url == "http://127.0.0.1:5005"
    recipe.unlink()  # without its recipe it stops in one line
    with pytest.raises(ConfigError) as info:
        check_operator_needs(load_config(UPSTREAM / "grpo_gsm8k_experience_pipeline" / "gsm8k.yaml"))
    message = str(info.value)
    assert "\n" not in message and "data_processor.experience_pipeline.operators[0]" in message
    assert f"no recipe at {recipe}" in message


def test_an_unknown_or_misplaced_operator_fails_at_load(upstream_env, tmp_path):
    base = (UPSTREAM / "grpo_gsm8k_experience_pipeline" / "gsm8k.yaml").read_text()
    start = base.index("      - name: data_juicer")
    end = base.index("      - name: reward_shaping_mapper")
    for replacement, expected in (
        ("      - name: reward_shaping_mappr\n", "Unknown operator 'reward_shaping_mappr'. Did you mean"),
        ("      - name: length_filter\n", "operator 'length_filter' is a task operator, not an experience"),
        (
            "      - name: reward_filter\n        args: {limit: 1}\n",
            re.escape(
                "args.limit: unknown argument 'limit' of operator 'reward_filter'; Valid arguments: threshold"
            ),
        ),
    ):
        (tmp_path / "job.yaml").write_text(base[:start] + replacement + base[end:])
        with pytest.raises(ConfigError, match=expected):
            load_config(tmp_path / "job.yaml")


def test_the_task_pipeline_inputs_are_checked_not_the_taskset_it_writes(upstream_env, monkeypatch):
    pytest.importorskip("openai", reason="llm_difficulty_score_filter talks to the scoring model with openai")
    from trinity.config.paths import check_paths

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    model = upstream_env / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(model))
    config = load_config(UPSTREAM / "grpo_gsm8k_task_pipeline" / "gsm8k.yaml")
    # Its training taskset ('./outputs/task_pipeline_output/') is the pipeline's output: not there yet.
    with pytest.raises(ConfigError) as info:
        check_paths(config)
    assert str(info.value) == (
        f"data_processor.task_pipeline.inputs[0]: no such file or folder '{upstream_env / 'data'}'"
    )
    (upstream_env / "data").mkdir()
    check_paths(config)
