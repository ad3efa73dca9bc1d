"""The workflows on the real transformers engine with the tiny local model (sampled replies,
real log-probs): output shapes in both modes, and the max_model_len limit holding."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import itertools

from trinity.config import GenerationConfig
from trinity.explorer.model_wrapper import ModelWrapper
from trinity.rollout.base import SamplingArgs
from trinity.rollout.transformers_engine import TransformersEngine
from trinity.testing.tiny_model import IM_END
from trinity.workflow import Task
from trinity_agents.frozen_lake import FrozenLakeWorkflow
from trinity_agents.tasks import toolcall_rows
from trinity_agents.toolcall import ToolCallWorkflow


@pytest.fixture(scope="module")
def engine(tiny_model):
    path = tiny_model(seed=0)
    return TransformersEngine(
        path, dtype="float32", device="cpu", seed=0, default_args=SamplingArgs(max_tokens=16)
    )


def frozen_lake_task(**workflow_args):
    return Task(
        workflow=FrozenLakeWorkflow,
        raw_task={"seed": 3, "size": 3, "p": 0.8},
        workflow_args={"agent_max_steps": 3, **workflow_args},
        rollout_args=GenerationConfig(temperature=1.0, seed=7),
    )


def test_frozen_lake_concatenated_on_the_tiny_model(engine):
    model = ModelWrapper(engine)
    [exp] = FrozenLakeWorkflow(task=frozen_lake_task(), model=model).run()
    response = exp.tokens[exp.prompt_length :]
    assert exp.action_mask.shape == response.shape == exp.logprobs.shape
    assert exp.info["env_steps"] == 3 and exp.reward in (0.0, 1.0)
    masked = engine.tokenizer.decode(response[exp.action_mask].tolist())
    assert masked.count(IM_END) == 3  # three assistant turns, each closed by <|im_end|>
    assert "Current Observation" not in masked


def test_frozen_lake_step_wise_on_the_tiny_model(engine):
    model = ModelWrapper(engine)
    exps = FrozenLakeWorkflow(task=frozen_lake_task(step_wise=True), model=model).run()
    assert [e.eid.step for e in exps] == [0, 1, 2]
    for exp in exps:
        n = exp.tokens.shape[0] - exp.prompt_length
        assert 1 <= n <= 16 and exp.action_mask.shape == (n,) and exp.logprobs.shape == (n,)
        assert exp.info["finish_reason"] in ("stop", "length") and "env_state_hash" in exp.info
    for before, after in itertools.pairwise(exps):
        assert after.prompt_length > before.tokens.shape[0] - 1


def test_the_conversation_stays_within_max_model_len(engine):
    model = ModelWrapper(engine)
    probe = FrozenLakeWorkflow(task=frozen_lake_task(), model=model)
    first_prompt = probe.system_prompt()
    limit = len(engine.tokenizer(first_prompt)["input_ids"]) + 420  # room for about one turn
    exps = FrozenLakeWorkflow(task=frozen_lake_task(step_wise=True, max_model_len=limit), model=model).run()
    assert exps and all(e.tokens.shape[0] <= limit for e in exps)
    assert exps[-1].info["terminate_reason"] in ("max_model_len", "done")
    [exp] = FrozenLakeWorkflow(task=frozen_lake_task(max_model_len=limit), model=model).run()
    assert exp.tokens.shape[0] <= limit + 1  # the template's newline after the last <|im_end|>


def test_toolcall_on_the_tiny_model(engine):
    row = toolcall_rows(1, seed=1)[0]
    task = Task(
        workflow=ToolCallWorkflow,
        raw_task=row,
        repeat_times=2,
        rollout_args=GenerationConfig(seed=1, max_tokens=4),
    )
    exps = ToolCallWorkflow(task=task, model=ModelWrapper(engine)).run()
    assert [e.eid.run for e in exps] == [0, 1]
    assert [e.reward for e in exps] == [0.0] * 2  # a random model does not call tools
    assert all(e.metrics["accuracy"] == 0.0 for e in exps)
