"""Partial rollouts (``explorer.over_rollout.partial_rollout``), with AReaL's semantics.

A task still running when its explore step ends (over_rollout's cut) is *carried* into the next
step instead of being dropped:

- :class:`CarryingRunnerPool` runs the tasks on an event loop of its own that outlives a step
  (a daemon thread), so a carried task goes on; it finishes in a later step on the runner it had
  (its result ``resumed``). Tasks not started at the cut are dropped, as without carrying. A
  carried task counts towards that step's ``min_finished`` like the step's own.
- :class:`PartialRollouts` is the explorer's side: at the cut it pauses the engines (their
  samples stop after the current token, keeping their tokens; see
  :meth:`~trinity.rollout.base.RolloutEngine.pause_generation`), and when the explorer next works
  (a weight sync, an eval, the next step) it drops the carried tasks more than ``max_staleness``
  versions older than the weights loaded then and resumes the engines: each stopped sample goes
  on from its tokens under those weights, each token keeping the version it was sampled with
  (``Experience.token_versions``). Per step it reports ``rollout/partial_rollout/...``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trinity.explorer.runner import RunnerPool, TaskResult, WorkflowRunner

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.rollout.base import RolloutEngine
    from trinity.workflow import Task

logger = logging.getLogger(__name__)


@dataclass
class CarriedTask:
    """A task still running when its step ended: it goes on in a later step."""

    task: Task
    runner: WorkflowRunner
    future: asyncio.Future  # of its TaskResult, on the pool's loop
    started_version: int


class CarryingRunnerPool(RunnerPool):
    """A :class:`~trinity.explorer.runner.RunnerPool` whose steps carry their unfinished started
    tasks into the next step (see the module docstring). Evals use a pool of their own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Tasks carried over the end of their step, oldest first.
        self.carried: list[CarriedTask] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def run_tasks(
        self,
        tasks: list[Task],
        *,
        min_finished: int | None = None,
        wait_after_min: float = 0.0,
        observe: bool = True,
        version: int = 0,
    ) -> list[TaskResult]:
        """Blocking :meth:`run_tasks_async`, on the pool's own loop (which outlives the call)."""
        coro = self.run_tasks_async(
            tasks, min_finished=min_finished, wait_after_min=wait_after_min, observe=observe, version=version
        )
        return asyncio.run_coroutine_threadsafe(coro, self._own_loop()).result()

    async def run_tasks_async(
        self,
        tasks: list[Task],
        *,
        min_finished: int | None = None,
        wait_after_min: float = 0.0,
        observe: bool = True,
        version: int = 0,
    ) -> list[TaskResult]:
        """Run the tasks and the carried ones (call it on the pool's loop, as :meth:`run_tasks`
        does); the carried ones' results follow those of ``tasks``, ``resumed``, and count
        towards ``min_finished``. Started tasks still unfinished at the end are carried on
        (started under model ``version``) and are not in the results; tasks never started come
        back ``cancelled``. Every task runs as a future of its own that a worker only waits for
        (shielded), so ending the step leaves the running ones going."""
        carried, self.carried = self.carried, []
        queue: asyncio.Queue = asyncio.Queue()
        for i, task in enumerate(tasks):
            queue.put_nowait((i, task))
        results: list[TaskResult | None] = [None] * (len(tasks) + len(carried))
        running: dict[int, tuple[WorkflowRunner, asyncio.Future, Task]] = {}
        enough = asyncio.Event()
        dynamic = self.dynamic_timeout if observe else None
        # Carried tasks count like the step's own: it goes on once ``min_finished`` of them all
        # finished (as with dropping; a task still slow is carried again, up to max_staleness).
        goal = min(len(results), min_finished) if min_finished is not None else len(results)

        def finished(i: int, result: TaskResult) -> None:
            results[i] = result
            running.pop(i, None)
            if dynamic is not None and not result.resumed:  # a resumed task's time spans steps
                dynamic.observe(result)
            if sum(r is not None for r in results) >= goal:
                enough.set()

        async def work(runner: WorkflowRunner) -> None:
            while not queue.empty() and not enough.is_set():
                i, task = queue.get_nowait()
                timeout = dynamic.seconds if dynamic is not None else None
                key = "explorer.dynamic_timeout, at most explorer.max_timeout" if dynamic is not None else ""
                future = asyncio.ensure_future(runner.run_task(task, timeout, key))
                running[i] = (runner, future, task)
                result = await asyncio.shield(future)
                result.started_version = version
                finished(i, result)

        async def finish_carried(i: int, c: CarriedTask) -> None:
            running[i] = (c.runner, c.future, c.task)
            result = await asyncio.shield(c.future)
            result.resumed, result.started_version = True, c.started_version
            finished(i, result)
            await work(c.runner)

        busy = {id(c.runner) for c in carried}
        free = [r for r in self.runners if id(r) not in busy][: max(0, len(tasks))]
        workers = [asyncio.ensure_future(work(r)) for r in free]
        workers += [asyncio.ensure_future(finish_carried(len(tasks) + j, c)) for j, c in enumerate(carried)]
        if not workers:
            return []
        all_done = asyncio.ensure_future(asyncio.gather(*workers))
        reached = asyncio.ensure_future(enough.wait())
        await asyncio.wait([all_done, reached], return_when=asyncio.FIRST_COMPLETED)
        reached.cancel()
        if not all_done.done() and running:
            # The step goes on without the rest; those still running get wait_after_min more.
            await asyncio.wait([all_done], timeout=wait_after_min)
        all_done.cancel()  # the workers only: the tasks' own futures are shielded
        await asyncio.gather(all_done, return_exceptions=True)
        for i, (runner, future, task) in sorted(running.items()):
            if future.done():  # finished in the last moment
                result = future.result()
                result.resumed = i >= len(tasks)
                results[i] = result
                continue
            started = version if i < len(tasks) else carried[i - len(tasks)].started_version
            self.carried.append(CarriedTask(task, runner, future, started))
        out = []
        for i, r in enumerate(results):
            if r is not None:
                out.append(r)
            elif i < len(tasks) and i not in running:  # never started: dropped, as without carry
                out.append(TaskResult(tasks[i], cancelled=True))
        return out

    def drop_stale(self, version: int, max_staleness: int) -> list[CarriedTask]:
        """Cancel and forget the carried tasks that started more than ``max_staleness`` versions
        before ``version`` (a sync workflow's thread finishes its current engine call, whose
        result nobody reads); the dropped ones."""
        stale = [c for c in self.carried if version - c.started_version > max_staleness]
        if not stale:
            return []
        self.carried = [c for c in self.carried if c not in stale]

        async def cancel() -> None:
            for c in stale:
                c.future.cancel()
            await asyncio.gather(*(c.future for c in stale), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel(), self._own_loop()).result()
        return stale

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        """The pool's event loop, running in a daemon thread (made on first use)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="trinity-runner-pool", daemon=True).start()
            self._loop = loop
        return self._loop

    def close(self) -> None:
        """Stop the pool's event loop and its thread (call after :meth:`PartialRollouts.drop_all`:
        the process may serve a later stage, which has a pool of its own)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


class PartialRollouts:
    """The explorer's side of partial rollouts: pause the ``engines`` at a step's cut, resume
    them (dropping the carried tasks of ``pool`` older than ``max_staleness`` versions), and
    the per-step metrics."""

    def __init__(self, engines: list[RolloutEngine], pool: CarryingRunnerPool, max_staleness: int) -> None:
        self.engines, self.pool, self.max_staleness = engines, pool, max_staleness
        self.paused = False
        self.stale_dropped = 0  # carried tasks dropped for staleness since the last metrics

    def pause(self) -> None:
        """The sync point, after a step: the carried tasks' samples stop where they are."""
        if self.pool.carried:
            for engine in self.engines:
                engine.pause_generation()
            self.paused = True

    def resume(self, version: int) -> None:
        """Let the paused samples go on under the weights of ``version``, first dropping the
        carried tasks too stale for them. Nothing when not paused."""
        if not self.paused:
            return
        stale = self.pool.drop_stale(version, self.max_staleness)
        if stale:
            self.stale_dropped += len(stale)
            logger.info(
                "partial rollouts: dropped %d carried task(s) started under model version %s, more "
                "than explorer.over_rollout.max_staleness=%d versions before %d",
                len(stale),
                sorted({c.started_version for c in stale}),
                self.max_staleness,
                version,
            )
        for engine in self.engines:
            engine.resume_generation()
        self.paused = False

    def drop_all(self, version: int) -> None:
        """The end (tasksets exhausted, shutdown): no later step will finish the carried tasks."""
        if self.pool.carried:
            logger.info("partial rollouts: dropping %d carried task(s) at the end", len(self.pool.carried))
            self.pool.drop_stale(version, -1)
        self.resume(version)

    def metrics(
        self, results: list[TaskResult], experiences: list[Experience], version: int
    ) -> dict[str, float]:
        """``rollout/partial_rollout/...``: tasks carried out of the step, carried tasks that
        finished in it (``resumed_tasks``), those dropped for staleness since the last step, and
        the lag of each response token written, in model versions behind ``version`` (mean, max;
        tokens without ``token_versions`` were sampled in this step)."""
        lags: list[float] = []
        for exp in experiences:
            if exp.token_versions is not None:
                lags.extend((version - exp.token_versions).tolist())
            else:
                lags.extend([0.0] * exp.response_length)
        out = {
            "rollout/partial_rollout/carried_tasks": float(len(self.pool.carried)),
            "rollout/partial_rollout/resumed_tasks": float(sum(r.resumed for r in results)),
            "rollout/partial_rollout/stale_dropped_tasks": float(self.stale_dropped),
        }
        self.stale_dropped = 0
        if lags:
            out["rollout/partial_rollout/token_version_lag_mean"] = math.fsum(lags) / len(lags)
            out["rollout/partial_rollout/token_version_lag_max"] = float(max(lags))
        return out
