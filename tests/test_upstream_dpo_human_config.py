"""Upstream's ``dpo_human_in_the_loop/dpo.yaml`` (stored unchanged under ``upstream_configs/``,
with its ``demo-data.jsonl``) loads with the real loader: its task pipeline's
``human_preference_annotation_mapper`` takes upstream's arguments, the DPO train job reads what
the pipeline writes, and ``trinity run --dry-run`` accepts it; without Trinity Studio (which
shows the pairs) the operator says how to install it."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.config.errors import ConfigError
from trinity.config.pipelines import trains_on_pipeline_output
from trinity.data.checks import check_operator_needs

EXAMPLE = Path(__file__).parent / "upstream_configs" / "dpo_human_in_the_loop"


@pytest.fixture
def dpo_env(upstream_env, monkeypatch):
    """Upstream's layout: the example's data under ``examples/`` of the folder the job starts
    from, and a model folder."""
    data = upstream_env / "examples" / "dpo_human_in_the_loop"
    data.mkdir(parents=True)
    shutil.copy(EXAMPLE / "demo-data.jsonl", data)
    model = upstream_env / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(model))
    return upstream_env


def test_the_example_loads_and_trains_on_what_its_task_pipeline_writes(dpo_env):
    config = load_config(EXAMPLE / "dpo.yaml")
    [op] = config.data_processor.task_pipeline.operators
    assert op.name == "human_preference_annotation_mapper"
    assert op.args["wait_for_annotations"] is True and op.args["timeout"] == 3600
    assert config.mode == "train" and config.algorithm.algorithm_type == "dpo"
    assert trains_on_pipeline_output(config)  # as upstream: the DPO dataset is the pipeline's output
    check_operator_needs(config)


def test_trinity_run_dry_run_accepts_it(dpo_env):
    from click.testing import CliRunner

    from trinity.cli import cli

    result = CliRunner().invoke(cli, ["run", "--config", str(EXAMPLE / "dpo.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "human_preference_annotation_mapper" in result.output


def test_without_the_studio_the_operator_says_how_to_install_it(dpo_env, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trinity_studio" else real(name, *a)
    )
    with pytest.raises(ConfigError) as info:
        check_operator_needs(load_config(EXAMPLE / "dpo.yaml"))
    message = str(info.value)
    assert "\n" not in message and "data_processor.task_pipeline.operators[0]" in message
    assert "pip install" in message and "trinity-studio" in message
