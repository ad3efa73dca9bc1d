"""When the explorer waits for, and loads, the trainer's weights: pure scheduling logic.

Steps count *finished* steps: the explorer has produced ``explorer_step`` batches, the trainer
has trained on ``trainer_step`` of them; weights after trainer step ``t`` are version ``t``
(version 0 = the initial model). The explorer asks :meth:`Synchronizer.explorer_decision`
before each step it starts (the launcher's step loop asks, and moves the weights through the
stage's :class:`~trinity.sync.transport.WeightTransport`).

``fixed`` (Trinity-RFT's default): after explorer step ``e`` with ``e > sync_offset`` and
``(e - sync_offset) % sync_interval == 0``, the explorer needs version ``e - sync_offset``:
it waits for the trainer to reach that step, then syncs. ``sync_offset`` therefore lets the
explorer run that many steps ahead (asynchronous RL); ``sync_interval 1, sync_offset 0`` is
strictly on-policy (explore 1, train 1, sync, explore 2, ...).

``dynamic`` (also the ``trainer_driven`` / ``explorer_driven`` / ``fully_async`` styles): the
explorer loads whatever newer version the trainer has published, never waiting for one, except
that it may not get more than ``sync_offset + sync_interval`` steps ahead of the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trinity.config import SynchronizerConfig

Action = Literal["run", "wait", "sync"]
_STYLES = ("fixed", "dynamic", "trainer_driven", "explorer_driven", "fully_async")


@dataclass(frozen=True)
class SyncDecision:
    """What the explorer does next: ``run`` its next step, ``wait`` for the trainer to reach
    step ``version``, or ``sync`` (load version ``version``, then run)."""

    action: Action
    version: int
    reason: str = ""


class Synchronizer:
    """The ``synchronizer`` section's policy (``sync_interval``, ``sync_offset``, ``sync_style``)."""

    def __init__(self, sync_interval: int = 1, sync_offset: int = 0, sync_style: str = "fixed") -> None:
        if sync_interval < 1:
            raise ValueError(f"synchronizer.sync_interval must be >= 1, got {sync_interval}")
        if sync_offset < 0:
            raise ValueError(f"synchronizer.sync_offset must be >= 0, got {sync_offset}")
        if sync_style not in _STYLES:
            raise ValueError(f"synchronizer.sync_style {sync_style!r} is not one of: {', '.join(_STYLES)}")
        self.sync_interval = sync_interval
        self.sync_offset = sync_offset
        self.sync_style = "fixed" if sync_style == "fixed" else "dynamic"

    @classmethod
    def from_config(cls, config: SynchronizerConfig) -> Synchronizer:
        """Built from ``config.synchronizer`` (``explorer_sync_interval`` wins when set)."""
        return cls(
            config.explorer_sync_interval or config.sync_interval, config.sync_offset, config.sync_style
        )

    @property
    def max_lead(self) -> int:
        """Most steps the explorer may be ahead of the trainer."""
        return self.sync_offset + self.sync_interval

    def is_sync_step(self, explorer_step: int) -> bool:
        """Fixed style: does the explorer sync after finishing ``explorer_step``?"""
        e = explorer_step - self.sync_offset
        return e > 0 and e % self.sync_interval == 0

    def published_version(self, trainer_step: int) -> int:
        """The newest version the trainer has published after ``trainer_step`` steps."""
        return trainer_step - trainer_step % self.sync_interval

    def explorer_decision(self, explorer_step: int, trainer_step: int, explorer_version: int) -> SyncDecision:
        """What the explorer does after ``explorer_step`` finished steps, the trainer having
        finished ``trainer_step`` and the explorer holding weights ``explorer_version``."""
        if self.sync_style == "fixed":
            if not self.is_sync_step(explorer_step):
                return SyncDecision("run", explorer_version, "not a sync step")
            target = explorer_step - self.sync_offset
            if explorer_version >= target:
                return SyncDecision("run", explorer_version, "already holds the needed version")
            if trainer_step >= target:
                return SyncDecision("sync", target, f"sync step: load version {target}")
            return SyncDecision("wait", target, f"sync step: trainer has {trainer_step} of {target} steps")
        available = self.published_version(trainer_step)
        if available > explorer_version:
            return SyncDecision("sync", available, f"trainer published version {available}")
        if explorer_step + 1 - trainer_step > self.max_lead:
            need = explorer_step + 1 - self.max_lead
            return SyncDecision("wait", need, f"explorer would be more than {self.max_lead} steps ahead")
        return SyncDecision("run", explorer_version, "within the allowed lead")


__all__ = ["SyncDecision", "Synchronizer"]
