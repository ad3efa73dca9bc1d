"""The explorer's writer and the trainer's reader of an SQL experience buffer
(:class:`~trinity.buffer.sql.SQLStorage` holds the storage itself)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import (
    GONE_WRITER_GRACE_S,
    STEP_ENDED,
    TIMED_OUT,
    BufferExhausted,
    ReaderBase,
    WriterBase,
    writers_gone_line,
)

if TYPE_CHECKING:
    from trinity.buffer.sql import SQLStorage
    from trinity.experience import Experience

logger = logging.getLogger(__name__)


def unique_uids(experiences: Sequence[Experience]) -> list[str]:
    """``eid.uid`` of each experience; repeats *within* one batch get ``#1``, ``#2``...

    Repeats inside a batch are distinct experiences from a workflow that did not number them
    (several per run, same ``eid.step``), never a redone write, so they must all be kept. The
    suffix depends only on the position in the batch, so a redone step maps to the same keys.
    """
    seen: dict[str, int] = {}
    out = []
    for exp in experiences:
        uid = exp.eid.uid
        n = seen.get(uid, 0)
        seen[uid] = n + 1
        out.append(uid if n == 0 else f"{uid}#{n}")
    return out


def run_uids(run: str | None, experiences: Sequence[Experience]) -> list[str] | None:
    """The stored ids of ``experiences`` written by run ``run``: ``<run>:<eid.uid>``, so two
    runs sharing a buffer never collide (``None``: no run, plain ``eid.uid``)."""
    if run is None:
        return None
    return [f"{run}:{uid}" for uid in unique_uids(experiences)]


class SQLWriter(WriterBase):
    """:class:`~trinity.buffer.base.BufferWriter` for ``storage_type: sql``.

    Experiences whose id is stored already (an explorer step redone after a crash, before
    the explorer saved its position) are skipped, counted in :meth:`metrics` and reported in
    one log line per write. ``run`` (the job's run, see :func:`run_uids`) prefixes the ids.
    """

    def __init__(self, storage: SQLStorage, run: str | None = None) -> None:
        self.storage = storage
        self.run = run
        self._writer_id: str | None = None
        self.written = 0
        self.duplicates = 0

    def _register(self) -> str:
        if self._writer_id is None:
            self._writer_id = self.storage.register_writer(self.run)
        return self._writer_id

    def write(self, experiences: Sequence[Experience]) -> None:
        """Store ``experiences`` in one transaction."""
        writer_id = self._register()
        stored = self.storage.write(experiences, writer_id, run_uids(self.run, experiences))
        skipped = len(experiences) - stored
        self.written += stored
        if skipped:
            self.duplicates += skipped
            logger.warning(
                "SQL buffer %r: skipped %d of %d experiences already stored (same eid.uid, e.g. %s); "
                "expected after an explorer step was redone on restart",
                self.storage.table_name,
                skipped,
                len(experiences),
                experiences[0].eid.uid,
            )

    def end_step(self, step: int) -> None:
        """Tell readers every experience of this writer's steps up to ``step`` is stored."""
        self.storage.end_step(self._register(), step)

    def finish(self) -> None:
        """Tell readers this writer is done (registers it first if it never wrote)."""
        self.storage.finish_writer(self._register())

    def metrics(self) -> dict[str, float]:
        """Experiences stored, and duplicates skipped, by this writer so far."""
        return {"buffer/written": float(self.written), "buffer/duplicates_skipped": float(self.duplicates)}


class SQLReader(ReaderBase):
    """:class:`~trinity.buffer.base.BufferReader` for ``storage_type: sql``.

    ``read`` polls the table (backing off up to ``poll_interval`` seconds) until ``batch_size``
    rows are claimed, or the writers ended the step given to :meth:`expect_step` and no row of
    it is left unread, or ``timeout`` (default ``max_read_timeout``) passes. Rows of explorer
    steps after the expected one stay for later reads, so an explorer running ahead never has
    part of its next step (some of a group, some turns of an episode) taken early.

    Every ``read`` call has a sequence number, stored with the rows it claims together with
    this reader's id (and the trainer step given to :meth:`set_step`). :meth:`state_dict`
    saves both; :meth:`load_state_dict` makes the rows this reader claimed *after* that state
    unread again, so a trainer resumed from checkpoint N trains again on exactly what the lost
    steps after N had consumed, in the same order, and on nothing twice.
    """

    #: Seconds a read still waits once every open writer's process is gone (killed), for a
    #: restarted explorer to take over; then it returns short (``TIMED_OUT``, with
    #: :attr:`writers_gone` saying why).
    gone_writer_grace_s: float = GONE_WRITER_GRACE_S
    #: Seconds between the checks for gone writers while a read waits.
    gone_writer_check_s: float = 2.0

    def __init__(
        self,
        storage: SQLStorage,
        *,
        order: str = "fifo",
        max_read_timeout: float | None = 1800.0,
        poll_interval: float = 0.2,
    ) -> None:
        self.storage = storage
        self.writers_gone: str | None = None
        self.order = order
        self.max_read_timeout = max_read_timeout
        self.poll_interval = poll_interval
        self.rows_read = 0
        self.reader_id = uuid.uuid4().hex
        self.read_seq = 0
        self.step: int | None = None
        self.released = 0

    def set_step(self, step: int | None) -> None:
        """The trainer step the next reads are for (stored as ``consumed_step``)."""
        self.step = step

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Claim and return up to ``batch_size`` experiences (see the class docstring)."""
        from trinity.experience import Experience

        timeout = self.max_read_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        self.read_seq += 1
        got: list[tuple[int, bytes]] = []
        wait = 0.005

        def claim() -> None:
            got.extend(
                self.storage.claim(
                    batch_size - len(got),
                    self.order,
                    reader_id=self.reader_id,
                    read_seq=self.read_seq,
                    step=self.step,
                    max_step=self.expected_step,
                )
            )

        gone_check = time.monotonic() + self.gone_writer_check_s
        gone_deadline: float | None = None
        while True:
            claim()
            if len(got) >= batch_size:
                self.short_reason = None
                break
            if not got and self.storage.exhausted():
                raise BufferExhausted(f"SQL buffer {self.storage.table_name!r}: all writers finished")
            if got and self.storage.exhausted():
                self.short_reason = STEP_ENDED  # the last batch of a finished buffer
                break
            step = self.expected_step
            if step is not None and self.storage.steps_ended(step):
                # Rows are written before their step is ended: one more claim takes any that
                # came since the last one, and then nothing of the expected steps is left.
                claim()
                self.short_reason = None if len(got) >= batch_size else STEP_ENDED
                break
            now = time.monotonic()
            if now >= gone_check:
                gone_check = now + self.gone_writer_check_s
                gone_deadline = self._check_gone_writers(gone_deadline)
            if gone_deadline is not None and now >= gone_deadline:
                self.short_reason = TIMED_OUT
                break
            if deadline is not None and now >= deadline:
                self.short_reason = TIMED_OUT
                break
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            wait = min(wait * 2, self.poll_interval)
        self.rows_read += len(got)
        return [Experience.deserialize(blob) for _, blob in got]

    def _check_gone_writers(self, gone_deadline: float | None) -> float | None:
        """While a read waits: when every open writer's process is gone (an explorer killed
        before it could finish), say so once and give a restarted explorer
        :attr:`gone_writer_grace_s` to take over; returns the time the read stops waiting
        (``None``: a writer is alive). :attr:`writers_gone` describes the gone writers."""
        count, gone = self.storage.gone_writers()
        if not count or len(gone) < count:
            self.writers_gone = None
            return None
        if gone_deadline is None:
            self.writers_gone = writers_gone_line(f"SQL buffer {self.storage.table_name!r}", gone)
            logger.warning(
                "SQL buffer %r: its writers (%s) are gone without finishing; waiting up to %g s for a "
                "restarted explorer",
                self.storage.table_name,
                ", ".join(gone),
                self.gone_writer_grace_s,
            )
            return time.monotonic() + self.gone_writer_grace_s
        return gone_deadline

    def state_dict(self) -> dict[str, Any]:
        """This reader's id and read sequence number (and a row counter for monitoring)."""
        return {"rows_read": self.rows_read, "reader_id": self.reader_id, "read_seq": self.read_seq}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue as the reader that saved ``state``: rows it claimed after saving it are
        made unread again (their training was lost with the steps after the checkpoint)."""
        self.rows_read = int(state.get("rows_read", 0))
        if "reader_id" not in state:
            return  # a state from before read sequences were recorded: nothing to give back
        self.reader_id = str(state["reader_id"])
        self.read_seq = int(state["read_seq"])
        self.released = len(self.storage.release(self.reader_id, self.read_seq))
        if self.released:
            logger.info(
                "SQL buffer %r: %d experiences read after the checkpoint are unread again",
                self.storage.table_name,
                self.released,
            )
