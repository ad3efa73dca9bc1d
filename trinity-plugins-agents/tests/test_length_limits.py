"""Trinity-RFT's agent configs (grpo_toolcall, grpo_frozen_lake, agentscope_react,
agentscope_frozenlake), loaded unchanged but for smaller token limits, never produce a training
sequence longer than ``max_model_len``: the policies here ramble for thousands of tokens per
reply, and every experience their workflows return still fits (the engine caps each reply at
what the prompt leaves; the OpenAI API the AgentScope agents talk to does the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import load_config
from trinity.plugins import get_component
from trinity.rollout.base import SamplingArgs
from trinity.workflow import Task
from trinity_agents.agentscope_frozen_lake import AgentScopeFrozenLakeWorkflow
from trinity_agents.agentscope_react import agentscope_install_hint
from trinity_agents.frozen_lake import FrozenLakeWorkflow, oracle_action
from trinity_agents.scripted import scripted_model, scripted_openai_model
from trinity_agents.tasks import main as tasks_main
from trinity_agents.toolcall import ToolCallWorkflow

UPSTREAM = Path(__file__).parent / "upstream_configs"
RAMBLE = "Let me think about this very carefully. " * 120  # ~4,800 tokens of the test tokenizer
# Small limits: the upstream files' own (12k-25k tokens) would take minutes to fill here. The
# frozen-lake games' first prompt takes ~970 tokens of the test tokenizer.
LIMITS = ["model.max_model_len=700", "model.max_response_tokens=300"]
LAKE_LIMITS = ["model.max_model_len=2400", "model.max_response_tokens=300"]


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)


def model_for(config, policy, *, api=False):
    """A scripted model holding the limits the config gives the rollout model."""
    rm = config.explorer.rollout_model
    limits = {
        "max_model_len": rm.max_model_len,
        "max_prompt_tokens": rm.max_prompt_tokens,
        "default_args": SamplingArgs(max_tokens=rm.max_response_tokens),
    }
    model = scripted_openai_model(policy, **limits) if api else scripted_model(policy, **limits)
    model.engine.enable_prompt_truncation = rm.enable_prompt_truncation
    return model


def first_task(config):
    return TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer).read_batch(1)[0]


def check(exps, config):
    limit = config.model.max_model_len
    assert exps and max(e.tokens.shape[0] for e in exps) <= limit
    return exps


def test_grpo_toolcall():
    tasks_main(["toolcall", "examples/grpo_toolcall/toolace_data", "--train", "2", "--test", "1"])
    config = load_config(UPSTREAM / "grpo_toolcall_toolace.yaml", overrides=LIMITS)
    assert (config.model.max_model_len, config.model.max_prompt_tokens) == (700, 400)
    task = first_task(config)
    calls = json.dumps(json.loads(task.raw_task["answer"]))
    model = model_for(config, lambda messages: RAMBLE + f"<tool_call>{calls}</tool_call>")
    exps = check(ToolCallWorkflow(task=task, model=model).run(), config)
    assert {e.info["finish_reason"] for e in exps} == {"length"}  # every reply was cut


def test_grpo_frozen_lake():
    tasks_main(["frozen_lake", "data", "--train", "2", "--test", "1", "--map-max-size", "4"])
    config = load_config(UPSTREAM / "grpo_frozen_lake.yaml", overrides=LAKE_LIMITS)
    assert config.model.enable_prompt_truncation is False  # the file's own setting

    def policy(messages):
        return f"{RAMBLE[:600]}```{oracle_action(messages[-1]['content'])}```"

    [exp] = check(FrozenLakeWorkflow(task=first_task(config), model=model_for(config, policy)).run(), config)
    assert exp.info["terminate_reason"] == "max_model_len"


@pytest.fixture
def agentscope():
    return pytest.importorskip(
        "agentscope", reason="the AgentScope workflows need the extra: " + agentscope_install_hint()
    )


def test_agentscope_react(agentscope):
    config = load_config(UPSTREAM / "gsm8k.yaml", overrides=LIMITS)
    [taskset] = config.buffer.explorer_input.tasksets  # GSM8K rows, in the config's format
    task = Task(
        workflow=get_component("workflow", taskset.default_workflow_type),
        raw_task={"question": "What is 48 + 24?", "answer": "#### 72"},
        format_args=taskset.format,
        workflow_args=taskset.workflow_args,
    )
    model = model_for(config, lambda messages: RAMBLE, api=True)
    try:
        exps = check(task.to_workflow(model).run(), config)
    finally:
        model.close()
    assert all(e.info["finish_reason"] == "length" for e in exps)
    # The conversation outgrew max_model_len: the episode ends there (the API's 400), no answer.
    assert exps[-1].info["max_model_len_reached"] is True and exps[-1].reward == 0.0


def test_agentscope_frozenlake(agentscope):
    tasks_main(["frozen_lake", "data", "--train", "2", "--test", "1", "--map-max-size", "4"])
    config = load_config(UPSTREAM / "frozenlake_agent.yaml", overrides=LAKE_LIMITS)

    def policy(messages):
        return f"{RAMBLE[:1500]}```{oracle_action(messages[-1]['content'])}```"

    model = model_for(config, policy, api=True)
    try:
        exps = check(AgentScopeFrozenLakeWorkflow(task=first_task(config), model=model).run(), config)
    finally:
        model.close()
    assert exps[-1].info["terminate_reason"] == "max_model_len" and len(exps) >= 2
