"""When the explorer syncs weights: ``sync_interval``, ``sync_offset`` and ``sync_style``.

Steps count completed steps. Before the explorer starts step ``e + 1`` it may have to load the
trainer's weights. With ``sync_style: fixed`` that happens when ``e`` is a positive multiple of
``sync_interval``, and the weights must be those after trainer step ``e - sync_offset``: with
offset 0 the explorer waits for the trainer to train on everything explored so far (on-policy
per interval); with offset k it may run k steps ahead (asynchronous RL). ``dynamic`` syncs at
the same points but takes whatever the trainer has, waiting only when the explorer would be
more than ``sync_offset + sync_interval`` steps ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trinity.config import Config


@dataclass(frozen=True)
class SyncSchedule:
    sync_interval: int = 1
    sync_offset: int = 0
    sync_style: str = "fixed"
    eval_interval: int = 0
    total_steps: int | None = None

    @classmethod
    def from_config(cls, config: Config) -> SyncSchedule:
        total = config.buffer.total_steps or getattr(config.trainer, "total_steps", None)
        return cls(
            sync_interval=max(1, int(config.synchronizer.sync_interval)),
            sync_offset=max(0, int(config.synchronizer.sync_offset)),
            sync_style=str(config.synchronizer.sync_style),
            eval_interval=int(config.explorer.eval_interval or 0),
            total_steps=int(total) if total else None,
        )

    def version_before_explore(self, explorer_step: int, trainer_step: int) -> int | None:
        """The minimum weight version the explorer must load before its next step, or None.

        The caller waits until ``trainer_step >= version`` and then syncs to the trainer's
        current weights (a version at least that new).
        """
        e = explorer_step
        if e == 0 or e % self.sync_interval:
            return None
        required = e - self.sync_offset
        if self.sync_style == "dynamic":
            required = e - self.sync_offset - self.sync_interval
            if trainer_step > required:
                required = trainer_step
        return required if required >= 1 else None

    def eval_due(self, explorer_step: int) -> bool:
        return bool(self.eval_interval) and explorer_step > 0 and explorer_step % self.eval_interval == 0
