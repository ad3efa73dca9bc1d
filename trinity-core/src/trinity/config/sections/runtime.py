"""Sections about where and how a job runs: ``cluster``, ``synchronizer``, ``monitor``, ``log``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from trinity.config.sections.base import F, Section, derived, invalid_choice, lower_alias

SyncMethod = Literal["checkpoint", "memory", "nccl"]
SyncStyle = Literal["fixed", "dynamic", "trainer_driven", "explorer_driven", "fully_async"]
MONITOR_TYPES: tuple[str, ...] = ("tensorboard", "wandb", "mlflow", "console")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")


class ClusterConfig(Section):
    """The Ray cluster the job runs on (see docs/cluster.md)."""

    ray_address: str = F(
        "auto",
        "Ray cluster to join (`<head ip>:<port>` of a `ray start --head`); `auto` or `local`: the cluster "
        "in $RAY_ADDRESS, else a local Ray of the job's own. A joined cluster keeps running after the job.",
    )
    node_num: int = F(
        0, "Nodes the job uses; 0 means what Ray reports. More than the cluster has is an error.", ge=0
    )
    gpu_per_node: int = F(
        0,
        "GPUs per node; 0 means what Ray reports (0 on a CPU machine). More than the nodes have is an error.",
        ge=0,
    )


class SynchronizerConfig(Section):
    """How trainer weights reach the explorer."""

    sync_method: SyncMethod = F(
        "nccl",
        "`nccl` (trainer broadcasts to every rollout worker: NCCL on GPUs, gloo on CPU), `memory` "
        "(through the object store) or `checkpoint` (from disk). Unset: `memory` in `both` mode, "
        "else `checkpoint`.",
    )
    sync_style: SyncStyle = F(
        "fixed",
        "Who waits for whom. `fixed`: after every sync_interval explorer steps the explorer waits "
        "for the version it needs (its step minus sync_offset). `explorer_driven` "
        "(`dynamic_by_explorer`): at those same points it loads whatever version the trainer has, "
        "waiting at most for the train step in flight. `trainer_driven` (`dynamic_by_trainer`): "
        "every trainer_sync_interval trainer steps the trainer publishes and holds until the "
        "explorer loaded the weights at its next step boundary. `fully_async`: nobody holds; the "
        "explorer loads published weights whenever both are between steps. `dynamic`: "
        "`fully_async`. In every style the explorer stays at most sync_offset + sync_interval steps "
        "ahead; a decoupled `explore` job only in `fixed` style, where each sync step, the first "
        "included, waits for the needed checkpoint while its `train` job runs (docs/cluster.md).",
    )
    sync_interval: int = F(1, "Steps between weight syncs.", ge=1)
    explorer_sync_interval: int | None = F(None, "Explorer-side interval; unset or 0: `sync_interval`.", ge=0)
    trainer_sync_interval: int | None = F(
        None,
        "Trainer steps between publishing weights (`trainer_driven`, `fully_async`; and the "
        "checkpoints a `train`-mode job saves for a separate explorer); unset or 0: `sync_interval`.",
        ge=0,
    )
    sync_offset: int = F(0, "Steps the explorer may run ahead of the trainer.", ge=0)
    sync_timeout: int = F(
        3600,
        "Seconds to wait for a sync (a decoupled `explore` job: for each checkpoint it needs); with "
        "`nccl` also the limit for forming the group and each broadcast.",
        ge=1,
    )
    group_name: str = F(
        "rollout_weight_sync",
        "Accepted for Trinity-RFT compatibility: each stage's `nccl` group has a store of its own.",
    )
    wait_for_checkpoint: bool = F(
        False, "Wait for the newest checkpoint to be complete before loading. Has no effect in this version."
    )
    explorer_world_size: int | None = derived(
        None, "Set from the rollout engines' GPU count. Has no effect in this version."
    )
    ray_namespace: str = derived("", "Set from the global `ray_namespace`.")

    @field_validator("sync_method", mode="before")
    @classmethod
    def _method(cls, value: Any) -> Any:
        return lower_alias(value, {"online": "nccl", "offline": "checkpoint"})

    @field_validator("sync_style", mode="before")
    @classmethod
    def _style(cls, value: Any) -> Any:
        return lower_alias(
            value, {"dynamic_by_trainer": "trainer_driven", "dynamic_by_explorer": "explorer_driven"}
        )


class MonitorConfig(Section):
    """Where metrics go."""

    monitor_type: str | list[str] = F(
        "tensorboard", "`tensorboard`, `wandb`, `mlflow` or `console`, or a list of them."
    )
    monitor_args: dict[str, Any] | None = F(
        None, "Monitor arguments (wandb `base_url`/`api_key`, mlflow `uri`, ...)."
    )
    detailed_stats: bool = F(
        False, "Log mean/std/max/min of evaluation metrics. Has no effect in this version."
    )
    enable_ray_timeline: bool = F(False, "Write a Ray timeline to `<job_dir>/monitor/timeline.json`.")
    cache_dir: str = derived("", "Set to `<job_dir>/monitor`.")

    @field_validator("monitor_type", mode="before")
    @classmethod
    def _check_types(cls, value: Any) -> Any:
        # Validated by hand: a `str | list` union would report two errors for one typo.
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, str):
                raise ValueError(f"expected a monitor name or a list of them, got {item!r}")
            if item.lower() not in MONITOR_TYPES:
                raise ValueError(invalid_choice(item, MONITOR_TYPES))
        return [v.lower() for v in value] if isinstance(value, list) else value.lower()

    def monitor_types(self) -> list[str]:
        """The configured monitors as a list."""
        return list(self.monitor_type) if isinstance(self.monitor_type, list) else [self.monitor_type]


class LogConfig(Section):
    """Per-actor log files."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = F("INFO", "Log level.")
    group_by_node: bool = F(False, "Put each node's logs in its own folder `<job_dir>/log/<node_ip>/`.")
    save_dir: str = derived("", "Set to `<job_dir>/log`. Has no effect in this version.")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value
