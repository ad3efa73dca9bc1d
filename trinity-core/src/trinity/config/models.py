"""The root ``Config`` model and ``StageConfig`` (multi-stage jobs)."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import PrivateAttr, field_validator, model_validator

from trinity.config.geometry import BatchGeometry
from trinity.config.sections.algorithm import AlgorithmConfig
from trinity.config.sections.base import F, Section, derived, lower_alias
from trinity.config.sections.buffer import BufferConfig
from trinity.config.sections.data import DataProcessorConfig, ServiceConfig
from trinity.config.sections.explorer import ExplorerConfig
from trinity.config.sections.model import ModelConfig
from trinity.config.sections.runtime import ClusterConfig, LogConfig, MonitorConfig, SynchronizerConfig
from trinity.config.sections.trainer import TrainerConfig

Mode = Literal["both", "train", "explore", "bench", "serve", "colocate"]


class StageConfig(Section):
    """One stage of a multi-stage job. Sections given here are deep-merged over the global ones."""

    stage_name: str = F(doc="Stage name, unique; the stage runs as experiment `<name>/<stage_name>`.")
    mode: Mode | None = F(None, "Mode of this stage; defaults to the global `mode`.")
    algorithm: AlgorithmConfig | None = F(None, "Algorithm keys overriding the global ones.")
    buffer: BufferConfig | None = F(None, "Buffer keys overriding the global ones.")
    model: ModelConfig | None = F(
        None,
        "Model keys overriding the global ones, e.g. `lora_configs` to train a LoRA adapter in this stage "
        "only; a later stage's `model_path` is still the previous stage's weights.",
    )
    data_processor: DataProcessorConfig | None = F(None, "Data-processor keys overriding the global ones.")
    explorer: ExplorerConfig | None = F(None, "Explorer keys overriding the global ones.")
    trainer: TrainerConfig | None = F(None, "Trainer keys overriding the global ones.")

    @field_validator("mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)


class Config(Section):
    """A whole Trinity job. Load it with `trinity.config.load_config`, which also fills in
    derived values (`trinity.config.resolve_config`)."""

    mode: Mode = F(
        "both",
        "`both` (explore and train), `train`, `explore`, `bench` (evaluate checkpoints), `serve` (serve "
        "the policy to applications, learning from their feedback) or `colocate` (`both` on one GPU).",
    )
    project: str = F("Trinity-RFT", "Project name (monitor project, checkpoint folder).")
    group: str = F("", "Optional group between project and name in paths and the Ray namespace.")
    name: str = F("rft", "Experiment name.")
    checkpoint_root_dir: str = F(
        "", "Root of all checkpoints and logs; defaults to $TRINITY_CHECKPOINT_ROOT_DIR, else ./checkpoints."
    )
    checkpoint_job_dir: str = derived("", "Set to `<checkpoint_root_dir>/<project>/<name>`.")
    ray_namespace: str = F("", "Ray namespace of the job's actors; defaults to `<project>/<name>`.")
    continue_from_checkpoint: bool = F(
        True, "Resume from the latest checkpoint of this experiment if there is one."
    )
    ignore_validator_suggestions: bool = F(False, "Accepted for Trinity-RFT compatibility; has no effect.")
    algorithm: AlgorithmConfig = F(default_factory=AlgorithmConfig, doc="Algorithm and its components.")
    data_processor: DataProcessorConfig = F(default_factory=DataProcessorConfig, doc="Data pipelines.")
    model: ModelConfig = F(default_factory=ModelConfig, doc="The model being trained.")
    cluster: ClusterConfig = F(default_factory=ClusterConfig, doc="Ray cluster.")
    buffer: BufferConfig = F(default_factory=BufferConfig, doc="Data: tasksets and experience buffers.")
    explorer: ExplorerConfig = F(default_factory=ExplorerConfig, doc="Explorer and rollout engines.")
    trainer: TrainerConfig = F(default_factory=TrainerConfig, doc="Trainer backend.")
    monitor: MonitorConfig = F(default_factory=MonitorConfig, doc="Metric logging.")
    synchronizer: SynchronizerConfig = F(default_factory=SynchronizerConfig, doc="Weight synchronisation.")
    service: ServiceConfig = F(default_factory=ServiceConfig, doc="External services.")
    log: LogConfig = F(default_factory=LogConfig, doc="Actor logs.")
    stages: list[StageConfig] = F([], "Stages run one after another, each inheriting the global keys.")

    # The user's keys before resolution (what stages merge over); set by resolve_config.
    _source: dict[str, Any] | None = PrivateAttr(default=None)
    # The file the config came from, for error messages.
    _file: str | None = PrivateAttr(default=None)
    # A stage of a staged job whose synchronizer (stages cannot set one) is the job's, there for
    # another stage that runs explorer and trainer together: it has no effect here by design.
    _sync_for_other_stages: bool = PrivateAttr(default=False)
    # The step sizes, derived once by resolve_config (see `geometry`).
    _geometry: BatchGeometry | None = PrivateAttr(default=None)

    @field_validator("mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)

    @model_validator(mode="after")
    def _bypass_old_logprobs(self) -> Config:
        # Trinity-RFT 0.6's name for trainer.use_rollout_logprobs (its M2PO example sets it); when
        # both are set, the trainer's key wins (the other one then warns that it had no effect).
        if "bypass_old_logprobs" in self.algorithm.model_fields_set and (
            "use_rollout_logprobs" not in self.trainer.model_fields_set
        ):
            self.trainer.use_rollout_logprobs = self.algorithm.bypass_old_logprobs
        return self

    @property
    def job_dir(self) -> str:
        """``<checkpoint_root_dir>/<project>/[<group>/]<name>``: checkpoints, logs, monitor files."""
        parts = [self.checkpoint_root_dir or ".", self.project, self.group, self.name]
        return os.path.join(*[p for p in parts if p])

    @property
    def geometry(self) -> BatchGeometry:
        """How many tasks, rollouts and experiences make the job's steps
        (:class:`~trinity.config.geometry.BatchGeometry`); set by ``resolve_config``."""
        if self._geometry is None:
            raise RuntimeError(
                "config.geometry is set by trinity.config.resolve_config; resolve the config first"
            )
        return self._geometry

    def to_yaml(self) -> str:
        """The config as YAML (what ``trinity run --dry-run`` prints); loads back unchanged."""
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
