"""Queue experience storage: a bounded in-memory queue served by a named Ray actor.

The explorer's writers and the trainer's readers find the same actor by the buffer's ``name``.
Experiences travel as serialised rows (``SQLStorage.rows_for``), so the actor never imports
torch. With ``path`` set, every row is mirrored to SQL *before* it is acknowledged and marked
consumed when it is read; an actor that restarts reloads the unread rows, so a crash loses nothing.
The mirror also makes writes idempotent: rows whose experience id (``eid.uid``) it already holds
are skipped, counted (``stats()["duplicates"]``, writer metrics) and logged.

Optional priority replay (``replay_buffer.enable`` or ``use_priority_queue``): rows are read
highest priority first, and with ``reuse_cooldown_time`` a row read is put back after that many
seconds with its use count increased (its priority recomputed), so good experiences are replayed.
When a priority queue is full, the lowest-priority row is dropped instead of blocking writers.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import (
    GONE_WRITER_GRACE_S,
    STEP_ENDED,
    TIMED_OUT,
    BufferExhausted,
    ReaderBase,
    WriterBase,
    gone_processes,
    writers_gone_line,
)

if TYPE_CHECKING:
    from trinity.experience import Experience

logger = logging.getLogger(__name__)


def linear_decay(model_version: int, use_count: int, decay: float = 2.0) -> float:
    """Trinity-RFT's ``linear_decay``: newer weights first, each reuse costs ``decay``."""
    return model_version - decay * use_count


def decay_limit_randomization(
    model_version: int,
    use_count: int,
    decay: float = 2.0,
    use_count_limit: int = 3,
    sigma: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """Trinity-RFT's ``decay_limit_randomization``: :func:`linear_decay` plus Gaussian noise of
    standard deviation ``sigma``; an experience is replayed while its use count is under
    ``use_count_limit`` (0: without limit), see :func:`replay_limit`."""
    priority = linear_decay(model_version, use_count, decay)
    if sigma > 0:
        priority += (rng or random).gauss(0.0, sigma)
    return priority


def replay_limit(name: str | None, args: Mapping[str, Any] | None = None) -> int | None:
    """Most uses of one experience under priority function ``name`` (``None``: no limit)."""
    if (name or "linear_decay") != "decay_limit_randomization":
        return None
    limit = int(dict(args or {}).get("use_count_limit", 3))
    return limit if limit > 0 else None


PRIORITY_FNS: dict[str, Callable[..., float]] = {
    "linear_decay": linear_decay,
    "decay_limit_randomization": decay_limit_randomization,
}


def resolve_priority_fn(
    name: str | None, args: Mapping[str, Any] | None = None
) -> Callable[[int, int], float]:
    """``f(model_version, use_count) -> priority`` for a ``priority_fn`` name from the config."""
    name = name or "linear_decay"
    if name not in PRIORITY_FNS:
        raise ValueError(
            f"unknown replay_buffer.priority_fn {name!r}; known: {', '.join(sorted(PRIORITY_FNS))}"
        )
    fn, kwargs = PRIORITY_FNS[name], dict(args or {})
    if name == "decay_limit_randomization":
        kwargs.setdefault("rng", random.Random(0))  # seeded: replay order is reproducible
    return lambda version, uses: fn(version, uses, **kwargs)


#: Seconds between the checks of a waiting read for writers whose process is gone.
GONE_CHECK_S = 2.0


class QueueActor:
    """Body of the Ray actor (instantiated through :func:`get_queue_actor`).

    Args:
        name: buffer name (for messages).
        capacity: most rows held in memory; FIFO writers wait for room.
        mirror_url: SQLAlchemy URL to mirror rows to, or ``None``.
        priority: use a priority queue (see the module docstring).
        priority_fn / priority_fn_args: how priorities are computed (``linear_decay``, or
            ``decay_limit_randomization``, which also retires an experience after
            ``use_count_limit`` uses).
        reuse_cooldown_time: seconds before a read row is offered again; ``None`` = never.
    """

    def __init__(
        self,
        name: str,
        capacity: int = 10000,
        mirror_url: str | None = None,
        priority: bool = False,
        priority_fn: str | None = None,
        priority_fn_args: Mapping[str, Any] | None = None,
        reuse_cooldown_time: float | None = None,
    ) -> None:
        self.name = name
        self.capacity = max(1, int(capacity))
        self.priority = priority
        self.reuse_cooldown_time = reuse_cooldown_time
        self._prio = resolve_priority_fn(priority_fn, priority_fn_args)
        self._use_limit = replay_limit(priority_fn, priority_fn_args)
        # (row id in the mirror, blob, explorer step or None when unknown)
        self._fifo: deque[tuple[int | None, bytes, int | None]] = deque()
        # Sorted ascending by (priority, -seq): the best row is last, ties read oldest first.
        self._sorted: list[tuple[tuple[float, int], int | None, bytes, int, int, int | None]] = []
        self._seq = itertools.count()
        self._cond = asyncio.Condition()
        self._writers: dict[str, bool] = {}
        self._ended_steps: dict[str, int] = {}  # writer -> last step it has written in full
        self._runs: dict[str, str | None] = {}  # writer -> the run it writes for
        self._procs: dict[str, tuple[int, str]] = {}  # writer -> (pid, host) of its process
        self._jobs: set[str] = set()  # the `trinity run` jobs using this queue
        self.dropped = 0
        self.retired = 0  # experiences replayed as often as the priority function allows
        self.duplicates = 0
        self.mirror = None
        if mirror_url:
            from trinity.buffer.sql import SQLStorage

            self.mirror = SQLStorage(mirror_url, name)
            # After a crash or restart the unread mirrored rows come back first, in write order.
            for row_id, blob, step in self.mirror.unread("fifo"):
                self._push(row_id, blob, 0, 0, step)

    # -- internal --------------------------------------------------------------------------

    def _size(self) -> int:
        return len(self._sorted) if self.priority else len(self._fifo)

    def _push(
        self, row_id: int | None, blob: bytes, model_version: int, use_count: int, step: int | None
    ) -> None:
        if not self.priority:
            self._fifo.append((row_id, blob, step))
            return
        key = (self._prio(model_version, use_count), -next(self._seq))
        bisect.insort(self._sorted, (key, row_id, blob, model_version, use_count, step))
        if len(self._sorted) > self.capacity:
            self._sorted.pop(0)
            self.dropped += 1

    def _pop(
        self, n: int, max_step: int | None = None
    ) -> list[tuple[int | None, bytes, int, int, int | None]]:
        """Up to ``n`` rows in read order; with ``max_step``, only rows of explorer steps up to
        it (or of no known step): the others keep their places for later reads."""
        out: list[tuple[int | None, bytes, int, int, int | None]] = []
        if n <= 0:
            return out

        def readable(step: int | None) -> bool:
            return max_step is None or step is None or step <= max_step

        if self.priority:
            for i in range(len(self._sorted) - 1, -1, -1):
                if len(out) >= n:
                    break
                if readable(self._sorted[i][5]):
                    _, row_id, blob, version, uses, step = self._sorted.pop(i)
                    out.append((row_id, blob, version, uses, step))
            return out
        while len(out) < n and self._fifo and readable(self._fifo[0][2]):
            row_id, blob, step = self._fifo.popleft()
            out.append((row_id, blob, 0, 0, step))
        if len(out) >= n or not self._fifo:
            return out
        # A later step's row is first in line: take the readable rows queued behind it.
        kept: deque[tuple[int | None, bytes, int | None]] = deque()
        while self._fifo:
            row = self._fifo.popleft()
            if len(out) < n and readable(row[2]):
                out.append((row[0], row[1], 0, 0, row[2]))
            else:
                kept.append(row)
        self._fifo = kept
        return out

    async def _reinsert_later(self, items: list[tuple[int | None, bytes, int, int, int | None]]) -> None:
        await asyncio.sleep(self.reuse_cooldown_time or 0.0)
        async with self._cond:
            for row_id, blob, version, uses, step in items:
                if self._use_limit is not None and uses + 1 >= self._use_limit:
                    self.retired += 1  # used use_count_limit times: not replayed again
                    continue
                self._push(row_id, blob, version, uses + 1, step)
            self._cond.notify_all()

    # -- remote methods --------------------------------------------------------------------

    async def register_writer(
        self, writer_id: str, run: str | None = None, pid: int | None = None, host: str | None = None
    ) -> None:
        """Record a writer (readers wait for all writers to finish before giving up). A run
        has one writer at a time: its earlier open writers (a killed explorer's) finish.
        ``pid``/``host`` let :meth:`gone_writers` tell a killed writer from a slow one."""
        async with self._cond:
            if pid is not None and host is not None:
                self._procs[writer_id] = (pid, host)
            if run is not None:
                for other, other_run in self._runs.items():
                    if other_run == run and other != writer_id:
                        self._writers[other] = True
            self._runs[writer_id] = run
            self._writers.setdefault(writer_id, False)
            self._cond.notify_all()

    async def end_step(self, writer_id: str, step: int) -> None:
        """Record that ``writer_id`` has put every experience of its steps up to ``step``,
        and wake readers (a short batch may now be all there is)."""
        async with self._cond:
            self._writers.setdefault(writer_id, False)
            self._ended_steps[writer_id] = step
            self._cond.notify_all()

    def _steps_ended(self, step: int) -> bool:
        open_writers = [w for w, done in self._writers.items() if not done]
        return bool(self._writers) and all(self._ended_steps.get(w, -1) >= step for w in open_writers)

    async def join_job(self, job_id: str) -> int:
        """Record a job that uses this queue (see :func:`trinity.buffer.factory.leave_queue`);
        returns how many use it now."""
        self._jobs.add(job_id)
        return len(self._jobs)

    async def leave_job(self, job_id: str) -> dict[str, Any]:
        """Forget job ``job_id``; ``{"jobs": jobs still using the queue, "size": unread rows
        held, "mirrored": whether an SQL mirror keeps them}``."""
        self._jobs.discard(job_id)
        return {"jobs": len(self._jobs), "size": self._size(), "mirrored": self.mirror is not None}

    async def finish_writer(self, writer_id: str) -> None:
        """Mark a writer done and wake readers (they may now see the end)."""
        async with self._cond:
            self._writers[writer_id] = True
            self._cond.notify_all()

    async def put(self, rows: list[dict[str, Any]]) -> dict[str, int]:
        """Store rows made by ``SQLStorage.rows_for``.

        Returns ``{"size": rows held afterwards, "skipped": rows whose uid the SQL mirror
        already had}`` (a redone explorer step; without a mirror nothing is skipped).
        """
        ids: list[int | None] = [None] * len(rows)
        skipped = 0
        if self.mirror is not None:
            # Durable before acknowledged: a crash after this point loses nothing.
            ids = await asyncio.to_thread(self.mirror.insert_rows, rows)
            keep = [i is not None for i in ids]
            skipped = len(rows) - sum(keep)
            if skipped:
                self.duplicates += skipped
                logger.warning(
                    "queue %r: skipped %d of %d experiences its SQL mirror already holds (same eid.uid)",
                    self.name,
                    skipped,
                    len(rows),
                )
                rows = [r for r, k in zip(rows, keep) if k]
                ids = [i for i in ids if i is not None]
        async with self._cond:
            for row, row_id in zip(rows, ids):
                if not self.priority:
                    await self._cond.wait_for(lambda: len(self._fifo) < self.capacity)
                self._push(
                    row_id, row["blob"], int(row.get("model_version") or 0), 0, row.get("explorer_step")
                )
                self._cond.notify_all()
            return {"size": self._size(), "skipped": skipped}

    def _exhausted(self) -> bool:
        return bool(self._writers) and all(self._writers.values()) and self._size() == 0

    async def get(
        self,
        n: int,
        timeout: float | None,
        reader_id: str | None = None,
        read_seq: int | None = None,
        until_step: int | None = None,
        gone_grace: float | None = None,
    ) -> tuple[list[bytes], str | None] | None:
        """``(blobs, short_reason)``: up to ``n`` blobs, waiting for a full batch until every
        writer has ended step ``until_step`` (if given) or ``timeout`` seconds pass;
        ``short_reason`` says which (``None`` for a full batch). With ``until_step``, rows of
        later explorer steps stay queued (a step's groups and episodes are read together).
        With ``gone_grace``, a read whose open writers' processes are all gone (killed) waits
        at most that long for a new writer, then times out (see :meth:`gone_writers`).
        ``None`` when every writer finished and nothing is left. ``reader_id``/``read_seq``
        are recorded in the SQL mirror (see :meth:`release`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        gone_deadline: float | None = None
        out: list[tuple[int | None, bytes, int, int, int | None]] = []
        reason = None
        async with self._cond:
            while True:
                out.extend(self._pop(n - len(out), until_step))
                self._cond.notify_all()  # wake writers waiting for room
                if len(out) >= n:
                    break
                if self._exhausted() or (until_step is not None and self._steps_ended(until_step)):
                    reason = STEP_ENDED
                    break
                if gone_grace is not None:
                    count, gone = self.gone_writers()
                    if not count or len(gone) < count:
                        gone_deadline = None
                    elif gone_deadline is None:
                        gone_deadline = loop.time() + gone_grace
                stop = min((t for t in (deadline, gone_deadline) if t is not None), default=None)
                remaining = None if stop is None else stop - loop.time()
                if remaining is not None and remaining <= 0:
                    reason = TIMED_OUT
                    break
                if gone_grace is not None:  # look at the writers' processes again in a while
                    remaining = min(remaining if remaining is not None else GONE_CHECK_S, GONE_CHECK_S)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._cond.wait(), remaining)
        if not out and self._exhausted():
            return None
        if self.mirror is not None:
            ids = [i for i, *_ in out if i is not None]
            await asyncio.to_thread(
                functools.partial(self.mirror.claim_ids, ids, reader_id=reader_id, read_seq=read_seq)
            )
        if self.priority and self.reuse_cooldown_time is not None and out:
            asyncio.get_running_loop().create_task(self._reinsert_later(out))
        return [blob for _, blob, *_ in out], reason

    async def release(self, reader_id: str, after_seq: int) -> int | None:
        """Queue again, ahead of everything else and in their original order, the rows that
        ``reader_id`` read after its read number ``after_seq`` (a trainer resumed from a
        checkpoint: the steps that trained on them were lost). Returns how many, or ``None``
        without an SQL mirror, which is the only place read rows are kept."""
        if self.mirror is None:
            return None
        ids = await asyncio.to_thread(self.mirror.release, reader_id, after_seq)
        blobs = await asyncio.to_thread(self.mirror.fetch_blobs, ids)
        steps = await asyncio.to_thread(self.mirror.explorer_steps, ids)
        async with self._cond:
            if self.priority:
                for i in ids:
                    self._push(i, blobs[i], 0, 0, steps.get(i))  # as rows reloaded at start-up
            else:
                self._fifo.extendleft((i, blobs[i], steps.get(i)) for i in reversed(ids))
            self._cond.notify_all()
        return len(ids)

    def gone_writers(self) -> tuple[int, list[str]]:
        """``(open writers, descriptions of those whose process is gone)``; only writers on
        this actor's host can be seen (see :meth:`trinity.buffer.sql.SQLStorage.gone_writers`)."""
        open_writers = [w for w, done in self._writers.items() if not done]
        return len(open_writers), gone_processes(self._procs.get(w, (0, "")) for w in open_writers)

    def stats(self) -> dict[str, Any]:
        """Queue length, capacity, dropped rows and writer states (for monitoring/tests)."""
        return {
            "size": self._size(),
            "capacity": self.capacity,
            "dropped": self.dropped,
            "retired": self.retired,
            "duplicates": self.duplicates,
            "writers": len(self._writers),
            "finished_writers": sum(self._writers.values()),
            "ended_steps": dict(self._ended_steps),
        }


def get_queue_actor(
    name: str,
    *,
    namespace: str | None = None,
    capacity: int = 10000,
    mirror_url: str | None = None,
    priority: bool = False,
    priority_fn: str | None = None,
    priority_fn_args: Mapping[str, Any] | None = None,
    reuse_cooldown_time: float | None = None,
) -> Any:
    """The named queue actor, created on first use (``get_if_exists``) so that every process
    asking for the same buffer name gets the same queue.

    The actor is *detached*: it must outlive whichever process happened to create it (explorer
    or trainer), so it lives until :func:`kill_queue_actor` or the Ray cluster ends.
    """
    import ray

    cls = ray.remote(QueueActor)
    return cls.options(
        name=queue_actor_name(name),
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=1000,
    ).remote(name, capacity, mirror_url, priority, priority_fn, priority_fn_args, reuse_cooldown_time)


def queue_actor_name(name: str) -> str:
    """Ray actor name of the queue of buffer ``name``."""
    return f"trinity_queue_{name}"


def kill_queue_actor(name: str, namespace: str | None = None) -> bool:
    """Stop the queue actor of buffer ``name`` (unread rows stay in its SQL mirror, if any).
    Returns whether there was one."""
    import ray

    try:
        actor = ray.get_actor(queue_actor_name(name), namespace=namespace)
    except ValueError:
        return False
    ray.kill(actor)
    return True


class QueueWriter(WriterBase):
    """:class:`~trinity.buffer.base.BufferWriter` for ``storage_type: queue``; ``run``
    prefixes the experience ids as in :class:`~trinity.buffer.sql_io.SQLWriter`."""

    def __init__(self, actor: Any, name: str = "queue", run: str | None = None) -> None:
        import uuid

        from trinity.buffer.sql import SQLStorage

        self.actor = actor
        self._writer_id = uuid.uuid4().hex
        # Only used for its row layout (no database is opened).
        self._layout = SQLStorage("sqlite://", name)
        self.run = run
        self._registered = False
        self.written = 0
        self.duplicates = 0

    def _register(self) -> None:
        import ray

        if not self._registered:
            import os
            import socket

            ray.get(
                self.actor.register_writer.remote(
                    self._writer_id, self.run, os.getpid(), socket.gethostname()
                )
            )
            self._registered = True

    def write(self, experiences: Sequence[Experience]) -> None:
        """Hand ``experiences`` to the queue actor (blocks while a FIFO queue is full)."""
        import ray

        from trinity.buffer.sql_io import run_uids

        self._register()
        rows = self._layout.rows_for(experiences, self._writer_id, run_uids(self.run, experiences))
        result = ray.get(self.actor.put.remote(rows))
        self.written += len(experiences) - result["skipped"]
        self.duplicates += result["skipped"]

    def metrics(self) -> dict[str, float]:
        """Experiences stored, and duplicates skipped (by the SQL mirror), by this writer."""
        return {"buffer/written": float(self.written), "buffer/duplicates_skipped": float(self.duplicates)}

    def end_step(self, step: int) -> None:
        """Tell readers every experience of this writer's steps up to ``step`` is queued."""
        import ray

        self._register()
        ray.get(self.actor.end_step.remote(self._writer_id, step))

    def finish(self) -> None:
        """Tell readers this writer is done."""
        import ray

        self._register()
        ray.get(self.actor.finish_writer.remote(self._writer_id))


class QueueReader(ReaderBase):
    """:class:`~trinity.buffer.base.BufferReader` for ``storage_type: queue``.

    ``read`` waits up to ``timeout`` (default ``max_read_timeout``) for a full batch, then
    returns what it has. As :class:`~trinity.buffer.sql_io.SQLReader`, it numbers its reads;
    with an SQL mirror, :meth:`load_state_dict` queues again the rows read after that state.
    """

    #: Seconds a read still waits once every open writer's process is gone.
    gone_writer_grace_s: float = GONE_WRITER_GRACE_S

    def __init__(self, actor: Any, max_read_timeout: float | None = 1800.0, name: str = "queue") -> None:
        import uuid

        self.writers_gone: str | None = None
        self.actor = actor
        self.max_read_timeout = max_read_timeout
        self.name = name
        self.rows_read = 0
        self.reader_id = uuid.uuid4().hex
        self.read_seq = 0
        self.released = 0

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Up to ``batch_size`` experiences; :class:`BufferExhausted` when writers are done."""
        import ray

        from trinity.experience import Experience

        timeout = self.max_read_timeout if timeout is None else timeout
        self.read_seq += 1
        got = ray.get(
            self.actor.get.remote(
                batch_size,
                timeout,
                self.reader_id,
                self.read_seq,
                self.expected_step,
                self.gone_writer_grace_s,
            )
        )
        if got is None:
            raise BufferExhausted(f"queue buffer {self.name!r}: all writers finished")
        blobs, self.short_reason = got
        self.writers_gone = None
        if self.short_reason == TIMED_OUT:
            count, gone = ray.get(self.actor.gone_writers.remote())
            if count and len(gone) == count:
                self.writers_gone = writers_gone_line(f"queue buffer {self.name!r}", gone)
        self.rows_read += len(blobs)
        return [Experience.deserialize(b) for b in blobs]

    def state_dict(self) -> dict[str, Any]:
        """This reader's id and read number (and a row counter for monitoring)."""
        return {"rows_read": self.rows_read, "reader_id": self.reader_id, "read_seq": self.read_seq}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue as the reader that saved ``state``; rows it read after saving it are queued
        again when the queue has an SQL mirror (``path``), and reported lost otherwise."""
        import ray

        self.rows_read = int(state.get("rows_read", 0))
        if "reader_id" not in state:
            return
        self.reader_id, self.read_seq = str(state["reader_id"]), int(state["read_seq"])
        released = ray.get(self.actor.release.remote(self.reader_id, self.read_seq))
        if released is None:
            logger.warning(
                "queue buffer %r has no SQL mirror (path): experiences read after the checkpoint "
                "cannot be given back, so the resumed trainer will not see them",
                self.name,
            )
            return
        self.released = released
        if released:
            logger.info(
                "queue buffer %r: %d experiences read after the checkpoint are queued again",
                self.name,
                released,
            )
