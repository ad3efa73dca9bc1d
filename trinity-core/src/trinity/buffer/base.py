"""The reader/writer interfaces every buffer storage implements.

``BufferReader``, ``BufferExhausted``, ``STEP_ENDED`` and ``TIMED_OUT`` live in
:mod:`trinity.experience` (components such as sample strategies read Experiences without
depending on the buffer layer) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from trinity.experience import STEP_ENDED, TIMED_OUT, BufferExhausted, BufferReader

if TYPE_CHECKING:
    from trinity.experience import Experience

__all__ = [
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
