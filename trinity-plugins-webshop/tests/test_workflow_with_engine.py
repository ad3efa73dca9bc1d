"""The workflow with the real ModelWrapper over the tiny local model: the Experience built by
``convert_messages_to_experience`` masks exactly the assistant turns."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("transformers")
model_wrapper = pytest.importorskip("trinity.explorer.model_wrapper")

from trinity.experience import Experience  # noqa: E402
from trinity.rollout.transformers_engine import TransformersEngine  # noqa: E402
from trinity.testing.tiny_model import IM_END  # noqa: E402
from trinity.workflow import Task  # noqa: E402
from trinity_webshop.catalog import default_catalog  # noqa: E402
from trinity_webshop.workflow import WebShopWorkflow  # noqa: E402


class ScriptedTinyModel(model_wrapper.ModelWrapper):
    """The real wrapper (tokenizer, chat template, logprobs), with scripted replies."""

    def __init__(self, engine, replies):
        super().__init__(engine)
        self.replies = list(replies)

    async def chat_async(self, messages, **rollout_args):
        return [Experience(tokens=[0, 1], prompt_length=1, response_text=self.replies.pop(0))]


@pytest.fixture(scope="module")
def engine(tiny_model):
    path = tiny_model(seed=0)
    return TransformersEngine(path, dtype="float32", device="cpu", seed=0)


def test_tiny_model_experience_masks_exactly_the_assistant_turns(engine):
    catalog = default_catalog()
    gi = next(
        i
        for i in catalog.goal_indices("test")
        if len(catalog.goal(i)["goal_options"]) == 1
        and catalog.goal(i)["asin"] in catalog.search(catalog.goal(i)["instruction_text"])[:10]
    )
    goal = catalog.goal(gi)
    replies = [
        "<action>click[Nowhere]</action>",  # invalid: its error observation is a user turn
        f"<action>search[{goal['instruction_text']}]</action>",
        f"<action>click[{goal['asin']}]</action>",
        f"<action>click[{next(iter(goal['goal_options'].values()))}]</action>",
        "<action>click[Buy Now]</action>",
    ]
    model = ScriptedTinyModel(engine, replies)
    task = Task(workflow=WebShopWorkflow, raw_task={"goal_index": gi}, workflow_args={"max_env_steps": 8})
    [exp] = asyncio.run(WebShopWorkflow(task=task, model=model).run_async())

    assert exp.reward == 1.0 and exp.info["invalid_actions"] == 1 and exp.info["env_steps"] == 5
    tokenizer = engine.tokenizer
    response = exp.tokens[exp.prompt_length :]
    assert exp.action_mask.shape == response.shape and exp.logprobs.shape == response.shape
    # the masked tokens decode to the assistant replies, each closed by <|im_end|>
    assert tokenizer.decode(response[exp.action_mask].tolist()) == "".join(r + IM_END for r in replies)
    # and nothing of the observations is masked: the unmasked part holds every user turn
    unmasked = tokenizer.decode(response[~exp.action_mask].tolist())
    assert unmasked.count("Observation: ") == len(replies) - 1
    assert "Invalid action: there is no button 'Nowhere' on this page" in unmasked
    assert tokenizer.decode(exp.tokens[: exp.prompt_length].tolist()).endswith("<|im_start|>assistant\n")
