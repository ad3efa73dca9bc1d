"""``service`` and ``data_processor``: accepted and validated for Trinity-RFT compatibility."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from trinity.config.sections.base import F, Section
from trinity.config.sections.buffer import ExperienceBufferConfig, TasksetConfig


class DataJuicerServiceConfig(Section):
    """The Data-Juicer server."""

    server_url: str | None = F(None, "URL of a running Data-Juicer server.")
    auto_start: bool = F(False, "Start a Data-Juicer server automatically.")
    port: int | None = F(None, "Port of an auto-started server; unset picks a free one.", ge=0, le=65535)


class ServiceConfig(Section):
    """External services."""

    data_juicer: DataJuicerServiceConfig | None = F(
        None, "Data-Juicer service. Has no effect in this version."
    )


class OperatorConfig(Section):
    """One data-processing operator."""

    name: str = F("", "Operator name.")
    args: dict[str, Any] = F({}, "Operator arguments.")


class TaskPipelineConfig(Section):
    """Task preprocessing before exploring (Data-Juicer operators)."""

    operators: list[OperatorConfig] = F([], "Operators, applied in order.")
    num_process: int = F(4, "Worker processes.", ge=1)
    config_path: str | None = F(None, "Data-Juicer config file; overrides `operators` and `num_process`.")
    inputs: list[str] = F([], "Raw input files.")
    output: TasksetConfig | None = F(None, "Output taskset; defaults to the explorer's taskset.")
    target_fields: list[str] = F([], "Fields processed into the output taskset.")
    priority_weights: dict[str, float] = F({}, "Weights of difficulty / diversity / usage / quality.")
    top_k: int = F(-1, "Tasks kept after processing; -1 keeps all.", ge=-1)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 would keep no task; use a positive count, or -1 to keep all")
        return value


class ExperiencePipelineConfig(Section):
    """Experience processing between explorer and trainer."""

    operators: list[OperatorConfig] = F([], "Operators, applied in order.")
    save_input: bool = F(True, "Save the unprocessed experiences too.")
    input_save_path: str | None = F(None, "Where unprocessed experiences are saved (jsonl or SQLite).")
    inputs: dict[str, ExperienceBufferConfig] = F({}, "Extra input buffers by name.")
    output: ExperienceBufferConfig | None = F(
        None, "Output buffer; defaults to the trainer's experience buffer."
    )


class DataProcessorConfig(Section):
    """Task and experience pipelines (Trinity-RFT compatibility; not run by the core)."""

    task_pipeline: TaskPipelineConfig | None = F(None, "Task pipeline. Has no effect in this version.")
    experience_pipeline: ExperiencePipelineConfig | None = F(
        default_factory=ExperiencePipelineConfig, doc="Experience pipeline. Has no effect in this version."
    )
