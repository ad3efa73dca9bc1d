"""examples/webshop/*.yaml validate (what `trinity run --dry-run` checks) and name this plugin's workflow."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "webshop"


@pytest.mark.parametrize(
    ("name", "engine", "trainer"), [("grpo.yaml", "vllm", "verl"), ("cpu.yaml", "transformers", "native")]
)
def test_example_config_validates(name, engine, trainer, monkeypatch):
    config_module = pytest.importorskip("trinity.config")
    monkeypatch.setenv("MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TINY_MODEL_PATH", "/models/tiny")
    config = config_module.load_config(EXAMPLES / name)
    assert config.explorer.rollout_model.engine_type == engine
    assert config.trainer.trainer_type == trainer
    [taskset] = config.buffer.explorer_input.tasksets
    assert taskset.default_workflow_type == "webshop_workflow"
    assert taskset.workflow_args["env"] == "builtin" and taskset.workflow_args["max_env_steps"] >= 1
    assert config.model.model_path.startswith("/models/")
