"""Workflow runners: run tasks' workflows against the rollout models, robustly.

A :class:`RunnerPool` holds ``runner_per_model`` :class:`WorkflowRunner` s per model and
feeds them tasks from a queue; runners work concurrently (async workflows on the event loop,
sync ones in their own threads). For each task a runner:

- builds the workflow (or :meth:`~trinity.workflow.Workflow.reset` s its previous instance
  of the same class when ``can_reset``);
- produces ``task.repeat_times`` rollouts: one call when the workflow ``can_repeat``,
  otherwise one run per repeat, each with its own ``eid.run``;
- gives the whole task ``max_timeout`` seconds, and retries it ``max_retry_times`` times when
  it raises, times out or returns something that is not a list. After that the task is
  skipped: the step goes on, the failure is logged with the task id and traceback, and
  counted by how its last attempt ended: ``rollout/timeout_tasks`` when it timed out,
  ``rollout/failed_tasks`` otherwise (it raised, or returned something that is not a list);
- checks each returned item: one that is not an Experience, or whose reward is NaN or
  infinite, is dropped, logged and counted (``rollout/dropped_experiences``); a task left with
  no experience is logged and counted as empty (``rollout/empty_tasks``).

So every task that gives nothing to train on is counted once: failed, timed out, empty, or
(over_rollout) ``rollout/over_rollout/dropped_tasks``; see :func:`summarize_results`.

A hung synchronous workflow cannot be killed from Python: its thread is a daemon that is
abandoned (it never blocks process exit), and its workflow instance is never reused.

Long-tail control (``explorer.over_rollout``, ``explorer.dynamic_timeout``), as in Trinity-RFT:

- :meth:`RunnerPool.run_tasks` with ``min_finished`` returns once that many tasks finished and
  the rest had ``wait_after_min`` more seconds: tasks still running are cancelled and tasks not
  started are not run. They are *dropped*, not carried into the next step (as upstream's
  scheduler clears a step's unfinished tasks), and counted (``rollout/over_rollout/...``).
  With ``return_partial_tasks`` a dropped task keeps the runs it completed, and a task whose
  attempt failed after some runs completed keeps those instead of being retried.
- With a :class:`DynamicTimeout`, a task's timeout is ``min(max_timeout, ratio x mean seconds
  of the tasks that succeeded so far)`` once enough of them were seen (eval tasks do not count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity.experience import Experience

if TYPE_CHECKING:
    from trinity.workflow import Task, Workflow

logger = logging.getLogger(__name__)


class WorkflowOutputError(TypeError):
    """A workflow returned something other than a list."""


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
    # The last attempt timed out (an earlier attempt's timeout that a retry ended otherwise
    # does not count).
    timed_out: bool = False
    seconds: float = 0.0
    # Items of the workflow's output that were dropped, by reason ("not an Experience", ...).
    dropped: Counter[str] = field(default_factory=Counter)
    # Ended early by over_rollout (cancelled or never started); ``partial``: some of its runs
    # were kept (return_partial_tasks).
    cancelled: bool = False
    partial: bool = False
    # Partial rollouts (explorer.partial_rollout): carried from a step; the version it started at.
    resumed: bool = False
    started_version: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def empty(self) -> bool:
        """The task ran, but left no experience (it returned none, or all were dropped)."""
        return self.ok and not self.experiences and not self.cancelled

    @property
    def outcome(self) -> str:
        """How the task ended, one of :data:`OUTCOMES`: ``"ok"`` (it gave experiences, maybe
        partial ones), ``"failed"`` (skipped: its last attempt raised or returned something that
        is not a list), ``"timeout"`` (skipped: its last attempt timed out), ``"empty"`` (it
        returned a list, but nothing in it can be trained on) or ``"cancelled"`` (over_rollout
        ended it with nothing kept). Every task has exactly one."""
        if not self.ok:
            return "timeout" if self.timed_out else "failed"
        if self.experiences:
            return "ok"
        return "cancelled" if self.cancelled else "empty"

    @property
    def first_error_line(self) -> str:
        """The error's last line (``ValueError: ...``), for one-line reports."""
        lines = [line for line in (self.error or "").strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a hostile __repr__ must not fail the task
        text = f"<{type(value).__name__}: repr failed: {type(exc).__name__}>"
    return text if len(text) < 200 else text[:200] + "..."


def _check_output(output: Any, workflow: Workflow) -> list[Any]:
    if not isinstance(output, (list, tuple)):
        raise WorkflowOutputError(
            f"workflow {type(workflow).__name__} returned {_shown(output)}; "
            "run() must return a list of Experience"
        )
    return list(output)


def _drop_reason(item: Any) -> str | None:
    """Why one item of a workflow's output cannot be trained on, or ``None``."""
    if not isinstance(item, Experience):
        return "not an Experience"
    reward = item.reward
    if reward is not None:
        try:
            if not math.isfinite(float(reward)):
                return "non-finite reward"
        except (TypeError, ValueError):
            return "reward is not a number"
    return None


def _keep_valid(task: Task, items: list[Any], dropped: Counter[str]) -> list[Experience]:
    """The Experiences among ``items``; the others are counted in ``dropped`` and logged."""
    kept = []
    for item in items:
        why = _drop_reason(item)
        if why is None:
            kept.append(item)
            continue
        dropped[why] += 1
        detail = f"reward {item.reward!r}" if isinstance(item, Experience) else _shown(item)
        logger.warning("task %s: dropped one result (%s): %s", task_id(task), why, detail)
    return kept


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread; awaiting can be cancelled (the thread is then abandoned)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_result, fn())
        except BaseException as exc:
            outcome = (future.set_exception, exc)
        # An abandoned (timed-out) thread may finish after its event loop closed: nobody
        # waits for the result any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(target=target, name="trinity-workflow", daemon=True).start()
    return await future


def _marked_as_callers(models: list[Any]) -> contextlib.ExitStack:
    """Marks a running task as a caller of the engines behind ``models`` (engines that batch
    concurrent calls, such as the transformers engine, wait a little for its calls)."""
    stack = contextlib.ExitStack()
    engines = {id(e): e for e in (getattr(m, "engine", None) for m in models) if e is not None}
    for engine in engines.values():
        caller = getattr(engine, "caller", None)
        if callable(caller):
            stack.enter_context(caller())
    return stack


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
        return_partial_tasks: bool = False,
    ) -> None:
        self.model = model
        self.auxiliary_models = list(auxiliary_models or [])
        self.max_timeout = max_timeout
        self.max_retry_times = max_retry_times
        self.runner_id = runner_id
        self.return_partial_tasks = return_partial_tasks
        self._workflow: Workflow | None = None
        self._warned_history = False
        # Items of the runs of the current attempt that completed (kept for partial tasks).
        self.completed_runs: list[Any] = []

    def _workflow_for(self, task: Task) -> Workflow:
        cached = self._workflow
        if cached is not None and cached.can_reset and type(cached) is task.workflow:
            cached.reset(task)
            return cached
        workflow = task.to_workflow(self.model, self.auxiliary_models)
        self._workflow = workflow if workflow.can_reset else None
        return workflow

    async def _call(self, workflow: Workflow) -> list[Any]:
        if workflow.is_async:
            return _check_output(await workflow.run_async(), workflow)
        return _check_output(await _in_daemon_thread(workflow.run), workflow)

    async def _attempt(self, task: Task) -> list[Any]:
        """One try at ``task``: the workflow's items (checked by :func:`_keep_valid` after)."""
        repeat = max(1, task.repeat_times)
        workflow = self._workflow_for(task)
        if workflow.can_repeat:
            workflow.set_repeat_times(repeat, 0)
            items = await self._call(workflow)
            runs = [getattr(getattr(e, "eid", None), "run", None) for e in items]
            if len(items) == repeat and all(isinstance(e, Experience) for e in items) and set(runs) == {0}:
                for run, exp in enumerate(items):  # one experience per rollout: number them
                    exp.eid.run = run
            return items
        items = self.completed_runs = []
        for run in range(repeat):
            if run > 0:
                workflow = self._workflow_for(task)
            workflow.set_repeat_times(1, run)
            output = await self._call(workflow)
            for item in output:
                if isinstance(item, Experience):
                    item.eid.run = run
            items.extend(output)  # a whole run at a time: a partial task holds complete runs
        return items

    def _drop_history(self) -> int:
        """Empty this runner's model history (its wrapper is the runner's own); how many calls
        it held. Without this, a workflow that never collects the history would grow it for the
        whole job."""
        if getattr(self.model, "enable_history", False) is not True:
            return 0
        try:
            return len(self.model.extract_experience_from_history(clear_history=True))
        except Exception:  # a model double without history: nothing to drop
            return 0

    async def run_task(self, task: Task, timeout: float | None = None, timeout_key: str = "") -> TaskResult:
        """Run ``task`` with timeout (``timeout``, default ``max_timeout``; ``timeout_key`` names
        the setting that chose it) and retries; never raises for a workflow's fault."""
        with _marked_as_callers([self.model, *self.auxiliary_models]):
            return await self._run_task(task, timeout, timeout_key)

    async def _run_task(self, task: Task, timeout: float | None, timeout_key: str) -> TaskResult:
        timeout = self.max_timeout if timeout is None else timeout
        timeout_key = timeout_key or "explorer.max_timeout"
        result = TaskResult(task)
        start = time.monotonic()
        items: list[Any] = []
        self.completed_runs = []
        for attempt in range(1, self.max_retry_times + 2):
            result.attempts = attempt
            result.timed_out = False  # counted by how the last attempt ended
            seed_calls = getattr(self.model, "seed_calls", None)
            if seed_calls is not None:  # the task's samples depend on the task, not on timing
                seed_calls(f"{task_id(task)}/v{self.model.model_version}/attempt{attempt}")
            self._drop_history()  # a failed attempt's calls are not this attempt's
            try:
                items = await asyncio.wait_for(self._attempt(task), timeout)
                result.error = None
                break
            except asyncio.TimeoutError:
                result.timed_out = True
                result.error = f"timed out after {timeout:.4g} s ({timeout_key})"
            except asyncio.CancelledError:
                self._workflow = None  # cancelled mid-run (over_rollout): never reuse it
                raise
            except Exception as exc:
                result.error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            # The instance may be half-way through a run (or still running, in a thread).
            self._workflow = None
            if self.return_partial_tasks and self.completed_runs:
                # As upstream: keep the runs that completed rather than re-running them.
                logger.warning(
                    "task %s: attempt %d failed after %d completed run(s); keeping them "
                    "(explorer.over_rollout.return_partial_tasks):\n%s",
                    task_id(task),
                    attempt,
                    len({getattr(getattr(i, "eid", None), "run", None) for i in self.completed_runs}),
                    result.error,
                )
                items, result.error, result.partial = list(self.completed_runs), None, True
                break
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
        left = self._drop_history()
        if left and not self._warned_history:
            self._warned_history = True
            logger.warning(
                "task %s: its workflow (%s) left %d recorded model calls in the history "
                "(explorer.rollout_model.enable_history is on but the workflow does not collect "
                "them with extract_experience_from_history); each runner drops them after every "
                "task. Said once per runner.",
                task_id(task),
                getattr(task.workflow, "__name__", task.workflow),
                left,
            )
        if result.ok:
            result.experiences = _keep_valid(task, items, result.dropped)
            if not result.experiences:
                logger.warning(
                    "task %s gave no experience to train on (%s)",
                    task_id(task),
                    "workflow returned an empty list" if not items else f"all {len(items)} results dropped",
                )
        result.seconds = time.monotonic() - start
        return result


@dataclass
class DynamicTimeout:
    """``explorer.dynamic_timeout``: a task's timeout follows the mean duration of the tasks
    that succeeded so far: ``min(max_timeout, ratio x mean)`` once ``warmup_tasks`` of them
    were seen (Trinity-RFT waits for one batch of tasks; ``warmup_min_steps`` batches here).
    Failed tasks do not count: a timed-out one would only raise the mean to the timeout."""

    max_timeout: float
    ratio: float = 3.0
    warmup_tasks: int = 1
    total_seconds: float = 0.0
    observed: int = 0

    def observe(self, result: TaskResult) -> None:
        if result.ok and not result.partial and not result.cancelled:
            self.total_seconds += result.seconds
            self.observed += 1

    @property
    def seconds(self) -> float:
        """The timeout for the next task."""
        if self.observed < max(1, self.warmup_tasks):
            return self.max_timeout
        return min(self.max_timeout, self.ratio * self.total_seconds / self.observed)


class RunnerPool:
    """``runner_per_model`` runners for each model, fed from one queue of tasks.

    ``models[i]`` is engine ``i``'s model, or a list of models for it of which runner ``j`` of
    that engine gets item ``j % len`` (per-runner wrappers keep each runner's history apart).
    ``auxiliary_models`` has one entry per ``explorer.auxiliary_models`` item: a model, or a
    list of which runner ``k`` (counted over all engines) gets item ``k % len``. Every workflow
    thus sees one auxiliary model per configured item, in config order, as in Trinity-RFT.
    ``env_vars`` are set in this process's environment when the pool is created (the explorer
    process hosts the workflows). ``dynamic_timeout`` makes task timeouts adapt (see
    :class:`DynamicTimeout`); ``return_partial_tasks`` keeps the completed runs of tasks that
    end early.
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
        dynamic_timeout: DynamicTimeout | None = None,
        return_partial_tasks: bool = False,
    ) -> None:
        if not models:
            raise ValueError("RunnerPool needs at least one rollout model")
        os.environ.update({str(k): str(v) for k, v in (env_vars or {}).items()})
        engines = [_as_list(m, "rollout model") for m in models]
        groups = [_as_list(g, "auxiliary model") for g in (auxiliary_models or [])]
        self.dynamic_timeout = dynamic_timeout
        self.return_partial_tasks = return_partial_tasks
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
                        return_partial_tasks=return_partial_tasks,
                    )
                )

    async def run_tasks_async(
        self,
        tasks: list[Task],
        *,
        min_finished: int | None = None,
        wait_after_min: float = 0.0,
        observe: bool = True,
    ) -> list[TaskResult]:
        """Run the tasks; results are in the order of ``tasks``.

        With ``min_finished`` (over_rollout), return once that many finished and the others had
        ``wait_after_min`` more seconds; those still unfinished come back ``cancelled``.
        ``observe``: the durations count for the dynamic timeout (training tasks, not eval).
        """
        queue: asyncio.Queue = asyncio.Queue()
        for i, task in enumerate(tasks):
            queue.put_nowait((i, task))
        results: list[TaskResult | None] = [None] * len(tasks)
        running: dict[int, WorkflowRunner] = {}
        enough = asyncio.Event()
        dynamic = self.dynamic_timeout if observe else None

        async def work(runner: WorkflowRunner) -> None:
            while not queue.empty():
                i, task = queue.get_nowait()
                running[i] = runner
                if dynamic is not None:
                    result = await runner.run_task(
                        task, dynamic.seconds, "explorer.dynamic_timeout, at most explorer.max_timeout"
                    )
                    dynamic.observe(result)
                else:
                    result = await runner.run_task(task)
                results[i] = result
                del running[i]
                if min_finished is not None and sum(r is not None for r in results) >= min_finished:
                    enough.set()

        workers = [asyncio.ensure_future(work(r)) for r in self.runners[: max(1, len(tasks))]]
        if min_finished is None or min_finished >= len(tasks):
            await asyncio.gather(*workers)
            return [r for r in results if r is not None]
        all_done = asyncio.ensure_future(asyncio.gather(*workers))
        reached = asyncio.ensure_future(enough.wait())
        await asyncio.wait([all_done, reached], return_when=asyncio.FIRST_COMPLETED)
        reached.cancel()
        if not all_done.done():
            await asyncio.wait([all_done], timeout=wait_after_min)
        if not all_done.done():
            all_done.cancel()
            await asyncio.gather(all_done, return_exceptions=True)
        return [
            r if r is not None else self._cut_short(task, running.get(i))
            for i, (task, r) in enumerate(zip(tasks, results))
        ]

    def _cut_short(self, task: Task, runner: WorkflowRunner | None) -> TaskResult:
        """The result of a task over_rollout ended: dropped, or (``return_partial_tasks``) the
        runs it completed."""
        result = TaskResult(task, cancelled=True)
        if runner is not None and self.return_partial_tasks and runner.completed_runs:
            result.experiences = _keep_valid(task, list(runner.completed_runs), result.dropped)
            result.partial = bool(result.experiences)
        return result

    def run_tasks(
        self,
        tasks: list[Task],
        *,
        min_finished: int | None = None,
        wait_after_min: float = 0.0,
        observe: bool = True,
    ) -> list[TaskResult]:
        """Blocking :meth:`run_tasks_async` (not from inside a running event loop)."""
        results: list[TaskResult] = []

        async def main() -> None:
            # The main task returns nothing: on the main thread asyncio.run (Python 3.11) looks
            # at the SIGINT handler it installed, and signal.getsignal formats that handler, the
            # main task and its result included; with the step's Experiences as the result that
            # repr printed every tensor: 40 ms twice an explore step in the quickstart.
            results.extend(
                await self.run_tasks_async(
                    tasks, min_finished=min_finished, wait_after_min=wait_after_min, observe=observe
                )
            )

        asyncio.run(main())
        return results


def _as_list(entry: Any, what: str) -> list[Any]:
    items = entry if isinstance(entry, list) else [entry]
    if not items:
        raise ValueError(f"RunnerPool: a {what} entry is an empty list")
    return items


OUTCOMES = ("ok", "failed", "timeout", "empty", "cancelled")
"""The values of :attr:`TaskResult.outcome`."""


def summarize_results(results: list[TaskResult], prefix: str = "rollout") -> dict[str, float]:
    """Failure counters of a step. The tasks that give nothing to train on are counted in
    exactly one of these (they add up to the step's tasks without experience):

    * ``<prefix>/failed_tasks``: skipped after their last attempt raised or returned something
      that is not a list (timeouts not included);
    * ``<prefix>/timeout_tasks``: skipped after their last attempt timed out;
    * ``<prefix>/empty_tasks``: returned a list, but nothing in it can be trained on (an empty
      list, or every item dropped);
    * ``<prefix>/over_rollout/dropped_tasks`` (only when over_rollout ended tasks early):
      cancelled with nothing kept.

    Also ``retried_tasks`` (needed more than one attempt, however they ended),
    ``dropped_experiences`` (items dropped: not an Experience, or a reward that is not a finite
    number) and, with over_rollout, ``finished_task_count`` and ``over_rollout/partial_tasks``
    (their completed runs kept, also counting tasks kept partial after a failed attempt)."""
    outcomes = Counter(r.outcome for r in results)
    out = {
        f"{prefix}/failed_tasks": float(outcomes["failed"]),
        f"{prefix}/timeout_tasks": float(outcomes["timeout"]),
        f"{prefix}/retried_tasks": float(sum(r.attempts > 1 for r in results)),
        f"{prefix}/empty_tasks": float(outcomes["empty"]),
        f"{prefix}/dropped_experiences": float(sum(sum(r.dropped.values()) for r in results)),
    }
    if any(r.cancelled or r.partial for r in results):
        out[f"{prefix}/finished_task_count"] = float(sum(not r.cancelled for r in results))
        out[f"{prefix}/over_rollout/dropped_tasks"] = float(outcomes["cancelled"])
        out[f"{prefix}/over_rollout/partial_tasks"] = float(sum(r.partial for r in results))
    return out


def failure_report(results: list[TaskResult]) -> str | None:
    """One line about a step's tasks that gave nothing to train on, and its dropped results:
    ``6 of 8 tasks gave no experience (3 failed, 1 timed out, 2 empty), 2 results dropped
    (2 not an Experience); first: t#1: ValueError: ...``. The counts in brackets are those of
    :func:`summarize_results` and add up to the first number (tasks over_rollout ended with
    nothing kept are in it too, as ``ended by over_rollout``, when the line is printed anyway).
    The first error is named with its task id. ``None`` when no task failed, timed out or came
    back empty and no result was dropped."""
    outcomes = Counter(r.outcome for r in results)
    dropped = sum(sum(r.dropped.values()) for r in results)
    if not (outcomes["failed"] or outcomes["timeout"] or outcomes["empty"] or dropped):
        return None
    names = {
        "failed": "failed",
        "timeout": "timed out",
        "empty": "empty",
        "cancelled": "ended by over_rollout",
    }
    kinds = [f"{outcomes[kind]} {name}" for kind, name in names.items() if outcomes[kind]]
    unusable = sum(outcomes[kind] for kind in names)
    line = f"{unusable} of {len(results)} tasks gave no experience"
    if kinds:
        line += " (" + ", ".join(kinds) + ")"
    if dropped:
        reasons: Counter[str] = Counter()
        for r in results:
            reasons.update(r.dropped)
        line += (
            f", {dropped} results dropped ("
            + ", ".join(f"{n} {why}" for why, n in reasons.most_common())
            + ")"
        )
    failed = [r for r in results if not r.ok]
    empty = [r for r in results if r.empty]
    if failed:
        line += f"; first: {task_id(failed[0].task)}: {failed[0].first_error_line}"
    elif empty:
        line += f"; first: {task_id(empty[0].task)}"
    return line
