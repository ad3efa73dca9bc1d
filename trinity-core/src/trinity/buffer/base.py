"""The reader/writer interfaces every buffer storage implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trinity.experience import Experience


class BufferExhausted(Exception):
    """Raised by a reader when no more data will ever come (finite source, writers done)."""


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


# Why a read returned fewer experiences than asked (BufferReader.short_reason).
STEP_ENDED = "step ended"  # the writers ended the expected step: nothing more is coming for it
TIMED_OUT = "timed out"  # the read's timeout passed first


@runtime_checkable
class BufferReader(Protocol):
    short_reason: str | None

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Return up to ``batch_size`` unread experiences, each exactly once.

        Blocks until ``batch_size`` are available, or the writers ended the step given to
        :meth:`expect_step` and nothing is left unread, or ``timeout`` seconds pass; then
        returns what it has (possibly nothing; :attr:`short_reason` says why it is short).
        Raises :class:`BufferExhausted` when nothing more can come.
        """

    def expect_step(self, step: int | None) -> None:
        """The next reads wait for the experiences of the writers' steps up to ``step``
        (``None``: for a full batch). Readers of storages without writers ignore it."""

    def state_dict(self) -> dict[str, Any]:
        """Reader position, saved in checkpoints."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Experience buffers (``sql``, and ``queue`` with an SQL mirror) also make the
        experiences this reader consumed *after* saving ``state`` unread again: the trainer
        steps that trained on them were lost with the crash. Readers may offer
        ``set_step(step)`` to record which trainer step consumed each experience.
        """


class WriterBase:
    """Defaults for :class:`BufferWriter` implementations: ``end_step`` does nothing (for
    storages whose readers never wait, such as files)."""

    def end_step(self, step: int) -> None:
        """Nothing to tell: this storage's readers do not wait for writers."""


class ReaderBase:
    """Defaults for :class:`BufferReader` implementations: the expected step is remembered in
    :attr:`expected_step` (storages with writers use it) and :attr:`short_reason` starts unset."""

    short_reason: str | None = None
    expected_step: int | None = None

    def expect_step(self, step: int | None) -> None:
        """Remember ``step`` for the next reads (see :meth:`BufferReader.expect_step`)."""
        self.expected_step = step
