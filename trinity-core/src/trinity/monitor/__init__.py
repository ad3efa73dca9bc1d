"""Monitors: where metrics go (``monitor.monitor_type``).

``get_monitors(config, role)`` builds the configured ones; each has ``log(metrics, step)`` and
``close()``. ``tensorboard`` (default) and ``console`` need nothing extra; ``wandb`` and
``mlflow`` are imported only when chosen (extras ``trinity-core[wandb]`` / ``[mlflow]``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trinity.monitor.base import Monitor, scalar_metrics

if TYPE_CHECKING:
    from trinity.config import Config


class MultiMonitor(Monitor):
    """Fans ``log`` / ``close`` out to several monitors."""

    def __init__(self, monitors: list[Monitor], role: str = "trainer") -> None:
        super().__init__(role)
        self.monitors = monitors

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for monitor in self.monitors:
            monitor.log(metrics, step)

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close()


def _monitor_dir(config: Config) -> str:
    return config.monitor.cache_dir or os.path.join(config.job_dir, "monitor")


def get_monitor(kind: str, config: Config, role: str, total_steps: int | None = None) -> Monitor:
    """One monitor of type ``kind`` (``tensorboard``, ``console``, ``wandb``, ``mlflow``)."""
    args = dict(config.monitor.monitor_args or {})
    base = _monitor_dir(config)
    if kind == "tensorboard":
        from trinity.monitor.tensorboard import TensorboardMonitor

        return TensorboardMonitor(os.path.join(base, "tensorboard"), role)
    if kind == "console":
        from trinity.monitor.console import ConsoleMonitor

        return ConsoleMonitor(
            role,
            total_steps=total_steps or config.trainer.total_steps,
            use_rich=progress_bar(config, role),
            fields=console_fields(config),
        )
    hparams = config.model_dump(mode="json", include={"algorithm", "model", "buffer", "trainer"})
    flat = _flatten(hparams)
    if kind == "wandb":
        from trinity.monitor.wandb import WandbMonitor

        return WandbMonitor(
            config.project,
            config.name,
            role,
            group=config.group or None,
            log_dir=base,
            config=hparams,
            monitor_args=args,
        )
    if kind == "mlflow":
        from trinity.monitor.mlflow import MlflowMonitor

        return MlflowMonitor(config.project, config.name, role, log_dir=base, config=flat, monitor_args=args)
    raise ValueError(f"monitor.monitor_type {kind!r} is unknown; use tensorboard, console, wandb or mlflow")


def console_fields(config: Config) -> tuple[str, ...]:
    """What the console shows of a step: ``reward`` and ``loss`` for RL algorithms (schema
    ``experience``), the ``loss`` alone for the others (SFT, DPO: their batches have no reward)."""
    try:
        from trinity.plugins import get_component

        schema = getattr(
            get_component("algorithm_type", config.algorithm.algorithm_type), "schema", "experience"
        )
    except Exception:  # an unknown algorithm fails elsewhere, with its own message
        schema = "experience"
    return ("reward", "loss") if schema == "experience" else ("loss",)


def progress_bar(config: Config, role: str) -> bool | None:
    """The console monitor's bar for ``role``, from ``enable_progress_bar`` of the storages the
    role reads (explorer: training tasksets; trainer: the experience buffer): ``False`` when one
    says false (plain lines), ``True`` when one says true, ``None`` (a bar on a terminal) unset."""
    buffer = config.buffer
    if role == "explorer":
        storages = [*buffer.explorer_input.tasksets, buffer.explorer_input.taskset]
    else:
        storages = [buffer.trainer_input.experience_buffer]
    flags = [s.enable_progress_bar for s in storages if s is not None and s.enable_progress_bar is not None]
    if False in flags:
        return False
    return True if flags else None


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def get_monitors(config: Config, role: str, total_steps: int | None = None) -> MultiMonitor:
    """The monitors of ``config.monitor.monitor_type`` for actor ``role``, as one monitor."""
    return MultiMonitor(
        [get_monitor(k, config, role, total_steps) for k in config.monitor.monitor_types()], role
    )


__all__ = [
    "Monitor",
    "MultiMonitor",
    "console_fields",
    "get_monitor",
    "get_monitors",
    "progress_bar",
    "scalar_metrics",
]
