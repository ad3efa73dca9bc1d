"""Scripted policies (``policy(messages) -> reply``) for the workflows, and reference numbers.

- FrozenLake: :func:`frozen_lake_oracle` walks a shortest hole-free path (reward 1 on every
  non-slippery map, whose goal is always reachable); :func:`frozen_lake_random` moves at random.
- Tool calls: :func:`toolcall_oracle` answers a task's gold calls in the required format;
  :func:`toolcall_random` calls a random offered function with made-up arguments.
- Email search (hermes tool calls, for ``email_search_workflow``'s AgentScope agent):
  :func:`email_search_oracle` searches for the source email, reads it and answers with it;
  :func:`email_search_random` searches a random word, reads a random hit and answers with a
  random word of it (or ``I don't know``); :func:`text_judge` is a judge model's policy that
  accepts an answer by :func:`~trinity_agents.email_search.answers_match`.

``python -m trinity_agents.agents [--tasks N] [--seed S] [--email-search]`` plays them through
the workflows (with :func:`~trinity_agents.scripted.scripted_model`) and prints each policy's
mean reward (``--email-search``: also the email search policies, which need the ``agentscope``
extra; a generated mailbox, the text judge as the auxiliary model).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
from collections.abc import Callable
from pathlib import Path
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


def tool_call(name: str, **arguments: Any) -> str:
    """A hermes tool call block (what ``tool_call_parser: hermes`` reads)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """The tool answers in a conversation, in order."""
    return [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]


def _subject_words(subject: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z0-9]+", subject) if w.lower() != "re"]


def email_search_oracle(row: dict[str, Any], db_path: str | Path) -> Policy:
    """A policy that searches the row's inbox for its source email's subject words, reads the
    source email (when the search found it) and answers the row's answer with that source."""
    from trinity_agents.email_search import open_database

    gold = row["message_ids"][0]
    email = open_database(db_path).read(gold)
    if email is None:
        raise ValueError(f"message {gold} of task {row.get('id')} is not in {db_path}")
    keywords = _subject_words(email["subject"])

    def policy(messages: list[dict[str, Any]]) -> str:
        results = tool_results(messages)
        if not results:
            return "I will search for the thread.\n" + tool_call(
                "search_emails",
                inbox_address=row["inbox_address"],
                query_date=row["query_date"],
                keywords=keywords,
            )
        if len(results) == 1:
            if gold not in results[0]:
                return "Nothing found.\n" + tool_call("generate_response", answer="I don't know", sources=[])
            return "The thread is there; reading the reply.\n" + tool_call("read_email", message_id=gold)
        return f"The answer is {row['answer']}.\n" + tool_call(
            "generate_response", answer=row["answer"], sources=[gold]
        )

    return policy


def email_search_random(seed: int = 0) -> Policy:
    """A policy that searches one random word of the question, reads a random hit and answers
    with a random word of what it read, or ``I don't know`` (seeded)."""
    rng = random.Random(seed)

    def policy(messages: list[dict[str, Any]]) -> str:
        system = messages[0]["content"]
        inbox = re.search(r"email address is (\S+)", system)
        today = re.search(r"date is (\S+)", system)
        results = tool_results(messages)
        if not results:
            words = re.findall(r"[A-Za-z]{3,}", messages[1]["content"]) or ["meeting"]
            return tool_call(
                "search_emails",
                inbox_address=inbox.group(1) if inbox else "",
                query_date=today.group(1) if today else "",
                keywords=[rng.choice(words)],
            )
        try:
            hits = json.loads(results[0])
        except ValueError:
            hits = []
        if len(results) == 1 and hits:
            return tool_call("read_email", message_id=rng.choice(hits)["message_id"])
        if not hits or rng.random() < 0.25:
            return tool_call("generate_response", answer="I don't know", sources=[])
        words = re.findall(r"[A-Za-z0-9$,./]+", results[-1]) or ["nothing"]
        source = rng.choice(hits)["message_id"]
        return tool_call("generate_response", answer=rng.choice(words), sources=[source])

    return policy


def text_judge(messages: list[dict[str, Any]]) -> str:
    """A judge model's policy: ``true`` when the AI answer matches the reference answer
    (:func:`~trinity_agents.email_search.answers_match`), else ``false``."""
    from trinity_agents.email_search import answers_match

    text = messages[-1]["content"]
    reference = re.search(r"^Reference answer: (.*)$", text, re.M)
    answer = re.search(r"^AI answer: (.*)$", text, re.M)
    if not reference or not answer:
        return "false"
    return "true" if answers_match(answer.group(1), reference.group(1)) else "false"


def email_search_mean_rewards(tasks: int = 20, seed: int = 0) -> dict[str, float]:
    """Mean reward of the email search policies on ``tasks`` generated test questions (the text
    judge as the auxiliary model); needs the ``agentscope`` extra."""
    import tempfile

    from trinity.config import FormatConfig
    from trinity.workflow import Task
    from trinity_agents.email_inbox import write_email_search
    from trinity_agents.email_search import EmailSearchWorkflow
    from trinity_agents.scripted import scripted_openai_model

    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db, _ = write_email_search(tmp, train=0, test=tasks, seed=seed)
        rows = [json.loads(line) for line in (Path(tmp) / "test.jsonl").read_text().splitlines()]
        judge = scripted_openai_model(text_judge)
        try:
            for i, row in enumerate(rows):
                for name, policy in (
                    ("email_search/oracle", email_search_oracle(row, db)),
                    ("email_search/random", email_search_random(i)),
                ):
                    model = scripted_openai_model(policy)
                    task = Task(
                        workflow=EmailSearchWorkflow,
                        raw_task=row,
                        format_args=FormatConfig(prompt_key="question", response_key="answer"),
                        workflow_args={"max_turns": 10, "db_path": str(db)},
                    )
                    try:
                        exps = EmailSearchWorkflow(task=task, model=model, auxiliary_models=[judge]).run()
                    finally:
                        model.close()
                    out.setdefault(name, []).append(float(exps[-1].reward or 0.0))
        finally:
            judge.close()
    return {name: statistics.fmean(values) for name, values in out.items()}


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
    parser.add_argument("--email-search", action="store_true", help="also the email search policies")
    args = parser.parse_args(argv)
    results = mean_rewards(args.tasks, args.seed)
    if args.email_search:
        results.update(email_search_mean_rewards(args.tasks, args.seed))
    for name, value in results.items():
        print(f"{name:<20} mean reward {value:.4f}")


if __name__ == "__main__":
    main()
