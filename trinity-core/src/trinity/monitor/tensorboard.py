"""TensorBoard monitor (the default): event files under ``<job_dir>/monitor/tensorboard/<role>``."""

from __future__ import annotations

import os
from typing import Any

from trinity.monitor.base import Monitor, scalar_metrics


class TensorboardMonitor(Monitor):
    """Writes every numeric metric as a scalar with ``torch.utils.tensorboard``."""

    def __init__(self, log_dir: str, role: str = "trainer") -> None:
        super().__init__(role)
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(log_dir, role)
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = SummaryWriter(log_dir=self.log_dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for key, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)
        # Flushing each step keeps the files current for a live TensorBoard and for crashes.
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


__all__ = ["TensorboardMonitor"]
