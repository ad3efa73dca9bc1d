"""Long-tail control: ``explorer.over_rollout`` ends an explore step once enough tasks finished.

A tiny workflow sleeps on some tasks (``raw_task["sleep"]`` seconds per run, or only in the run
``raw_task["slow_run"]``). The slow ones sleep far longer than the test needs: were they not
cut, the test would only end after them, and its assertions on what was kept would fail.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

from trinity import hookimpl
from trinity.config import ConfigError, load_config
from trinity.experience import Experience
from trinity.explorer.explorer import Explorer
from trinity.explorer.runner import RunnerPool, failure_report, summarize_results
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.workflow import Task, Workflow

SLOW_S = 20.0


def _exp(run: int = 0) -> Experience:
    exp = Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=1.0)
    exp.eid.run = run
    return exp


class Sleepy(Workflow):
    """Async: sleeps ``sleep`` seconds in every run, or only in run ``slow_run``."""

    is_async = True

    def run(self):
        raise AssertionError("run_async is used")

    async def run_async(self):
        raw = self.task.raw_task
        slow = raw.get("slow_run")
        if slow is None or slow == self.run_id_base:
            await asyncio.sleep(raw.get("sleep", 0.0))
        if raw.get("fail_run") == self.run_id_base:
            raise RuntimeError("run failed")
        return [_exp(self.run_id_base)]


class SyncSleepy(Workflow):
    """The same in a thread: a cut sync workflow's thread is abandoned, not awaited."""

    def run(self):
        time.sleep(self.task.raw_task.get("sleep", 0.0))
        return [_exp()]


def _task(index, repeat_times=1, cls=Sleepy, **raw):
    return Task(workflow=cls, raw_task=raw, repeat_times=repeat_times, taskset_name="t", index=index)


def _pool(**kw):
    kw.setdefault("runner_per_model", 5)
    kw.setdefault("max_retry_times", 0)
    kw.setdefault("max_timeout", 60)
    return RunnerPool([object()], **kw)


@pytest.mark.parametrize("cls", [Sleepy, SyncSleepy])
def test_a_step_goes_on_once_enough_tasks_finished_and_drops_the_rest(cls):
    tasks = [_task(i, cls=cls) for i in range(4)] + [_task(4, cls=cls, sleep=SLOW_S)]
    results = _pool().run_tasks(tasks, min_finished=4, wait_after_min=0.0)
    assert [r.task.index for r in results] == [0, 1, 2, 3, 4]  # task order kept
    assert [r.cancelled for r in results] == [False] * 4 + [True]
    assert [len(r.experiences) for r in results] == [1, 1, 1, 1, 0]
    metrics = summarize_results(results)
    assert metrics["rollout/over_rollout/dropped_tasks"] == 1.0
    assert metrics["rollout/over_rollout/partial_tasks"] == 0.0
    assert metrics["rollout/finished_task_count"] == 4.0
    # Dropped by design: neither a failure nor an empty task.
    assert metrics["rollout/failed_tasks"] == metrics["rollout/empty_tasks"] == 0.0
    assert failure_report(results) is None


def test_tasks_not_started_are_dropped_too():
    tasks = [_task(0), _task(1, sleep=SLOW_S), _task(2), _task(3)]
    results = _pool(runner_per_model=2).run_tasks(tasks, min_finished=2, wait_after_min=0.0)
    finished = [r.task.index for r in results if not r.cancelled]
    assert len(finished) >= 2 and 1 not in finished
    assert summarize_results(results)["rollout/over_rollout/dropped_tasks"] == 4 - len(finished)


def test_wait_after_min_lets_a_late_task_finish():
    tasks = [_task(i) for i in range(3)] + [_task(3, sleep=0.2)]
    results = _pool().run_tasks(tasks, min_finished=3, wait_after_min=SLOW_S)
    assert not any(r.cancelled for r in results) and all(r.experiences for r in results)
    assert "rollout/over_rollout/dropped_tasks" not in summarize_results(results)


def test_without_min_finished_every_task_is_waited_for():
    tasks = [_task(0), _task(1, sleep=0.2)]
    assert all(r.ok and r.experiences for r in _pool().run_tasks(tasks))


@pytest.mark.parametrize("keep", [False, True])
def test_return_partial_tasks_keeps_the_runs_a_dropped_task_completed(keep):
    tasks = [_task(0), _task(1, repeat_times=3, slow_run=2, sleep=SLOW_S)]
    results = _pool(return_partial_tasks=keep).run_tasks(tasks, min_finished=1, wait_after_min=0.5)
    cut = results[1]
    assert cut.cancelled
    if keep:
        assert cut.partial and sorted(e.eid.run for e in cut.experiences) == [0, 1]
        assert summarize_results(results)["rollout/over_rollout/partial_tasks"] == 1.0
    else:
        assert not cut.partial and cut.experiences == []
        assert summarize_results(results)["rollout/over_rollout/dropped_tasks"] == 1.0


def test_return_partial_tasks_keeps_completed_runs_of_a_failed_attempt_instead_of_retrying():
    task = _task(0, repeat_times=3, fail_run=1)
    [kept] = _pool(return_partial_tasks=True, max_retry_times=2).run_tasks([task])
    assert kept.ok and kept.partial and kept.attempts == 1
    assert [e.eid.run for e in kept.experiences] == [0]
    [failed] = _pool(max_retry_times=2).run_tasks([task])
    assert not failed.ok and failed.attempts == 3 and not failed.experiences


# -- through the Explorer and the config ------------------------------------------------------


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("sleepy", Sleepy)


class ListWriter:
    def __init__(self):
        self.written, self.ended = [], []

    def write(self, experiences):
        self.written.extend(experiences)

    def end_step(self, step):
        self.ended.append(step)

    def finish(self):
        pass

    def metrics(self):
        return {}


class FakeEngine:
    model_version = 0

    def shutdown(self):
        pass


def _yaml(tmp_path, style="explorer_driven", ratio=0.2, extra=""):
    rows = [{"q": str(i), "a": "0", **({"sleep": SLOW_S} if i == 4 else {})} for i in range(5)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "job.yaml"
    path.write_text(
        f"""
project: p
name: n
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {tmp_path}/model, max_prompt_tokens: 8, max_response_tokens: 8}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  batch_size: 5
  explorer_input:
    taskset:
      name: t
      path: {tmp_path}/tasks.jsonl
      default_workflow_type: sleepy
      format: {{prompt_key: q, response_key: a}}
explorer:
  runner_per_model: 5
  max_timeout: 60
  over_rollout: {{ratio: {ratio}, wait_after_min: 0}}
  rollout_model: {{engine_type: transformers}}
{extra}
synchronizer: {{sync_style: {style}}}
trainer: {{trainer_type: native}}
"""
    )
    return path


def test_the_explorer_drops_its_long_tail_and_counts_it(tmp_path):
    with isolated_plugin_manager(autoload=True), registered_plugin(_Plugin(), "over-rollout-test"):
        config = load_config(_yaml(tmp_path))
        writer = ListWriter()
        explorer = Explorer(config, engines=[FakeEngine()], writer=writer)
        assert explorer.min_finished == 4  # ceil((1 - 0.2) * 5)
        metrics = explorer.explore_step()
    assert len(writer.written) == 8 and writer.ended == [1]  # 4 tasks x 2 runs
    assert metrics["rollout/over_rollout/dropped_tasks"] == 1.0
    assert metrics["rollout/finished_task_count"] == 4.0 and metrics["rollout/num_tasks"] == 5.0


def test_over_rollout_with_fixed_sync_style_is_refused_in_one_line(tmp_path):
    with (
        isolated_plugin_manager(autoload=True),
        registered_plugin(_Plugin(), "over-rollout-test"),
        pytest.raises(ConfigError) as info,
    ):
        load_config(_yaml(tmp_path, style="fixed"))
    message = str(info.value)
    assert "explorer.over_rollout.ratio" in message and "sync_style" in message and "\n" not in message
