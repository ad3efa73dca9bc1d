"""``service`` and ``data_processor`` (the task and experience pipelines, :mod:`trinity.data`)."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from trinity.config.sections.base import F, Section
from trinity.config.sections.buffer import ExperienceBufferConfig, TasksetConfig


class DataJuicerServiceConfig(Section):
    """Where `data_juicer` operators run their recipes: a Data-Juicer service
    (`python -m trinity.data.dj_server`) instead of in-process."""

    server_url: str | None = F(
        None,
        "URL of a running service (`python -m trinity.data.dj_server`); its token from `$TRINITY_DJ_TOKEN`.",
    )
    auto_start: bool = F(
        False, "Start a service on 127.0.0.1 in each process that runs a data_juicer operator; stopped after."
    )
    port: int | None = F(
        None,
        "Port of an auto-started service; unset: the port of `server_url`, else a free one.",
        ge=0,
        le=65535,
    )


class ServiceConfig(Section):
    """External services."""

    data_juicer: DataJuicerServiceConfig | None = F(
        None, "Data-Juicer service for the `data_juicer` operators; unset: recipes run in-process."
    )


class OperatorConfig(Section):
    """One data-processing operator."""

    name: str = F("", "Operator name.")
    args: dict[str, Any] = F({}, "Operator arguments.")


class TaskPipelineConfig(Section):
    """Task preprocessing before exploring: raw task files through task operators into the
    explorer's taskset (see docs/data.md)."""

    operators: list[OperatorConfig] = F([], "Operators, applied in order.")
    num_process: int = F(4, "Worker processes the operators' batches are spread over.", ge=1)
    config_path: str | None = F(
        None, "Data-Juicer recipe run as one `data_juicer` operator; overrides `operators` and `num_process`."
    )
    inputs: list[str] = F([], "Raw input files (jsonl, json, parquet, csv or dataset folders).")
    output: TasksetConfig | None = F(
        None, "Output taskset; defaults to the explorer's first training taskset, which reads the output."
    )
    target_fields: list[str] = F([], "Fields processed into the output taskset.")
    priority_weights: dict[str, float] = F(
        {},
        "Weights of `quality`, `difficulty` and `usage_frequency` in a priority the tasks are sorted by "
        "(highest first) before `top_k`; see docs/data.md.",
    )
    top_k: int = F(-1, "Tasks kept after processing; -1 keeps all.", ge=-1)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 would keep no task; use a positive count, or -1 to keep all")
        return value


class ExperiencePipelineConfig(Section):
    """Experience processing between explorer and buffer, per explore step (see docs/data.md)."""

    operators: list[OperatorConfig] = F([], "Operators, applied in order.")
    save_input: bool = F(True, "Save the unprocessed experiences too.")
    input_save_path: str | None = F(None, "Where unprocessed experiences are saved (jsonl or SQLite).")
    inputs: dict[str, ExperienceBufferConfig] = F(
        {}, "Extra input buffers by name. Has no effect in this version."
    )
    output: ExperienceBufferConfig | None = F(
        None, "Output buffer; the trainer's experience buffer. Has no effect in this version."
    )


class DataProcessorConfig(Section):
    """Task and experience pipelines of operators (component kind ``operator``)."""

    task_pipeline: TaskPipelineConfig | None = F(None, "Task pipeline, run before exploring.")
    experience_pipeline: ExperiencePipelineConfig | None = F(
        default_factory=ExperiencePipelineConfig, doc="Experience pipeline, run on each explore step."
    )
