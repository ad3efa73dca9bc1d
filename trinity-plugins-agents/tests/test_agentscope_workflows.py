"""The AgentScope ReAct workflows, each run by a scripted model behind the core's real OpenAI
server (``scripted_openai_model``: history on, ``tool_call_parser: hermes``): an oracle that calls
a tool, reads its result and answers reaches reward 1, wrong or aimless agents do not; the
recorded experiences are step-wise (one per model call, exact tokens and masks, ``eid.step``,
the reward on every step) and train with ``multi_step_grpo``'s advantage. Also: registration,
Trinity-RFT's example configs (stored unchanged in upstream_configs/), the error without
AgentScope."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from trinity.config import FormatConfig, GenerationConfig, load_config
from trinity.plugins import get_component
from trinity.workflow import Task
from trinity_agents.agentscope_frozen_lake import UPSTREAM_CLASS_PATH, AgentScopeFrozenLakeWorkflow
from trinity_agents.agentscope_react import (
    AgentScopeMissingError,
    AgentScopeReactMathWorkflow,
    AgentScopeReActWorkflow,
    AgentScopeV0ReactMathWorkflow,
    agentscope_install_hint,
)
from trinity_agents.frozen_lake import oracle_action
from trinity_agents.scripted import scripted_model, scripted_openai_model

UPSTREAM = Path(__file__).parent / "upstream_configs"
END = "<|im_end|>"

GSM8K_ROW = {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
             "answer": "In May she sold 48/2 = 24 clips.\nAltogether 48+24 = 72.\n#### 72"}  # fmt: skip
DAPO_ROW = {"prompt": "What is the product of 3, 7 and 11?", "solution": "231"}


def gsm8k_task(workflow=AgentScopeReActWorkflow, row=GSM8K_ROW, **workflow_args):
    return Task(
        workflow=workflow,
        raw_task=dict(row),
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(temperature=1.0),
        workflow_args=workflow_args,
    )


def dapo_task(workflow=AgentScopeReactMathWorkflow, **workflow_args):
    return Task(
        workflow=workflow,
        raw_task=dict(DAPO_ROW),
        format_args=FormatConfig(prompt_key="prompt", response_key="solution"),
        workflow_args=workflow_args,
    )


def tool_results(messages):
    return [m["content"] for m in messages if m["role"] == "tool"]


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def calculator_oracle(messages):
    """Asks the calculator, then answers with its result (text + generate_response)."""
    results = tool_results(messages)
    if not results:
        return "Let me compute.\n" + call("calculator", expression="48 + 48 / 2")
    value = results[-1]
    return f"The answer is \\boxed{{{value}}}.\n" + call("generate_response", result=f"\\boxed{{{value}}}")


def python_oracle(messages):
    """Runs Python in the sandbox, reads stdout, answers."""
    results = tool_results(messages)
    if not results:
        return call("execute_python_code", code="print(3 * 7 * 11)")
    value = re.search(r"<stdout>(.*?)</stdout>", results[-1], re.S).group(1).strip()
    return f"So \\boxed{{{value}}}.\n" + call("generate_response", result=f"\\boxed{{{value}}}")


def wrong_answer(messages):
    return "Easy: \\boxed{71}.\n" + call("generate_response", result="\\boxed{71}")


def aimless(messages):
    return "Hmm, let me think about it some more."


@pytest.fixture
def agentscope():
    return pytest.importorskip(
        "agentscope", reason="the AgentScope workflows need the extra: " + agentscope_install_hint()
    )


@pytest.fixture
def serve():
    models = []

    def make(policy):
        model = scripted_openai_model(policy)
        models.append(model)
        return model

    yield make
    for model in models:
        model.close()


def assert_step_wise(model, exps, *, reward, run):
    """One Experience per model call, in order, exactly as the engine sampled it."""
    calls = model.engine.calls
    assert len(exps) == len(calls) > 0
    engine = model.engine
    for i, (exp, c) in enumerate(zip(exps, calls)):
        assert (exp.eid.run, exp.eid.step) == (run, i)
        assert exp.reward == reward
        # the prompt is the call's conversation (tools included) as templated and tokenised
        prompt = engine.encode(engine.apply_chat_template(c["messages"], tools=c.get("tools")))
        assert exp.tokens[: exp.prompt_length].tolist() == prompt
        # the response: the reply's tokens and the end-of-turn token, all of them in the mask
        response = exp.tokens[exp.prompt_length :].tolist()
        assert engine.tokenizer.decode(response) == exp.response_text + END
        assert exp.action_mask.dtype == torch.bool and exp.action_mask.shape == (len(response),)
        assert bool(exp.action_mask.all())
        assert exp.logprobs.shape == (len(response),)
        assert exp.info["step"] == i and isinstance(exp.info["env_state_hash"], str)
    step_rewards = [e.info["step_reward"] for e in exps]
    assert sum(step_rewards) == reward and all(r == 0 for r in step_rewards[:-1])
    assert {e.eid.task for e in exps} == {exps[0].eid.task}


# -- math workflows --------------------------------------------------------------------------


def test_gsm8k_oracle_uses_the_calculator_and_reaches_reward_1(agentscope, serve):
    model = serve(calculator_oracle)
    workflow = AgentScopeReActWorkflow(task=gsm8k_task(), model=model)
    workflow.set_repeat_times(1, 3)
    exps = workflow.run()
    assert len(exps) == 2  # the tool call, then the answer
    assert_step_wise(model, exps, reward=1.0, run=3)
    calls = model.engine.calls
    # the agent sent the tools and read the calculator's result back to the model
    assert [t["function"]["name"] for t in calls[0]["tools"]] == [
        "calculator", "execute_python_code", "generate_response"]  # fmt: skip
    assert calls[0]["messages"][1] == {
        **calls[0]["messages"][1],
        "role": "user",
        "content": GSM8K_ROW["question"],
    }
    assert tool_results(calls[1]["messages"]) == ["72"]
    assert exps[0].info["tool_calls"][0]["function"]["name"] == "calculator"
    last = exps[-1]
    assert last.info["final_answer"] == "72" and last.info["reference_answer"] == "72"
    assert last.info["structured_output"] is True and last.metrics["accuracy"] == 1.0
    assert last.metrics["tool_call_count"] == 2.0 and last.metrics["model_calls"] == 2.0
    assert "accuracy" not in (exps[0].metrics or {})  # episode numbers once, on the last step


def test_dapo_oracle_runs_python_in_the_sandbox(agentscope, serve):
    model = serve(python_oracle)
    exps = AgentScopeReactMathWorkflow(task=dapo_task(), model=model).run()
    assert_step_wise(model, exps, reward=1.0, run=0)
    [result] = tool_results(model.engine.calls[1]["messages"])
    assert result.startswith("<returncode>0</returncode><stdout>231")


def test_wrong_and_aimless_agents_get_no_reward(agentscope, serve):
    model = serve(wrong_answer)
    exps = AgentScopeReActWorkflow(task=gsm8k_task(), model=model).run()
    assert len(exps) == 1 and exps[0].reward == 0.0 and exps[0].info["final_answer"] == "71"
    assert_step_wise(model, exps, reward=0.0, run=0)

    # Never calls generate_response: reminded each iteration, then AgentScope's summary call.
    model = serve(aimless)
    exps = AgentScopeReActWorkflow(task=gsm8k_task(max_iters=2), model=model).run()
    assert len(exps) == 3 and {e.reward for e in exps} == {0.0}
    assert exps[-1].info["max_iters_reached"] is True and exps[-1].info["structured_output"] is False
    assert_step_wise(model, exps, reward=0.0, run=0)


def test_v0_workflow_answers_in_text_without_structured_output(agentscope, serve):
    def oracle(messages):
        results = tool_results(messages)
        return call("calculator", expression="48*1.5") if not results else f"It is \\boxed{{{results[-1]}}}."

    model = serve(oracle)
    exps = AgentScopeV0ReactMathWorkflow(task=gsm8k_task(AgentScopeV0ReactMathWorkflow), model=model).run()
    assert_step_wise(model, exps, reward=1.0, run=0)
    assert [t["function"]["name"] for t in model.engine.calls[0]["tools"]] == [
        "calculator",
        "execute_python_code",
    ]
    assert exps[-1].info["structured_output"] is False

    model = serve(lambda messages: "It is \\boxed{70}.")
    [exp] = AgentScopeV0ReactMathWorkflow(task=gsm8k_task(AgentScopeV0ReactMathWorkflow), model=model).run()
    assert exp.reward == 0.0


def test_reuse_clears_a_previous_attempts_history_and_rewards_group_for_multi_step_grpo(agentscope, serve):
    from trinity.trainer.batch import build_batch
    from trinity_algos.advantage.step_wise import StepWiseGRPOAdvantageFn

    model = serve(calculator_oracle)
    model.chat([{"role": "user", "content": "left over from a failed attempt"}])
    workflow = AgentScopeReActWorkflow(task=gsm8k_task(), model=model)
    good = workflow.run()
    assert len(good) == 2 and all("left over" not in str(e.messages) for e in good)
    model.engine.policy = wrong_answer
    workflow.reset(gsm8k_task())
    workflow.set_repeat_times(1, 1)
    bad = workflow.run()
    assert [e.eid.run for e in good + bad] == [0, 0, 1]

    batch = build_batch(good + bad)
    batch, metrics = StepWiseGRPOAdvantageFn()(batch.to_dict())
    adv = batch["advantages"]
    # the good episode's two steps share one positive advantage, the bad one's is negative
    assert adv[0][batch["action_mask"][0].bool()].unique().numel() == 1
    assert adv[0].max() > 0 and adv[1].max() > 0 and adv[2].min() < 0
    assert metrics["episode_count"] == 2.0


def test_workflow_args_are_checked():
    with pytest.raises(ValueError, match="tools"):
        AgentScopeReActWorkflow(task=gsm8k_task(tools=["browser"]), model=None)
    with pytest.raises(ValueError, match="type"):
        AgentScopeReActWorkflow(task=gsm8k_task(type="math500"), model=None)
    with pytest.raises(ValueError, match="max_iters"):
        AgentScopeReActWorkflow(task=gsm8k_task(max_iters=0), model=None)
    with pytest.raises(ValueError, match="'question'"):
        AgentScopeReActWorkflow(task=gsm8k_task(row={"answer": "#### 1"}), model=None)
    workflow = AgentScopeReactMathWorkflow(task=dapo_task(tools="calculator", python_timeout=2), model=None)
    assert workflow.tools == ["calculator"] and workflow.python_timeout == 2.0


def test_a_model_without_history_or_tool_parser_is_refused_with_the_config_keys(agentscope):
    with pytest.raises(RuntimeError, match="enable_history: true"):
        AgentScopeReActWorkflow(task=gsm8k_task(), model=scripted_model(aimless)).run()
    model = scripted_model(aimless, wrapper_kwargs={"enable_history": True})
    with pytest.raises(RuntimeError, match="tool_call_parser: hermes"):
        AgentScopeReActWorkflow(task=gsm8k_task(), model=model).run()


# -- FrozenLake ------------------------------------------------------------------------------


def lake_task(**workflow_args):
    args = {"env_max_steps": 8, "agent_max_steps": 10, "is_slippery": False, **workflow_args}
    return Task(
        workflow=AgentScopeFrozenLakeWorkflow, raw_task={"seed": 1, "size": 4, "p": 0.8}, workflow_args=args
    )


def lake_oracle(messages):
    return f"Shortest path.\n```{oracle_action(messages[-1]['content'])}```"


def test_frozen_lake_agent_oracle_reaches_the_goal(agentscope, serve):
    model = serve(lake_oracle)
    exps = AgentScopeFrozenLakeWorkflow(task=lake_task(), model=model).run()
    assert_step_wise(model, exps, reward=1.0, run=0)
    # one model call per move; the agent keeps its memory: move k sees k earlier replies
    assert [e.info["env_step"] for e in exps] == list(range(len(exps)))
    calls = model.engine.calls
    assert [sum(m["role"] == "assistant" for m in c["messages"]) for c in calls] == list(range(len(calls)))
    assert calls[0]["messages"][0]["role"] == "system" and "tools" not in calls[0]
    assert calls[0]["messages"][1]["content"].startswith("Current Observation (0):")
    last = exps[-1]
    assert last.info["success"] is True and last.info["terminate_reason"] == "done"
    assert last.metrics["env_steps"] == len(exps) and last.info["action_valid"] is True
    assert len({e.info["env_state_hash"] for e in exps}) == len(exps)


def test_frozen_lake_agent_that_never_moves_gets_nothing(agentscope, serve):
    model = serve(lambda messages: "I am not sure.")
    exps = AgentScopeFrozenLakeWorkflow(task=lake_task(agent_max_steps=3), model=model).run()
    assert len(exps) == 3 and {e.reward for e in exps} == {0.0}
    assert exps[-1].info["terminate_reason"] == "max_turns" and exps[-1].info["invalid_actions"] == 3
    assert "Your last response was invalid" in model.engine.calls[1]["messages"][-1]["content"]
    assert_step_wise(model, exps, reward=0.0, run=0)


# -- registration, configs, missing AgentScope -----------------------------------------------


def test_registered_names_resolve_before_the_class_path_import():
    assert get_component("workflow", "agentscope_react_workflow") is AgentScopeReActWorkflow
    assert get_component("workflow", "agentscope_react_math_workflow") is AgentScopeReactMathWorkflow
    assert get_component("workflow", "agentscopev0_react_math_workflow") is AgentScopeV0ReactMathWorkflow
    assert get_component("workflow", "agentscope_frozen_lake_workflow") is AgentScopeFrozenLakeWorkflow
    # Trinity-RFT's class path: no module "examples.agentscope_frozenlake" exists here, so only
    # the registered alias can resolve it.
    assert "examples.agentscope_frozenlake" not in sys.modules
    assert get_component("workflow", UPSTREAM_CLASS_PATH) is AgentScopeFrozenLakeWorkflow
    assert "examples.agentscope_frozenlake" not in sys.modules


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "data"))
    return tmp_path


@pytest.mark.parametrize(
    ("name", "workflow"),
    [
        ("gsm8k.yaml", AgentScopeReActWorkflow),
        ("agentscopev1_tool_react_dapo.yaml", AgentScopeReactMathWorkflow),
        ("agentscopev0_tool_react_gsm8k.yaml", AgentScopeV0ReactMathWorkflow),
        ("frozenlake_agent.yaml", AgentScopeFrozenLakeWorkflow),
    ],
)
def test_upstream_configs_load_unchanged(upstream_env, name, workflow):
    config = load_config(UPSTREAM / name)
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is workflow
    model = config.explorer.rollout_model
    assert model.enable_openai_api and model.enable_history and model.tool_call_parser == "hermes"
    assert config.algorithm.algorithm_type == "multi_step_grpo"


def test_frozenlake_agent_config_reads_its_rows_into_tasks(upstream_env):
    from trinity.buffer.taskset import TasksetReader
    from trinity_agents.tasks import main as tasks_main

    tasks_main(["frozen_lake", str(upstream_env / "data"), "--train", "3", "--test", "1"])
    config = load_config(UPSTREAM / "frozenlake_agent.yaml")
    reader = TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer)
    assert len(reader) == 3 and not reader.skipped
    task = reader.read_batch(1)[0]
    assert task.workflow is AgentScopeFrozenLakeWorkflow and task.repeat_times == 16
    workflow = AgentScopeFrozenLakeWorkflow(task=task, model=None)
    assert (workflow.game.max_turns, workflow.game.env_max_steps, workflow.game.is_slippery) == (10, 8, False)


def test_without_agentscope_registration_works_and_running_fails_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "agentscope", None)  # "import agentscope" raises ImportError
    monkeypatch.setitem(sys.modules, "agentscope.agent", None)
    assert get_component("workflow", "agentscope_react_workflow") is AgentScopeReActWorkflow
    for workflow in (
        AgentScopeReActWorkflow(task=gsm8k_task(), model=None),
        AgentScopeFrozenLakeWorkflow(task=lake_task(), model=None),
    ):
        with pytest.raises(AgentScopeMissingError) as info:
            workflow.run()
        message = str(info.value)
        assert "\n" not in message and message.endswith(agentscope_install_hint())
        assert "trinity-plugins-agents[agentscope]'" in message
        assert message.startswith(workflow.registered_name + " needs AgentScope 1.x")
