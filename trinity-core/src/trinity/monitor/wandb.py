"""Weights & Biases monitor (extra ``trinity-core[wandb]``); ``monitor_args: {mode: offline}``
logs to local files only."""

from __future__ import annotations

from typing import Any

from trinity.monitor.base import Monitor, histogram_metrics, scalar_metrics


class WandbMonitor(Monitor):
    """One wandb run per role, named ``<name>_<role>`` in project ``project`` (group ``group``).

    ``monitor_args`` are passed to ``wandb.init`` (``mode``, ``base_url`` → ``settings``, ...);
    ``api_key`` logs in first.
    """

    def __init__(
        self,
        project: str,
        name: str,
        role: str = "trainer",
        group: str | None = None,
        log_dir: str | None = None,
        config: dict[str, Any] | None = None,
        monitor_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(role)
        try:
            import wandb
        except ImportError:
            from trinity.plugins import install_hint

            raise ImportError(
                f"monitor_type 'wandb' needs the wandb package: {install_hint('trinity-core', extra='wandb')}"
            ) from None
        args = dict(monitor_args or {})
        api_key = args.pop("api_key", None)
        base_url = args.pop("base_url", None)
        if api_key:
            wandb.login(key=api_key, host=base_url)
        self._run = wandb.init(
            project=project,
            group=group or name,
            name=f"{name}_{role}",
            dir=log_dir,
            config=config,
            reinit="create_new",
            **args,
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values: dict[str, Any] = dict(scalar_metrics(metrics))
        if histograms := histogram_metrics(metrics):
            import wandb

            for key, h in histograms.items():
                values[key] = wandb.Histogram(np_histogram=(list(h.counts), list(h.edges)))
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


__all__ = ["WandbMonitor"]
