"""The reader/writer interfaces every buffer storage implements.

``BufferReader``, ``BufferExhausted``, ``STEP_ENDED`` and ``TIMED_OUT`` live in
:mod:`trinity.experience` (components such as sample strategies read Experiences without
depending on the buffer layer) and are re-exported here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from trinity.experience import STEP_ENDED, TIMED_OUT, BufferExhausted, BufferReader

if TYPE_CHECKING:
    from trinity.experience import Experience

__all__ = [
    "GONE_WRITER_GRACE_S",
    "STEP_ENDED",
    "TIMED_OUT",
    "BufferExhausted",
    "BufferReader",
    "BufferWriter",
    "ReaderBase",
    "WriterBase",
]


@runtime_checkable
class BufferWriter(Protocol):
    def write(self, experiences: Sequence[Experience]) -> None:
        """Append experiences durably (or hand them to the storage actor)."""

    def end_step(self, step: int) -> None:
        """Tell readers that every experience of this writer's steps up to ``step`` is
        written. A reader waiting for a batch those steps did not fill (tasks failed or were
        dropped) then returns what there is instead of waiting for experiences that will
        not come (see :meth:`BufferReader.expect_step`)."""

    def finish(self) -> None:
        """Tell readers that this writer will write no more."""

    def metrics(self) -> dict[str, float]:
        """What this writer counted so far (``buffer/written``, ``buffer/duplicates_skipped``)."""


class WriterBase:
    """Defaults for :class:`BufferWriter` implementations: ``end_step`` does nothing (for
    storages whose readers never wait, such as files) and there are no metrics."""

    def end_step(self, step: int) -> None:
        """Nothing to tell: this storage's readers do not wait for writers."""

    def metrics(self) -> dict[str, float]:
        """What this writer counted (``buffer/...``); none by default."""
        return {}


class ReaderBase:
    """Defaults for :class:`BufferReader` implementations: the expected step is remembered in
    :attr:`expected_step` (storages with writers use it) and :attr:`short_reason` starts unset."""

    short_reason: str | None = None
    expected_step: int | None = None

    def expect_step(self, step: int | None) -> None:
        """Remember ``step`` for the next reads (see :meth:`BufferReader.expect_step`)."""
        self.expected_step = step

    def set_step(self, step: int | None) -> None:
        """The trainer step the next reads are for; storages that record which step consumed
        a row (SQL: ``consumed_step``) override this."""


#: Seconds a read still waits once every open writer's process is gone (killed), for a
#: restarted explorer to take over; then it returns short (``TIMED_OUT``, its reader's
#: ``writers_gone`` saying why).
GONE_WRITER_GRACE_S = 300.0


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(0) succeeded


def gone_processes(processes: Iterable[tuple[int | None, str | None]]) -> list[str]:
    """``pid N on HOST`` for each writer process (``(pid, host)``) on this host that no longer
    runs; processes on other hosts cannot be seen from here and are never reported gone."""
    here = socket.gethostname()
    return [f"pid {pid} on {host}" for pid, host in processes if pid and host == here and not pid_alive(pid)]


def writers_gone_line(buffer: str, gone: Sequence[str]) -> str:
    """Why a read stopped waiting: every writer of ``buffer`` (e.g. ``SQL buffer 'exp'``) is gone."""
    return f"every writer of {buffer} is gone without finishing ({', '.join(gone)}: killed?) and no explorer took over"
