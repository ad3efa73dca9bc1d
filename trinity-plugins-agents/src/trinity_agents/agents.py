"""Scripted policies (``policy(messages) -> reply``) for the workflows, and reference numbers.

- FrozenLake: :func:`frozen_lake_oracle` walks a shortest hole-free path (reward 1 on every
  non-slippery map, whose goal is always reachable); :func:`frozen_lake_random` moves at random.
- Tool calls: :func:`toolcall_oracle` answers a task's gold calls in the required format;
  :func:`toolcall_random` calls a random offered function with made-up arguments.

``python -m trinity_agents.agents [--tasks N] [--seed S]`` plays them through the workflows
(with :func:`~trinity_agents.scripted.scripted_model`) and prints each policy's mean reward.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable
from typing import Any

from trinity_agents.frozen_lake import GYM_ACTIONS, oracle_action

Policy = Callable[[list[dict[str, Any]]], str]


def frozen_lake_oracle(messages: list[dict[str, Any]]) -> str:
    """Reply with the first move of a shortest safe path on the last observation's grid."""
    action = oracle_action(messages[-1]["content"])
    return f"<think>The shortest safe path starts with {action}.</think>\n```{action}```"


def frozen_lake_random(seed: int = 0) -> Policy:
    """A policy moving uniformly at random (seeded)."""
    rng = random.Random(seed)

    def policy(messages: list[dict[str, Any]]) -> str:
        return f"```{rng.choice(sorted(GYM_ACTIONS))}```"

    return policy


def toolcall_oracle(answer: Any) -> Policy:
    """A policy answering exactly ``answer`` (the task's gold calls, a list or its JSON)."""
    calls = json.loads(answer) if isinstance(answer, str) else answer

    def policy(messages: list[dict[str, Any]]) -> str:
        return f"<think>These calls fulfil the request.</think>\n<tool_call>{json.dumps(calls)}</tool_call>"

    return policy


def toolcall_random(seed: int = 0) -> Policy:
    """A policy calling one random offered function with one made-up argument (seeded)."""
    rng = random.Random(seed)

    def policy(messages: list[dict[str, Any]]) -> str:
        system = messages[0]["content"]
        tools = [
            json.loads(line)["function"]
            for line in system.split("<tools>\n", 1)[1].split("\n</tools>")[0].splitlines()
        ]
        tool = rng.choice(tools)
        arg = rng.choice(sorted(tool.get("parameters", {}).get("properties", {})) or ["x"])
        call = {"name": tool["name"], "arguments": {arg: rng.choice(["a", 1, "unknown"])}}
        return f"<think>Maybe this one.</think><tool_call>[{json.dumps(call)}]</tool_call>"

    return policy


def mean_rewards(tasks: int = 100, seed: int = 0) -> dict[str, float]:
    """Mean reward of each scripted policy over ``tasks`` generated test tasks of each workflow."""
    from trinity.workflow import Task
    from trinity_agents.frozen_lake import FrozenLakeWorkflow
    from trinity_agents.scripted import scripted_model
    from trinity_agents.tasks import frozen_lake_rows, toolcall_rows
    from trinity_agents.toolcall import ToolCallWorkflow

    out: dict[str, list[float]] = {}
    for i, row in enumerate(frozen_lake_rows(tasks, seed)):
        for name, policy in (
            ("frozen_lake/oracle", frozen_lake_oracle),
            ("frozen_lake/random", frozen_lake_random(i)),
        ):
            task = Task(workflow=FrozenLakeWorkflow, raw_task=row)
            [exp] = FrozenLakeWorkflow(task=task, model=scripted_model(policy)).run()
            out.setdefault(name, []).append(float(exp.reward or 0.0))
    for i, row in enumerate(toolcall_rows(tasks, seed)):
        for name, policy in (
            ("toolcall/oracle", toolcall_oracle(row["answer"])),
            ("toolcall/random", toolcall_random(i)),
        ):
            task = Task(workflow=ToolCallWorkflow, raw_task=row)
            [exp] = ToolCallWorkflow(task=task, model=scripted_model(policy)).run()
            out.setdefault(name, []).append(float(exp.reward or 0.0))
    return {name: statistics.fmean(values) for name, values in out.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trinity_agents.agents", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, value in mean_rewards(args.tasks, args.seed).items():
        print(f"{name:<20} mean reward {value:.4f}")


if __name__ == "__main__":
    main()
