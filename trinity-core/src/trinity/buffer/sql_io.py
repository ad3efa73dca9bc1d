"""The explorer's writer and the trainer's reader of an SQL experience buffer
(:class:`~trinity.buffer.sql.SQLStorage` holds the storage itself)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import BufferExhausted

if TYPE_CHECKING:
    from trinity.buffer.sql import SQLStorage
    from trinity.experience import Experience

logger = logging.getLogger(__name__)


class SQLWriter:
    """:class:`~trinity.buffer.base.BufferWriter` for ``storage_type: sql``.

    Experiences whose ``eid.uid`` is stored already (an explorer step redone after a crash,
    before the explorer saved its position) are skipped, counted in :meth:`metrics` and
    reported in one log line per write.
    """

    def __init__(self, storage: SQLStorage) -> None:
        self.storage = storage
        self._writer_id: str | None = None
        self.written = 0
        self.duplicates = 0

    def write(self, experiences: Sequence[Experience]) -> None:
        """Store ``experiences`` in one transaction."""
        if self._writer_id is None:
            self._writer_id = self.storage.register_writer()
        stored = self.storage.write(experiences, self._writer_id)
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

    def finish(self) -> None:
        """Tell readers this writer is done (registers it first if it never wrote)."""
        if self._writer_id is None:
            self._writer_id = self.storage.register_writer()
        self.storage.finish_writer(self._writer_id)

    def metrics(self) -> dict[str, float]:
        """Experiences stored, and duplicates skipped, by this writer so far."""
        return {"buffer/written": float(self.written), "buffer/duplicates_skipped": float(self.duplicates)}


class SQLReader:
    """:class:`~trinity.buffer.base.BufferReader` for ``storage_type: sql``.

    ``read`` polls the table (backing off up to ``poll_interval`` seconds) until ``batch_size``
    rows are claimed or ``timeout`` (default ``max_read_timeout``) passes.

    Every ``read`` call has a sequence number, stored with the rows it claims together with
    this reader's id (and the trainer step given to :meth:`set_step`). :meth:`state_dict`
    saves both; :meth:`load_state_dict` makes the rows this reader claimed *after* that state
    unread again, so a trainer resumed from checkpoint N trains again on exactly what the lost
    steps after N had consumed, in the same order, and on nothing twice.
    """

    def __init__(
        self,
        storage: SQLStorage,
        *,
        order: str = "fifo",
        max_read_timeout: float | None = 1800.0,
        poll_interval: float = 0.2,
    ) -> None:
        self.storage = storage
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
        while True:
            got.extend(
                self.storage.claim(
                    batch_size - len(got),
                    self.order,
                    reader_id=self.reader_id,
                    read_seq=self.read_seq,
                    step=self.step,
                )
            )
            if len(got) >= batch_size:
                break
            if not got and self.storage.exhausted():
                raise BufferExhausted(f"SQL buffer {self.storage.table_name!r}: all writers finished")
            if got and self.storage.exhausted():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            wait = min(wait * 2, self.poll_interval)
        self.rows_read += len(got)
        return [Experience.deserialize(blob) for _, blob in got]

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
