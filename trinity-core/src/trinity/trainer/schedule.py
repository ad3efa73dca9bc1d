"""Learning-rate schedules of the native trainer: linear warm-up, then constant or cosine.

The formulas are veRL's (``verl.utils.torch_functional``): during warm-up the constant schedule
rises linearly from 0, the cosine schedule from ``min_lr_ratio``; after warm-up the cosine
schedule decays half a period down to ``min_lr_ratio * lr`` at ``total_steps``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from trinity.config import OptimizerConfig

SCHEDULE_TYPES = ("constant", "cosine")


def warmup_steps(optimizer_config: OptimizerConfig, total_steps: int | None) -> int:
    """``lr_warmup_steps`` if it is >= 0, else ``int(lr_warmup_steps_ratio * total_steps)``."""
    if optimizer_config.lr_warmup_steps >= 0:
        return optimizer_config.lr_warmup_steps
    ratio = optimizer_config.lr_warmup_steps_ratio
    if ratio <= 0:
        return 0
    if not total_steps:
        raise ValueError(
            f"algorithm.optimizer.lr_warmup_steps_ratio is {ratio} but the number of training steps is "
            "unknown; set trainer.total_steps (or buffer.total_steps), or use lr_warmup_steps instead"
        )
    return int(ratio * total_steps)


class LRLambda:
    """Multiplier of the base learning rate at a given step (picklable, so it checkpoints)."""

    def __init__(
        self, schedule: str, warmup: int, total_steps: int | None, min_lr_ratio: float = 0.0
    ) -> None:
        if schedule not in SCHEDULE_TYPES:
            raise ValueError(
                f"algorithm.optimizer.lr_scheduler_type {schedule!r} is not supported; "
                f"use one of: {', '.join(SCHEDULE_TYPES)}"
            )
        if schedule == "cosine" and not total_steps:
            raise ValueError(
                "algorithm.optimizer.lr_scheduler_type 'cosine' needs the number of training steps; "
                "set trainer.total_steps (or buffer.total_steps)"
            )
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"algorithm.optimizer.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.schedule = schedule
        self.warmup = warmup
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step: int) -> float:
        if self.schedule == "constant":
            if step < self.warmup:
                return step / max(1, self.warmup)
            return 1.0
        floor = self.min_lr_ratio
        if step < self.warmup:
            return floor + (1.0 - floor) * step / max(1, self.warmup)
        progress = (step - self.warmup) / max(1, self.total_steps - self.warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return max(floor, floor + (1.0 - floor) * cosine)


def build_scheduler(
    optimizer: torch.optim.Optimizer, optimizer_config: OptimizerConfig, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following ``algorithm.optimizer`` (``warmup_style`` is the old name of
    ``lr_scheduler_type`` and wins when set, as in Trinity-RFT)."""
    import torch

    schedule = (optimizer_config.warmup_style or optimizer_config.lr_scheduler_type or "constant").lower()
    lam = LRLambda(
        schedule,
        warmup_steps(optimizer_config, total_steps),
        total_steps,
        optimizer_config.min_lr_ratio if schedule == "cosine" else 0.0,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lam)


__all__ = ["SCHEDULE_TYPES", "LRLambda", "build_scheduler", "warmup_steps"]
