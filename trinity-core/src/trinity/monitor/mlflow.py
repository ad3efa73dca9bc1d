"""MLflow monitor (extra ``trinity-core[mlflow]``); without ``monitor_args.uri`` it writes a
SQLite store at ``<job_dir>/monitor/mlflow.db``."""

from __future__ import annotations

import os
from typing import Any

from trinity.monitor.base import Monitor, scalar_metrics


def _mlflow_key(key: str) -> str:
    # MLflow allows letters, digits, and _ - . space : / only; other characters become "_".
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in key)


class MlflowMonitor(Monitor):
    """One MLflow run per role, named ``<name>_<role>``, in experiment ``project``."""

    def __init__(
        self,
        project: str,
        name: str,
        role: str = "trainer",
        log_dir: str | None = None,
        config: dict[str, Any] | None = None,
        monitor_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(role)
        try:
            import mlflow
        except ImportError:
            from trinity.plugins import install_hint

            raise ImportError(
                f"monitor_type 'mlflow' needs the mlflow package: {install_hint('trinity-core', extra='mlflow')}"
            ) from None
        args = dict(monitor_args or {})
        # Without a server, a local SQLite store (MLflow 3 retired the plain file store).
        default_db = os.path.abspath(os.path.join(log_dir or ".", "mlflow.db"))
        uri = args.get("uri") or f"sqlite:///{default_db}"
        self._client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(project)
        self._run_id = self._client.create_run(experiment_id, run_name=f"{name}_{role}").info.run_id
        self.tracking_uri = uri
        for key, value in (config or {}).items():
            self._client.log_param(self._run_id, _mlflow_key(key), str(value)[:500])

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.skip_histograms(metrics)
        for key, value in scalar_metrics(metrics).items():
            self._client.log_metric(self._run_id, _mlflow_key(key), value, step=step)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


__all__ = ["MlflowMonitor"]
