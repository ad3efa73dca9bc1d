"""The worked example of docs/plugins.md ("Writing a multi-turn (agentic) workflow") and of this
package's README is the same code, and it works: a bisecting player wins, in both shapes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trinity.testing import check_component
from trinity.workflow import Task
from trinity_agents.scripted import scripted_model

PACKAGE = Path(__file__).resolve().parents[1]
DOCS = PACKAGE.parent / "docs" / "plugins.md"
SECTION = "## Writing a multi-turn (agentic) workflow"


def example_blocks(text: str) -> tuple[str, str]:
    code = re.search(
        r"```python\n(from trinity import hookimpl\n.*?class GuessNumberWorkflow.*?)```", text, re.S
    )
    config = re.search(r"```yaml\n(buffer:\n.*?guess_number_workflow\n)```", text, re.S)
    assert code and config, "the worked example is missing"
    return code.group(1), config.group(1)


@pytest.fixture(scope="module")
def example():
    docs = DOCS.read_text()
    assert docs.count(SECTION) == 1
    code, config = example_blocks(docs.split(SECTION, 1)[1])
    assert example_blocks((PACKAGE / "README.md").read_text()) == (code, config)
    namespace: dict = {}
    exec(compile(code, "worked_example.py", "exec"), namespace)
    return namespace, yaml.safe_load(config)


def bisect(messages):
    low, high = 1, 100
    for message in messages:
        if message["role"] == "assistant":
            guess = int(message["content"])
        elif message["content"] == "Higher.":
            low = guess + 1
        elif message["content"] == "Lower.":
            high = guess - 1
    return str((low + high) // 2)


def test_the_worked_example_registers_and_conforms(example):
    namespace, _ = example
    registered = {}
    namespace["register_workflows"](register=lambda name, cls: registered.setdefault(name, cls))
    assert registered == {"guess_number_workflow": namespace["GuessNumberWorkflow"]}
    check_component("workflow", namespace["GuessNumberWorkflow"])


@pytest.mark.parametrize("secret", [1, 37, 50, 100])
def test_the_worked_example_plays_both_shapes(example, secret):
    namespace, config = example
    cls = namespace["GuessNumberWorkflow"]
    args = dict(config["buffer"]["explorer_input"]["taskset"]["workflow_args"])
    args["max_model_len"] = 4096  # the config interpolates ${model.max_model_len}
    assert args["step_wise"] is True

    steps = cls(
        task=Task(workflow=cls, raw_task={"secret": secret}, workflow_args=args), model=scripted_model(bisect)
    ).run()
    assert 1 <= len(steps) <= 7 and [e.eid.step for e in steps] == list(range(len(steps)))
    assert [e.info["step_reward"] for e in steps] == [0.0] * (len(steps) - 1) + [1.0]
    assert steps[-1].info["invalid_guesses"] == 0 and steps[-1].info["terminate_reason"] == "done"

    concatenated = {**args, "step_wise": False}
    [exp] = cls(
        task=Task(workflow=cls, raw_task={"secret": secret}, workflow_args=concatenated),
        model=scripted_model(bisect),
    ).run()
    assert exp.reward == 1.0 and exp.info["env_steps"] == len(steps)


def test_the_snippet_in_the_docs(example):
    namespace, _ = example
    cls = namespace["GuessNumberWorkflow"]
    task = Task(workflow=cls, raw_task={"secret": 42})
    [exp] = cls(task=task, model=scripted_model(lambda messages: "50")).run()
    assert exp.reward == 0.0 and exp.info["terminate_reason"] == "max_turns" and exp.info["env_steps"] == 8
    [exp] = cls(task=task, model=scripted_model(lambda messages: "fifty")).run()
    assert exp.info["invalid_guesses"] == 8
