"""Workflow runners: repeats, reuse, concurrency, and workflows that raise, hang or return garbage."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest
import torch

from trinity.experience import Experience
from trinity.explorer.model_wrapper import ModelWrapper
from trinity.explorer.runner import RunnerPool, WorkflowRunner, failure_report, summarize_results
from trinity.workflow import Task, Workflow


def _exp(reward: float = 1.0) -> Experience:
    return Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=reward)


class Counting(Workflow):
    """Returns one experience per run; counts instances and resets."""

    created = 0
    resets = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).created += 1

    def run(self):
        return [_exp(float(self.task.raw_task.get("r", 1.0)))]


class Resettable(Counting):
    can_reset = True
    created = 0
    resets = 0

    def reset(self, task):
        self.task = task
        type(self).resets += 1


class Raising(Workflow):
    def run(self):
        raise RuntimeError("boom in workflow")


class Flaky(Workflow):
    calls = 0

    def run(self):
        type(self).calls += 1
        if type(self).calls == 1:
            raise ConnectionError("transient")
        return [_exp()]


class Hanging(Workflow):
    def run(self):
        time.sleep(60)
        return [_exp()]


class AsyncHanging(Workflow):
    is_async = True

    def run(self):
        raise AssertionError("run_async is used")

    async def run_async(self):
        await asyncio.sleep(60)
        return [_exp()]


class Garbage(Workflow):
    def run(self):
        return self.task.raw_task["out"]


class AsyncSleeper(Workflow):
    is_async = True

    def run(self):
        raise AssertionError("run_async is used")

    async def run_async(self):
        await asyncio.sleep(0.4)
        return [_exp()]


class SyncSleeper(Workflow):
    def run(self):
        time.sleep(0.4)
        return [_exp()]


class EnvReader(Workflow):
    def run(self):
        return [_exp(float(os.environ["TRINITY_TEST_RUNNER_VAR"]))]


class ChatRepeat(Workflow):
    """Uses the real model: one chat(n=repeat_times) call."""

    can_repeat = True

    def run(self):
        exps = self.model.chat([{"role": "user", "content": "hi"}], n=self.repeat_times, max_tokens=4, seed=0)
        for e in exps:
            e.reward = 0.5
        return exps


def _task(cls, index=0, repeat_times=1, **raw):
    return Task(workflow=cls, raw_task=raw, repeat_times=repeat_times, taskset_name="t", index=index)


def _pool(model=None, **kw):
    kw.setdefault("runner_per_model", 1)
    kw.setdefault("max_retry_times", 1)
    kw.setdefault("max_timeout", 5)
    return RunnerPool([model or object()], **kw)


def test_repeats_give_distinct_run_ids_with_fresh_instances():
    Counting.created = 0
    [result] = _pool().run_tasks([_task(Counting, repeat_times=3)])
    assert result.ok and [e.eid.run for e in result.experiences] == [0, 1, 2]
    assert Counting.created == 3


def test_resettable_workflow_is_reused():
    Resettable.created = Resettable.resets = 0
    results = _pool().run_tasks([_task(Resettable, i, r=i) for i in range(3)])
    assert [r.experiences[0].reward for r in results] == [0.0, 1.0, 2.0]
    assert (Resettable.created, Resettable.resets) == (1, 2)


def test_can_repeat_workflow_is_called_once_with_n(engine):
    model = ModelWrapper(engine)
    [result] = _pool(model).run_tasks([_task(ChatRepeat, repeat_times=3)])
    assert result.ok, result.error
    assert len(result.experiences) == 3
    assert [e.eid.run for e in result.experiences] == [0, 1, 2]
    assert all(e.response_length >= 1 for e in result.experiences)


def test_raising_workflow_is_retried_then_skipped_and_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.explorer.runner"):
        results = _pool(max_retry_times=2).run_tasks([_task(Raising, 7), _task(Counting, 8)])
    bad, good = results
    assert not bad.ok and bad.attempts == 3 and bad.experiences == []
    assert "RuntimeError: boom in workflow" in bad.error and "Traceback" in bad.error
    assert good.ok  # the step goes on
    assert summarize_results(results)["rollout/failed_tasks"] == 1.0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("task t#7 failed" in m for m in messages) == 3
    assert "skipping it" in messages[-1] and "boom in workflow" in messages[-1]


def test_transient_failure_succeeds_on_retry():
    Flaky.calls = 0
    [result] = _pool(max_retry_times=1).run_tasks([_task(Flaky)])
    assert result.ok and result.attempts == 2
    assert summarize_results([result]) == {
        "rollout/failed_tasks": 0.0,
        "rollout/timeout_tasks": 0.0,
        "rollout/retried_tasks": 1.0,
        "rollout/empty_tasks": 0.0,
        "rollout/dropped_experiences": 0.0,
    }


@pytest.mark.parametrize("cls", [Hanging, AsyncHanging])
def test_hanging_workflow_times_out_and_the_step_goes_on(cls):
    start = time.monotonic()
    results = _pool(runner_per_model=2, max_timeout=0.3, max_retry_times=1).run_tasks(
        [_task(cls, 0), _task(Counting, 1)]
    )
    assert time.monotonic() - start < 5
    hung, good = results
    assert not hung.ok and hung.timed_out and hung.attempts == 2
    assert "max_timeout" in hung.error
    assert good.ok
    metrics = summarize_results(results)
    # Disjoint: a timed-out task is counted as a timeout, not also as failed.
    assert metrics["rollout/failed_tasks"] == 0.0 and metrics["rollout/timeout_tasks"] == 1.0


@pytest.mark.parametrize("out", ["a string", None, {"tokens": [1]}])
def test_output_that_is_not_a_list_is_a_failure(out):
    [result] = _pool(max_retry_times=0).run_tasks([_task(Garbage, out=out)])
    assert not result.ok and "must return a list of Experience" in result.error


class Mixed(Workflow):
    """Returns good experiences next to items no trainer can use."""

    def run(self):
        return [_exp(1.0), "not an experience", _exp(float("nan")), _exp(float("inf")), 7, _exp(0.0)]


class Empty(Workflow):
    def run(self):
        return []


def test_unusable_items_are_dropped_one_by_one_and_the_task_goes_on(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.explorer.runner"):
        [result] = _pool(max_retry_times=0).run_tasks([_task(Mixed, 3)])
    assert result.ok and [e.reward for e in result.experiences] == [1.0, 0.0]
    assert result.dropped == {"not an Experience": 2, "non-finite reward": 2}
    metrics = summarize_results([result])
    assert metrics["rollout/dropped_experiences"] == 4.0 and metrics["rollout/failed_tasks"] == 0.0
    logged = [r.getMessage() for r in caplog.records]
    assert sum("task t#3: dropped one result" in m for m in logged) == 4
    assert any("non-finite reward" in m and "nan" in m for m in logged)


class AllNan(Workflow):
    def run(self):
        return [_exp(float("nan"))]


@pytest.mark.parametrize("cls", [Empty, AllNan])
def test_a_task_left_without_experiences_is_counted_and_logged_as_empty(cls, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.explorer.runner"):
        results = _pool(max_retry_times=0).run_tasks([_task(cls, 5), _task(Counting, 6)])
    empty, good = results
    assert empty.ok and empty.empty and not good.empty
    assert summarize_results(results)["rollout/empty_tasks"] == 1.0
    assert any("task t#5 gave no experience" in r.getMessage() for r in caplog.records)
    assert failure_report(results).startswith("1 of 2 tasks gave no experience (1 empty)")


def test_failure_report_names_counts_and_the_first_error_in_one_line():
    results = _pool(runner_per_model=2, max_retry_times=0, max_timeout=0.3).run_tasks(
        [_task(Counting, 0), _task(Raising, 1), _task(Hanging, 2), _task(Empty, 3)]
    )
    line = failure_report(results)
    assert "\n" not in line
    assert line == (
        "3 of 4 tasks gave no experience (1 failed, 1 timed out, 1 empty); "
        "first: t#1: RuntimeError: boom in workflow"
    )
    assert failure_report(results[:1]) is None


@pytest.mark.parametrize("cls", [AsyncSleeper, SyncSleeper])
def test_runners_work_concurrently(cls):
    start = time.monotonic()
    results = _pool(runner_per_model=4).run_tasks([_task(cls, i) for i in range(4)])
    elapsed = time.monotonic() - start
    assert all(r.ok for r in results)
    assert elapsed < 1.2, f"4 tasks of 0.4 s on 4 runners took {elapsed:.2f} s"


def test_runner_count_and_env_vars(monkeypatch):
    monkeypatch.setenv("TRINITY_TEST_RUNNER_VAR", "0")  # so monkeypatch removes it afterwards
    pool = RunnerPool([object(), object()], runner_per_model=3, env_vars={"TRINITY_TEST_RUNNER_VAR": "4"})
    assert len(pool.runners) == 6
    [result] = pool.run_tasks([_task(EnvReader)])
    assert result.experiences[0].reward == 4.0


def test_single_runner_results_keep_task_order():
    runner = WorkflowRunner(object(), max_timeout=5)
    result = asyncio.run(runner.run_task(_task(Counting, 3, r=2)))
    assert result.ok and result.experiences[0].reward == 2.0 and result.seconds >= 0


class ChatSample(Workflow):
    """Samples its task's prompt at temperature 1 with no seed of its own."""

    can_repeat = True

    def run(self):
        messages = [{"role": "user", "content": self.task.raw_task["q"]}]
        return self.model.chat(messages, n=self.repeat_times, max_tokens=6, temperature=1.0)


def test_a_tasks_samples_depend_on_the_task_not_on_runner_or_order(engine):
    def responses(order):
        pool = _pool([ModelWrapper(engine) for _ in range(4)], runner_per_model=4)
        tasks = [_task(ChatSample, i, repeat_times=3, q="same prompt") for i in order]
        return {r.task.index: [e.tokens.tolist() for e in r.experiences] for r in pool.run_tasks(tasks)}

    first, second = responses(range(8)), responses(reversed(range(8)))
    assert first == second  # other runners, other batch partners, same rollouts
    # The seed comes from the task's identity: the same prompt in another task samples anew.
    assert len({str(v) for v in first.values()}) > 1
    # Outside a runner (no task identity) calls continue the engine's own stream.
    model = ModelWrapper(engine)
    a = model.chat([{"role": "user", "content": "x"}], n=2, max_tokens=6)
    b = model.chat([{"role": "user", "content": "x"}], n=2, max_tokens=6)
    assert [e.tokens.tolist() for e in a] != [e.tokens.tolist() for e in b]


class HistoryOnce(Workflow):
    """Records model calls; collects them only on its second attempt (the first one fails)."""

    attempts = 0

    def run(self):
        type(self).attempts += 1
        exps = self.model.chat([{"role": "user", "content": "hi"}], max_tokens=2, seed=0)
        if type(self).attempts == 1:
            raise ConnectionError("transient")
        recorded = self.model.extract_experience_from_history()
        for e in recorded:
            e.reward = 1.0
        assert len(recorded) == len(exps)  # nothing of the failed attempt
        return recorded


def test_the_history_holds_only_the_current_attempts_calls_and_never_grows(engine, caplog):
    model = ModelWrapper(engine, enable_history=True)
    HistoryOnce.attempts = 0
    [result] = _pool(model).run_tasks([_task(HistoryOnce)])
    assert result.ok and result.attempts == 2 and len(result.experiences) == 1
    # ChatRepeat never collects what the history records: dropped after each task, said once.
    with caplog.at_level(logging.WARNING, logger="trinity.explorer.runner"):
        results = _pool(model).run_tasks([_task(ChatRepeat, i, repeat_times=2) for i in range(3)])
    assert all(r.ok for r in results)
    assert model.extract_experience_from_history() == []
    warnings = [r for r in caplog.records if "left 2 recorded model calls" in r.getMessage()]
    assert len(warnings) == 1 and "enable_history" in warnings[0].getMessage()


def test_a_blocking_run_never_formats_the_experiences(monkeypatch):
    # asyncio.run, on the main thread, formats its main task (result included) when it checks
    # its SIGINT handler at the end; a result holding the step's Experiences had every tensor
    # printed, twice a step (~40 ms each in the quickstart). The blocking run keeps them out of it.
    import signal
    import threading

    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # asyncio.run installs its own
    formatted = []
    monkeypatch.setattr(Experience, "__repr__", lambda self: formatted.append(self) or "Experience(...)")
    results = _pool(runner_per_model=2).run_tasks([_task(Counting, i) for i in range(3)])
    assert [len(r.experiences) for r in results] == [1, 1, 1]
    assert formatted == []
