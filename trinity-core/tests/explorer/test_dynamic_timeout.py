"""``explorer.dynamic_timeout``: after warm-up a task's timeout is ratio x the mean duration of
the tasks that succeeded, at most ``max_timeout``."""

from __future__ import annotations

import asyncio

import pytest
import torch

from trinity.experience import Experience
from trinity.explorer.runner import DynamicTimeout, RunnerPool, TaskResult, summarize_results
from trinity.workflow import Task, Workflow

SLOW_S = 20.0


class Sleepy(Workflow):
    is_async = True

    def run(self):
        raise AssertionError("run_async is used")

    async def run_async(self):
        await asyncio.sleep(self.task.raw_task.get("sleep", 0.0))
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=1.0)]


def _task(index, **raw):
    return Task(workflow=Sleepy, raw_task=raw, repeat_times=1, taskset_name="t", index=index)


def _result(seconds, ok=True):
    return TaskResult(_task(0), seconds=seconds, error=None if ok else "boom")


def test_the_timeout_follows_the_mean_of_succeeded_tasks_after_warm_up():
    timeout = DynamicTimeout(max_timeout=100, ratio=3, warmup_tasks=2)
    timeout.observe(_result(2.0))
    assert timeout.seconds == 100  # warming up
    timeout.observe(_result(100.0, ok=False))  # failures do not count
    assert timeout.seconds == 100
    timeout.observe(_result(4.0))
    assert timeout.seconds == pytest.approx(9.0)  # 3 x mean(2, 4)
    timeout.observe(_result(60.0))
    assert timeout.seconds == pytest.approx(66.0)  # 3 x mean(2, 4, 60)
    timeout.observe(_result(300.0))
    assert timeout.seconds == 100  # never above max_timeout
    assert DynamicTimeout(max_timeout=10, ratio=2, warmup_tasks=0).seconds == 10  # nothing seen yet


def test_a_long_tail_task_times_out_after_warm_up_only():
    dynamic = DynamicTimeout(max_timeout=60, ratio=3, warmup_tasks=4)
    pool = RunnerPool(
        [object()], runner_per_model=4, max_retry_times=0, max_timeout=60, dynamic_timeout=dynamic
    )
    # Warm-up step: a task 10x slower than the others still finishes (timeout: max_timeout).
    warm = pool.run_tasks([_task(i, sleep=0.02) for i in range(3)] + [_task(3, sleep=0.2)])
    assert all(r.ok for r in warm) and dynamic.observed == 4
    assert dynamic.seconds < 60
    # Next step: the long-tail task is cut at ratio x mean, the others succeed.
    step = pool.run_tasks([_task(i, sleep=0.02) for i in range(3)] + [_task(3, sleep=SLOW_S)])
    assert [r.ok for r in step] == [True, True, True, False]
    assert step[3].timed_out and "explorer.dynamic_timeout" in step[3].error
    assert summarize_results(step)["rollout/timeout_tasks"] == 1.0


def test_eval_tasks_neither_count_nor_get_the_dynamic_timeout():
    dynamic = DynamicTimeout(max_timeout=60, ratio=1, warmup_tasks=1)
    dynamic.observe(_result(0.01))
    pool = RunnerPool(
        [object()], runner_per_model=2, max_retry_times=0, max_timeout=60, dynamic_timeout=dynamic
    )
    results = pool.run_tasks([_task(0, sleep=0.3), _task(1)], observe=False)
    assert all(r.ok for r in results) and dynamic.observed == 1
