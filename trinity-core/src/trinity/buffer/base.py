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

    def finish(self) -> None:
        """Tell readers that this writer will write no more."""


@runtime_checkable
class BufferReader(Protocol):
    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Return up to ``batch_size`` unread experiences, each exactly once.

        Blocks until ``batch_size`` are available or ``timeout`` seconds pass (then returns
        what it has); raises :class:`BufferExhausted` when nothing more can come.
        """

    def state_dict(self) -> dict[str, Any]:
        """Reader position, saved in checkpoints."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Experience buffers (``sql``, and ``queue`` with an SQL mirror) also make the
        experiences this reader consumed *after* saving ``state`` unread again: the trainer
        steps that trained on them were lost with the crash. Readers may offer
        ``set_step(step)`` to record which trainer step consumed each experience.
        """
