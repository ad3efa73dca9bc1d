"""Console monitor: a rich progress bar (step / total, reward, loss, ETA) on a terminal, one
plain line per step otherwise (log files, CI)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from trinity.monitor.base import Monitor, scalar_metrics

# Shown as "reward" / "loss": the first of these names present in a step's metrics (the
# trainer reports critic/score/mean, the explorer rollout/reward_mean).
REWARD_KEYS = ("critic/score/mean", "rollout/reward_mean")
LOSS_KEYS = ("actor/loss", "actor/pg_loss", "actor/sft_loss", "actor/dpo_loss", "critic/vf_loss")


def _first(metrics: dict[str, float], keys: tuple[str, ...]) -> float | None:
    return next((metrics[k] for k in keys if k in metrics), None)


def format_eta(seconds: float | None) -> str:
    """``H:MM:SS``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ConsoleMonitor(Monitor):
    """Progress of one role. ``total_steps`` unset shows steps without a total or ETA.

    ``rich`` is used when ``stream`` is a terminal (or ``use_rich=True``); otherwise each
    ``log`` prints ``[role] step 3/10 reward 0.5000 loss 0.1234 eta 0:01:02``.
    """

    def __init__(
        self,
        role: str = "trainer",
        total_steps: int | None = None,
        stream: TextIO | None = None,
        use_rich: bool | None = None,
    ) -> None:
        super().__init__(role)
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self.use_rich = self.stream.isatty() if use_rich is None else use_rich
        self._start = time.monotonic()
        self._first_step: int | None = None
        self._progress = self._task = None
        if self.use_rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn(f"[bold]{role}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._progress.add_task(role, total=total_steps, stats="")
            self._progress.start()

    def eta(self, step: int) -> float | None:
        """Seconds left, from the mean time per step since the first logged step."""
        if not self.total_steps or self._first_step is None or step <= self._first_step:
            return None
        per_step = (time.monotonic() - self._start) / (step - self._first_step)
        return max(0.0, (self.total_steps - step) * per_step)

    def summary(self, metrics: dict[str, Any]) -> str:
        """``reward x loss y`` for the values present."""
        values = scalar_metrics(metrics)
        parts = []
        for label, keys in (("reward", REWARD_KEYS), ("loss", LOSS_KEYS)):
            value = _first(values, keys)
            if value is not None:
                parts.append(f"{label} {value:.4f}")
        return " ".join(parts)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._first_step is None:
            self._first_step, self._start = step, time.monotonic()
        stats = self.summary(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=stats)
            return
        total = f"/{self.total_steps}" if self.total_steps else ""
        eta = f" eta {format_eta(self.eta(step))}" if self.total_steps else ""
        line = f"[{self.role}] step {step}{total}" + (f" {stats}" if stats else "") + eta
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


__all__ = ["ConsoleMonitor", "format_eta"]
