"""The batching scheduler of the ``transformers`` engine (see :mod:`.transformers_engine`).

Concurrent calls queue; whichever caller holds the engine's lock runs the next batch: every
queued call with the same sampling arguments but the seed, up to ``max_batch_size`` sequences,
after waiting a little for the calls of the runner tasks using the engine (:meth:`caller`).
Streamed calls share batches like any other; closing a stream cancels its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.rollout.base import SamplingArgs, StreamEnd, StreamItem, TokenDelta
from trinity.rollout.sampling import row_seeds

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class CallCancelled(Exception):
    """A streamed call whose stream was closed before it finished."""


#: ``sink(sample_index, token_ids, logprobs)``: new tokens of one sample of a streamed call.
Sink = Callable[[int, list[int], list[float]], None]


@dataclass(eq=False)
class QueuedCall:
    """One queued ``generate_tokens`` call, answered by whichever thread runs its batch.

    A streamed call has a ``sink`` (called from the thread running the batch) and is
    ``cancelled`` when its stream is closed before the end.
    """

    prompts: list[list[int]]
    args: SamplingArgs
    sink: Sink | None = None
    cancelled: bool = False
    result: list[list[Any]] | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class BatchScheduler:
    """The queue, batching and streaming side of :class:`~.transformers_engine.TransformersEngine`.

    The engine calls :meth:`_init_scheduler` in its ``__init__`` and provides ``_generate``
    (one batch of prompts, run on its compute thread) and ``_on_compute_thread``.
    """

    _generate: Callable[..., list[list[Any]]]
    _on_compute_thread: Callable[..., Any]

    def _init_scheduler(self, max_batch_size: int, batch_wait: float, batch_gap: float, seed: int) -> None:
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()  # held while the model generates
        self._queue_lock = threading.Lock()  # guards _queue
        self._queue: list[QueuedCall] = []
        # Notified when a call is queued or a runner task ends (see _gather).
        self._arrival = threading.Condition(self._queue_lock)
        self._callers = 0  # runner tasks using the engine now (caller())
        self.batch_wait, self.batch_gap = batch_wait, batch_gap
        #: ``generate`` batches run and calls they answered (see :meth:`generate_tokens`).
        self.batches_run = 0
        self.calls_batched = 0
        #: streamed calls dropped or stopped because their stream was closed early.
        self.calls_cancelled = 0
        #: Seconds spent generating batches so far (the explorer reports it per step).
        self.generate_seconds = 0.0
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    @contextlib.contextmanager
    def caller(self) -> Any:
        """Marks one runner task using the engine while the block runs: ``generate`` waits a
        little for the calls of such tasks so that one batch serves them all."""
        with self._arrival:
            self._callers += 1
        try:
            yield
        finally:
            with self._arrival:
                self._callers -= 1
                self._arrival.notify_all()

    def _gather(self) -> None:
        """Under ``_lock``, before a batch is taken: wait for the other runner tasks' calls."""
        if self.batch_wait <= 0:
            return
        now = time.monotonic()
        deadline = now + self.batch_wait
        with self._arrival:
            seen, last = len(self._queue), now
            while len(self._queue) < self._callers:
                now = time.monotonic()
                wake = min(deadline, last + self.batch_gap)
                if now >= wake:
                    return
                self._arrival.wait(wake - now)
                if len(self._queue) != seen:
                    seen, last = len(self._queue), time.monotonic()

    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Any]]:
        return self._serve(QueuedCall(self._checked(prompts), args))

    @staticmethod
    def _checked(prompts: list[list[int]]) -> list[list[int]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot generate from an empty prompt (0 tokens)")
        return prompts

    def _serve(self, call: QueuedCall) -> list[list[Any]]:
        """Queue ``call`` and wait for its answer (running its batch if nobody took it)."""
        with self._arrival:
            self._queue.append(call)
            self._arrival.notify_all()
        with self._lock:
            if not call.done:  # nobody took it while we waited: run it, and whatever matches it
                self._run_batch(call)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    async def generate_tokens_stream(
        self, prompts: list[list[int]], args: SamplingArgs
    ) -> AsyncIterator[StreamItem]:
        """Each step's tokens of each sample as they are sampled, then the Experiences (see the
        module docstring). Closing the iterator early cancels the call."""
        self._checked(prompts)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[StreamItem | BaseException] = asyncio.Queue()

        def push(item: StreamItem | BaseException) -> None:  # from the thread running the batch
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
                loop.call_soon_threadsafe(items.put_nowait, item)

        call = QueuedCall(prompts, args, sink=lambda i, ids, lps: push(TokenDelta(i, ids, lps)))

        def serve() -> None:
            try:
                push(StreamEnd([exp for group in self._serve(call) for exp in group]))
            except BaseException as exc:  # handed to the stream's reader
                push(exc)

        loop.run_in_executor(None, serve)
        finished = False
        try:
            while True:
                item = await items.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if isinstance(item, StreamEnd):
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:  # closed early (a client went away): stop sampling for it
                call.cancelled = True

    def _run_batch(self, leader: QueuedCall) -> None:
        """Under ``_lock``: one ``generate`` for ``leader`` and the queued calls with its args."""
        self._gather()
        shape = dataclasses.replace(leader.args, seed=None)
        budget = max(self.max_batch_size, len(leader.prompts) * leader.args.n)
        with self._queue_lock:
            batch, rest, size = [], [], 0
            for call in self._queue:
                if call.cancelled:
                    self._cancel(call)
                    continue
                fits = size + len(call.prompts) * call.args.n <= budget
                if call is leader or (fits and dataclasses.replace(call.args, seed=None) == shape):
                    batch.append(call)
                    size += len(call.prompts) * call.args.n
                else:
                    rest.append(call)
            self._queue = rest
        if not batch:  # the leader was cancelled while it waited
            return
        try:
            seeds: list[int] = []
            owners: list[tuple[QueuedCall, int]] = []
            for call in batch:
                seed = call.args.seed
                if seed is None:  # the engine's stream, in the order calls are served
                    seed = int(torch.randint(2**62, (1,), generator=self._generator))
                seeds.extend(row_seeds(seed, len(call.prompts), call.args.n))
                owners.extend((call, i) for i in range(len(call.prompts)))
            started = time.perf_counter()
            try:
                prompts = [p for call in batch for p in call.prompts]
                groups = self._on_compute_thread(self._generate, prompts, shape, seeds, owners)
            finally:
                self.generate_seconds += time.perf_counter() - started
        except BaseException as exc:  # every caller of the batch sees the failure
            for call in batch:
                call.error = exc
            return
        start = 0
        for call in batch:
            if call.cancelled:
                self._cancel(call)
            else:
                call.result = groups[start : start + len(call.prompts)]
            start += len(call.prompts)
        self.batches_run += 1
        self.calls_batched += len(batch)

    def _cancel(self, call: QueuedCall) -> None:
        call.error = CallCancelled("the call was cancelled (its stream was closed)")
        self.calls_cancelled += 1
