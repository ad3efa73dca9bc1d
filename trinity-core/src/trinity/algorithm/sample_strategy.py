"""Base class of sample strategies: how the trainer draws each training batch."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.algorithm.component import Component

if TYPE_CHECKING:
    from trinity.experience import BufferReader, Experience


class SampleStrategy(Component):
    """Built by the trainer with its buffers; ``sample(step)`` returns the next training batch.

    ``experience_buffer`` is the reader of ``buffer.trainer_input.experience_buffer``;
    ``auxiliary_buffers`` maps each ``buffer.trainer_input.auxiliary_buffers`` name to its
    reader; ``train_batch_size`` is the number of experiences one step trains on. Extra
    keyword arguments come from ``algorithm.sample_strategy_args``.
    """

    def __init__(
        self,
        *,
        experience_buffer: BufferReader,
        auxiliary_buffers: Mapping[str, BufferReader] | None = None,
        train_batch_size: int,
        **kwargs: Any,
    ) -> None:
        self.experience_buffer = experience_buffer
        self.auxiliary_buffers = dict(auxiliary_buffers or {})
        self.train_batch_size = train_batch_size

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        # The buffers and batch size are injected by the trainer, never configured by users.
        injected = {"experience_buffer", "auxiliary_buffers", "train_batch_size"}
        return {k: v for k, v in super().default_args().items() if k not in injected}

    @abstractmethod
    def sample(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """Return the experiences to train on at ``step`` and metrics about them."""

    def set_model_version(self, version: int) -> None:
        """Called by the trainer before every :meth:`sample` with the current weight version
        (the trainer's step); does nothing unless a strategy needs it (staleness control)."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in a checkpoint (reader positions live in the buffers themselves)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
