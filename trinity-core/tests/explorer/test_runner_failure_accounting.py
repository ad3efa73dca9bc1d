"""Every task that gives nothing to train on is counted in exactly one failure metric.

The scenario of issue 34: a workflow that returns garbage on 3 rows (a list of non-Experiences,
a string, ``None``), raises on 2 and hangs on 1, next to rows that work. ``failed_tasks``,
``timeout_tasks`` and ``empty_tasks`` are disjoint and add up to the tasks that gave nothing
usable, and the console line (``failure_report``, printed by the launcher) says the same.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from trinity import hookimpl
from trinity.buffer.base import WriterBase
from trinity.config import Config
from trinity.experience import Experience
from trinity.explorer.explorer import FAILURES_KEY, Explorer
from trinity.explorer.runner import OUTCOMES, RunnerPool, failure_report, summarize_results
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.workflow import Task, Workflow

# By row: what the workflow does, and how the task must be counted.
ROWS = [
    ("non-experiences", "empty"),  # a list, but nothing in it can be trained on
    ("string", "failed"),
    ("none", "failed"),
    ("raise", "failed"),
    ("raise", "failed"),
    ("hang", "timeout"),
    ("works", "ok"),
    ("works", "ok"),
]
UNUSABLE = sum(expected != "ok" for _, expected in ROWS)  # 6


class Misbehaving(Workflow):
    def run(self):
        kind = self.task.raw_task["kind"]
        if kind == "non-experiences":
            return ["an answer", None, {"reward": 1.0}]
        if kind == "string":
            return "an answer"
        if kind == "none":
            return None
        if kind == "raise":
            raise RuntimeError(f"raised on row {self.task.index}")
        if kind == "hang":
            time.sleep(30)
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=1.0)]


def _tasks() -> list[Task]:
    return [
        Task(workflow=Misbehaving, raw_task={"kind": kind}, taskset_name="t", index=i)
        for i, (kind, _) in enumerate(ROWS)
    ]


def _counts_in(line: str) -> dict[str, int]:
    """``6 of 8 tasks gave no experience (4 failed, 1 timed out, 1 empty), ...`` -> counts."""
    head = re.match(r"(\d+) of (\d+) tasks gave no experience(?: \(([^)]*)\))?", line)
    assert head, line
    counts = {"total": int(head[1]), "tasks": int(head[2])}
    for part in (head[3] or "").split(", "):
        if part:
            number, name = part.split(" ", 1)
            counts[name] = int(number)
    return counts


def _assert_adds_up(metrics: dict, line: str, tasks: int, prefix: str = "rollout") -> None:
    failed, timeout, empty = (metrics[f"{prefix}/{k}_tasks"] for k in ("failed", "timeout", "empty"))
    assert (failed, timeout, empty) == (4.0, 1.0, 1.0)
    assert failed + timeout + empty == UNUSABLE
    counts = _counts_in(line)
    assert counts == {"total": UNUSABLE, "tasks": tasks, "failed": 4, "timed out": 1, "empty": 1}
    assert counts["failed"] + counts["timed out"] + counts["empty"] == counts["total"]


@pytest.mark.parametrize("retries", [0, 1], ids=["no-retry", "one-retry"])
def test_mixed_failures_are_counted_once_each_and_add_up(retries):
    results = RunnerPool(
        [object()], runner_per_model=len(ROWS), max_timeout=0.5, max_retry_times=retries
    ).run_tasks(_tasks())
    assert [r.outcome for r in results] == [expected for _, expected in ROWS]
    assert all(r.outcome in OUTCOMES for r in results)
    unusable = [r for r in results if not r.experiences]
    assert len(unusable) == UNUSABLE
    metrics = summarize_results(results)
    line = failure_report(results)
    _assert_adds_up(metrics, line, len(ROWS))
    assert metrics["rollout/dropped_experiences"] == 3.0
    assert "3 results dropped (3 not an Experience)" in line
    assert "first: t#1: " in line and "returned 'an answer'" in line


class TimesOutThenRaises(Workflow):
    calls = 0

    def run(self):
        type(self).calls += 1
        if type(self).calls == 1:
            time.sleep(30)
        raise ValueError("down")


def test_a_task_is_counted_by_how_its_last_attempt_ended():
    TimesOutThenRaises.calls = 0
    [result] = RunnerPool([object()], runner_per_model=1, max_timeout=0.3, max_retry_times=1).run_tasks(
        [Task(workflow=TimesOutThenRaises, taskset_name="t", index=0)]
    )
    assert result.attempts == 2 and result.outcome == "failed"
    metrics = summarize_results([result])
    assert (metrics["rollout/failed_tasks"], metrics["rollout/timeout_tasks"]) == (1.0, 0.0)


# -- the same through an explore step, with the workflow registered as a plugin ----------------


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("misbehaving", Misbehaving)


class _NullWriter(WriterBase):
    def __init__(self):
        self.written: list[Experience] = []

    def write(self, experiences):
        self.written.extend(experiences)

    def end_step(self, step):
        pass

    def finish(self):
        pass


def test_an_explore_step_reports_the_mixed_failures_so_that_they_add_up(tmp_path, tiny_model_path, engine):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": "1+1=", "kind": kind}) + "\n" for kind, _ in ROWS))
    config = Config.model_validate(
        {
            "buffer": {
                "batch_size": len(ROWS),
                "explorer_input": {
                    "tasksets": [{"name": "t", "path": str(data), "default_workflow_type": "misbehaving"}]
                },
            },
            "explorer": {
                "runner_per_model": len(ROWS),
                "max_retry_times": 0,
                "max_timeout": 1,
                "rollout_model": {"model_path": str(tiny_model_path), "engine_type": "transformers"},
            },
        }
    )
    writer = _NullWriter()
    with isolated_plugin_manager(), registered_plugin(_Plugin(), "failure-accounting-test"):
        explorer = Explorer(config, engines=[engine], writer=writer)
        metrics = explorer.explore_step()
        explorer.shutdown()
    assert len(writer.written) == 2  # the two rows that work
    assert metrics["rollout/num_tasks"] == len(ROWS)
    _assert_adds_up(metrics, metrics[FAILURES_KEY], len(ROWS))
