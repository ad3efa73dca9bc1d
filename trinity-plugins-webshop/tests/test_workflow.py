"""webshop_workflow driven by a scripted stand-in for the ModelWrapper (real Experiences)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from trinity.experience import Experience
from trinity.workflow import Task
from trinity_webshop.catalog import default_catalog
from trinity_webshop.workflow import SYSTEM_PROMPT, WebShopWorkflow, extract_action


class ScriptedModel:
    """Replies from a fixed script; tokenises a conversation one token per character, with a
    role token before each message, and marks the assistant characters in ``action_mask``."""

    model_version = 0

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls: list[dict] = []

    async def chat_async(self, messages, **rollout_args):
        self.calls.append({"messages": [dict(m) for m in messages], "args": rollout_args})
        reply = self.replies.pop(0) if self.replies else "<action>click[Back to Search]</action>"
        await asyncio.sleep(0)  # let concurrent episodes interleave
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, response_text=reply)]

    def convert_messages_to_experience(self, messages):
        tokens, mask = [], []
        for message in messages:
            tokens.append({"system": 1, "user": 2, "assistant": 3}[message["role"]])
            mask.append(0)
            tokens += [ord(c) for c in message["content"]]
            mask += [int(message["role"] == "assistant")] * len(message["content"])
        start = mask.index(1)
        return Experience(
            tokens=torch.tensor(tokens),
            prompt_length=start,
            action_mask=torch.tensor(mask[start:], dtype=torch.bool),
        )


def make_task(goal_index=None, **workflow_args):
    raw = {} if goal_index is None else {"goal_index": goal_index}
    return Task(workflow=WebShopWorkflow, raw_task=raw, workflow_args=workflow_args, repeat_times=1)


def oracle_script(goal_index, think=True):
    """Replies that solve ``goal_index`` when its target is on the first results page."""
    goal = default_catalog().goal(goal_index)
    actions = [f"search[{goal['instruction_text']}]", f"click[{goal['asin']}]"]
    actions += [f"click[{v}]" for v in goal["goal_options"].values()]
    actions.append("click[Buy Now]")
    prefix = "<think>Next step.</think>" if think else ""
    return [f"{prefix}<action>{a}</action>" for a in actions]


def first_page_goal(n_options=None):
    catalog = default_catalog()
    for i in catalog.goal_indices("test"):
        goal = catalog.goal(i)
        if n_options is not None and len(goal["goal_options"]) != n_options:
            continue
        if goal["asin"] in catalog.search(goal["instruction_text"])[:10]:
            return i
    raise AssertionError("no suitable goal")


def run(workflow):
    return asyncio.run(workflow.run_async())


def test_extract_action():
    assert extract_action("<think>hm</think><action> click[Buy Now] </action>") == "click[Buy Now]"
    assert extract_action("<ACTION>search[a]</ACTION><action>click[b]</action>") == "search[a]"
    assert extract_action("click[Buy Now]") == ""
    assert extract_action("<action>search[a\nb]</action>") == "search[a\nb]"


def test_flags_and_registration():
    from trinity.plugins import get_component
    from trinity.testing import check_workflow, isolated_plugin_manager, registered_plugin
    from trinity_webshop import hooks

    check_workflow(WebShopWorkflow)
    assert (WebShopWorkflow.is_async, WebShopWorkflow.can_reset) == (True, True)
    with isolated_plugin_manager(), registered_plugin(hooks, "webshop"):
        assert get_component("workflow", "webshop_workflow") is WebShopWorkflow


def test_oracle_episode_gives_reward_one_and_masks_assistant_turns():
    gi = first_page_goal(n_options=2)
    replies = oracle_script(gi)
    model = ScriptedModel(replies)
    task = make_task(gi)
    task.rollout_args.temperature = 0.7
    [exp] = run(WebShopWorkflow(task=task, model=model))

    assert exp.reward == 1.0
    assert exp.info["env_steps"] == 5 and exp.info["done"] is True and exp.info["invalid_actions"] == 0
    assert exp.info["goal_index"] == gi and exp.info["session_id"].startswith(f"goal-{gi}-")
    assert exp.metrics["success"] == 1.0 and exp.metrics["searches"] == 1.0 and exp.metrics["clicks"] == 4.0
    # the prompt: system protocol + the search page; the conversation ends on the purchase
    first = model.calls[0]["messages"]
    assert first[0] == {"role": "system", "content": SYSTEM_PROMPT.format(max_steps=15)}
    assert first[1]["content"].startswith("Observation: WebShop [SEP] Instruction:")
    assert model.calls[0]["args"]["n"] == 1 and model.calls[0]["args"]["temperature"] == 0.7
    assert len(model.calls) == 5
    # action_mask covers exactly the assistant characters
    response = exp.tokens[exp.prompt_length :]
    assert "".join(chr(t) for t in response[exp.action_mask].tolist()) == "".join(replies)
    assert int(exp.action_mask.sum()) == sum(len(r) for r in replies)


def test_invalid_actions_are_answered_and_counted_until_the_step_limit():
    replies = ["I will buy it now.", "<action>click[Buy Now]</action>", "<action>search[]</action>"]
    model = ScriptedModel(replies)
    [exp] = run(WebShopWorkflow(task=make_task(0, max_env_steps=3, no_purchase_reward=-0.1), model=model))
    assert exp.reward == -0.1
    assert exp.info == {**exp.info, "env_steps": 3, "done": False, "invalid_actions": 3}
    assert exp.metrics["truncated"] == 1.0 and exp.metrics["invalid_action_ratio"] == 1.0
    observations = [m["content"] for m in model.calls[2]["messages"] if m["role"] == "user"]
    assert observations[1].startswith("Observation: Invalid action: '' is not an action")
    assert "there is no button 'Buy Now' on this page" in observations[2]
    assert len(model.calls) == 3  # max_env_steps turns, no more


def test_default_no_purchase_reward_is_zero():
    [exp] = run(WebShopWorkflow(task=make_task(1, max_env_steps=2), model=ScriptedModel([])))
    assert exp.reward == 0.0 and exp.info["env_steps"] == 2


def test_reset_and_concurrent_episodes_on_one_instance():
    a, b = first_page_goal(n_options=1), first_page_goal(n_options=2)
    workflow = WebShopWorkflow(task=make_task(a), model=ScriptedModel(oracle_script(a)))
    assert run(workflow)[0].reward == 1.0

    workflow.reset(make_task(b))
    script = oracle_script(b, think=False)

    class PerEpisode(ScriptedModel):
        """Replies by turn number, so concurrent conversations each follow the script."""

        async def chat_async(self, messages, **rollout_args):
            turn = sum(m["role"] == "assistant" for m in messages)
            await asyncio.sleep(0)
            return [Experience(tokens=torch.tensor([1, 2]), prompt_length=1, response_text=script[turn])]

    workflow.model = PerEpisode([])

    async def three():
        return await asyncio.gather(*(workflow.run_async() for _ in range(3)))

    results = [e for [e] in asyncio.run(three())]
    assert [e.reward for e in results] == [1.0, 1.0, 1.0]
    assert len({e.info["session_id"] for e in results}) == 3
    assert all(e.info["goal_index"] == b and e.info["env_steps"] == 5 for e in results)


def test_goal_index_from_the_prompt_column_and_missing_index():
    task = Task(workflow=WebShopWorkflow, raw_task={"prompt": "12"})
    assert WebShopWorkflow(task=task, model=ScriptedModel([])).goal_index == 12
    with pytest.raises(ValueError, match=r"has no goal index: expected an integer in column 'goal_index'"):
        WebShopWorkflow(
            task=Task(workflow=WebShopWorkflow, raw_task={"question": "x"}), model=ScriptedModel([])
        )


def test_env_choice_errors():
    with pytest.raises(ValueError, match=r"workflow_args.env must be one of \['builtin', 'webshop'\]"):
        WebShopWorkflow(task=make_task(0, env="amazon"), model=ScriptedModel([]))
    if importlib.util.find_spec("web_agent_site") is None:
        with pytest.raises(
            ImportError, match=r"needs the original WebShop package .*setup\.sh.*env: builtin"
        ):
            WebShopWorkflow(task=make_task(0, env="webshop"), model=ScriptedModel([]))
    with pytest.raises(ValueError, match="max_env_steps must be at least 1"):
        WebShopWorkflow(task=make_task(0, max_env_steps=0), model=ScriptedModel([]))
