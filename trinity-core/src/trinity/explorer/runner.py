"""Workflow runners: run tasks' workflows against the rollout models, robustly.

A :class:`RunnerPool` holds ``runner_per_model`` :class:`WorkflowRunner` s per model and
feeds them tasks from a queue; runners work concurrently (async workflows on the event loop,
sync ones in their own threads). For each task a runner:

- builds the workflow (or :meth:`~trinity.workflow.Workflow.reset` s its previous instance
  of the same class when ``can_reset``);
- produces ``task.repeat_times`` rollouts: one call when the workflow ``can_repeat``,
  otherwise one run per repeat, each with its own ``eid.run``;
- gives the whole task ``max_timeout`` seconds, and retries it ``max_retry_times`` times when
  it raises, times out or returns something that is not a list of Experiences. After that the
  task is skipped: the step goes on, the failure is logged with the task id and traceback, and
  counted (``rollout/failed_tasks``).

A hung synchronous workflow cannot be killed from Python: its thread is a daemon that is
abandoned (it never blocks process exit), and its workflow instance is never reused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity.experience import Experience

if TYPE_CHECKING:
    from trinity.workflow import Task, Workflow

logger = logging.getLogger(__name__)


class WorkflowOutputError(TypeError):
    """A workflow returned something other than a list of Experiences."""


def task_id(task: Task) -> str:
    """How logs name a task: ``<taskset>#<index>``."""
    return f"{task.taskset_name or 'taskset'}#{task.index}"


@dataclass
class TaskResult:
    """What running one task gave: its Experiences, or the error that made it be skipped."""

    task: Task
    experiences: list[Experience] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _check_output(output: Any, workflow: Workflow) -> list[Experience]:
    if not isinstance(output, (list, tuple)) or not all(isinstance(e, Experience) for e in output):
        shown = repr(output)
        shown = shown if len(shown) < 200 else shown[:200] + "..."
        raise WorkflowOutputError(
            f"workflow {type(workflow).__name__} returned {shown}; run() must return a list of Experience"
        )
    return list(output)


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread; awaiting can be cancelled (the thread is then abandoned)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(deliver, future.set_exception, exc)
        else:
            loop.call_soon_threadsafe(deliver, future.set_result, result)

    threading.Thread(target=target, name="trinity-workflow", daemon=True).start()
    return await future


class WorkflowRunner:
    """Runs tasks one at a time against one model (and the auxiliary models)."""

    def __init__(
        self,
        model: Any,
        auxiliary_models: list[Any] | None = None,
        *,
        max_timeout: float = 1800,
        max_retry_times: int = 2,
        runner_id: int = 0,
    ) -> None:
        self.model = model
        self.auxiliary_models = list(auxiliary_models or [])
        self.max_timeout = max_timeout
        self.max_retry_times = max_retry_times
        self.runner_id = runner_id
        self._workflow: Workflow | None = None

    def _workflow_for(self, task: Task) -> Workflow:
        cached = self._workflow
        if cached is not None and cached.can_reset and type(cached) is task.workflow:
            cached.reset(task)
            return cached
        workflow = task.to_workflow(self.model, self.auxiliary_models)
        self._workflow = workflow if workflow.can_reset else None
        return workflow

    async def _call(self, workflow: Workflow) -> list[Experience]:
        if workflow.is_async:
            return _check_output(await workflow.run_async(), workflow)
        return _check_output(await _in_daemon_thread(workflow.run), workflow)

    async def _attempt(self, task: Task) -> list[Experience]:
        repeat = max(1, task.repeat_times)
        workflow = self._workflow_for(task)
        if workflow.can_repeat:
            workflow.set_repeat_times(repeat, 0)
            experiences = await self._call(workflow)
            if len(experiences) == repeat and all(e.eid.run == 0 for e in experiences):
                for run, exp in enumerate(experiences):  # one experience per rollout: number them
                    exp.eid.run = run
            return experiences
        experiences = []
        for run in range(repeat):
            if run > 0:
                workflow = self._workflow_for(task)
            workflow.set_repeat_times(1, run)
            for exp in await self._call(workflow):
                exp.eid.run = run
                experiences.append(exp)
        return experiences

    async def run_task(self, task: Task) -> TaskResult:
        """Run ``task`` with timeout and retries; never raises for a workflow's fault."""
        result = TaskResult(task)
        start = time.monotonic()
        for attempt in range(1, self.max_retry_times + 2):
            result.attempts = attempt
            seed_calls = getattr(self.model, "seed_calls", None)
            if seed_calls is not None:  # the task's samples depend on the task, not on timing
                seed_calls(f"{task_id(task)}/v{self.model.model_version}/attempt{attempt}")
            try:
                result.experiences = await asyncio.wait_for(self._attempt(task), self.max_timeout)
                result.error = None
                break
            except asyncio.TimeoutError:
                result.timed_out = True
                result.error = f"timed out after {self.max_timeout} s (explorer.max_timeout)"
            except Exception as exc:
                result.error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            # The instance may be half-way through a run (or still running, in a thread).
            self._workflow = None
            last = attempt > self.max_retry_times
            logger.log(
                logging.ERROR if last else logging.WARNING,
                "task %s failed (attempt %d of %d, runner %d)%s:\n%s",
                task_id(task),
                attempt,
                self.max_retry_times + 1,
                self.runner_id,
                "; skipping it" if last else "; retrying",
                result.error,
            )
        result.seconds = time.monotonic() - start
        return result


class RunnerPool:
    """``runner_per_model`` runners for each model, fed from one queue of tasks.

    ``models[i]`` is engine ``i``'s model, or a list of models for it of which runner ``j`` of
    that engine gets item ``j % len`` (per-runner wrappers keep each runner's history apart).
    ``auxiliary_models`` has one entry per ``explorer.auxiliary_models`` item: a model, or a
    list of which runner ``k`` (counted over all engines) gets item ``k % len``. Every workflow
    thus sees one auxiliary model per configured item, in config order, as in Trinity-RFT.
    ``env_vars`` are set in this process's environment when the pool is created (the explorer
    process hosts the workflows).
    """

    def __init__(
        self,
        models: list[Any],
        *,
        auxiliary_models: list[Any] | None = None,
        runner_per_model: int = 8,
        max_timeout: float = 1800,
        max_retry_times: int = 2,
        env_vars: Mapping[str, str] | None = None,
    ) -> None:
        if not models:
            raise ValueError("RunnerPool needs at least one rollout model")
        os.environ.update({str(k): str(v) for k, v in (env_vars or {}).items()})
        engines = [_as_list(m, "rollout model") for m in models]
        groups = [_as_list(g, "auxiliary model") for g in (auxiliary_models or [])]
        self.runners = []
        for i, copies in enumerate(engines):
            for j in range(runner_per_model):
                k = i * runner_per_model + j
                self.runners.append(
                    WorkflowRunner(
                        copies[j % len(copies)],
                        [g[k % len(g)] for g in groups],
                        max_timeout=max_timeout,
                        max_retry_times=max_retry_times,
                        runner_id=k,
                    )
                )

    async def run_tasks_async(self, tasks: list[Task]) -> list[TaskResult]:
        """Run every task; results are in the order of ``tasks``."""
        queue: asyncio.Queue = asyncio.Queue()
        for i, task in enumerate(tasks):
            queue.put_nowait((i, task))
        results: list[TaskResult | None] = [None] * len(tasks)

        async def work(runner: WorkflowRunner) -> None:
            while not queue.empty():
                i, task = queue.get_nowait()
                results[i] = await runner.run_task(task)

        await asyncio.gather(*(work(r) for r in self.runners[: max(1, len(tasks))]))
        return [r for r in results if r is not None]

    def run_tasks(self, tasks: list[Task]) -> list[TaskResult]:
        """Blocking :meth:`run_tasks_async` (not from inside a running event loop)."""
        return asyncio.run(self.run_tasks_async(tasks))


def _as_list(entry: Any, what: str) -> list[Any]:
    items = entry if isinstance(entry, list) else [entry]
    if not items:
        raise ValueError(f"RunnerPool: a {what} entry is an empty list")
    return items


def summarize_results(results: list[TaskResult], prefix: str = "rollout") -> dict[str, float]:
    """Failure counters of a step: ``<prefix>/failed_tasks``, ``timeout_tasks``, ``retried_tasks``."""
    return {
        f"{prefix}/failed_tasks": float(sum(not r.ok for r in results)),
        f"{prefix}/timeout_tasks": float(sum(r.timed_out and not r.ok for r in results)),
        f"{prefix}/retried_tasks": float(sum(r.attempts > 1 for r in results)),
    }
