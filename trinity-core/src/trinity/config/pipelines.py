"""The data processor's pipelines as the config sees them: which operators a task pipeline runs,
the priority scores it can weigh, and the check that every operator is a registered one of the
right pipeline taking the arguments given. Nothing is built here (operators that need the job,
a scoring model's address or a recipe file, are bound by :mod:`trinity.data.checks` before the
job starts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.config.algorithm_defaults import check_init_args
from trinity.config.errors import ConfigError

if TYPE_CHECKING:
    from trinity.config.models import Config
    from trinity.config.sections.buffer import ExperienceBufferConfig, TasksetConfig
    from trinity.config.sections.data import OperatorConfig, TaskPipelineConfig

#: The scores ``task_pipeline.priority_weights`` may weigh (:mod:`trinity.data.priority`).
PRIORITY_SCORES = ("quality", "difficulty", "usage_frequency")


def task_operators(tp: TaskPipelineConfig) -> list[OperatorConfig]:
    """The operators ``tp`` runs: a ``data_juicer`` operator for ``config_path``, else ``operators``."""
    from trinity.config.sections.data import OperatorConfig

    if tp.config_path:
        return [OperatorConfig(name="data_juicer", args={"config_path": tp.config_path})]
    return list(tp.operators)


def pipeline_output(config: Config) -> TasksetConfig | ExperienceBufferConfig | None:
    """What the task pipeline writes: ``task_pipeline.output``, else (as Trinity-RFT) the
    explorer's first training taskset, or in a ``train`` job of an SFT or DPO algorithm the
    dataset the trainer reads, ``buffer.trainer_input.experience_buffer``; ``None`` when none."""
    tp = config.data_processor.task_pipeline if config.data_processor else None
    if tp is not None and tp.output is not None:
        return tp.output
    if config.mode == "train":  # no explorer: the trainer's dataset, or nothing
        eb = config.buffer.trainer_input.experience_buffer
        return eb if eb is not None and eb.schema_type in ("sft", "dpo") else None
    return (config.buffer.explorer_input.tasksets or [None])[0]


def trains_on_pipeline_output(config: Config) -> bool:
    """Whether the job's trainer reads what its task pipeline writes (an SFT or DPO ``train``
    job whose pipeline has no other output): the pipeline then runs before a train job too."""
    tp = config.data_processor.task_pipeline if config.data_processor else None
    if tp is None or not task_operators(tp):
        return False
    output = pipeline_output(config)
    return output is not None and output is config.buffer.trainer_input.experience_buffer


def check_weights(weights: dict[str, float]) -> None:
    """``ValueError`` (one line) for a weight the priority ordering cannot compute."""
    unknown = sorted(set(weights) - set(PRIORITY_SCORES))
    if unknown:
        raise ValueError(
            f"priority_weights: no score {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(PRIORITY_SCORES)}; upstream's 'diversity' is computed by no one)"
        )


def pipeline_operators(c: Config) -> list[tuple[str, str, OperatorConfig]]:
    """``(pipeline, config key, operator)`` for every operator of ``c``'s data processor."""
    dp = c.data_processor
    out: list[tuple[str, str, OperatorConfig]] = []
    if dp is None:
        return out
    if dp.task_pipeline is not None:
        from_file = bool(dp.task_pipeline.config_path)
        for i, op in enumerate(task_operators(dp.task_pipeline)):
            key = "data_processor.task_pipeline." + ("config_path" if from_file else f"operators[{i}]")
            out.append(("task_pipeline", key, op))
    if dp.experience_pipeline is not None:
        for i, op in enumerate(dp.experience_pipeline.operators):
            out.append(("experience_pipeline", f"data_processor.experience_pipeline.operators[{i}]", op))
    return out


def check_operators(c: Config) -> None:
    """Every operator is registered, belongs to its pipeline (``Operator.pipelines``) and takes
    the arguments given (through the registry: no operator is built)."""
    from trinity.plugins import UnknownComponentError, get_component

    for pipeline, key, op in pipeline_operators(c):
        try:
            cls = get_component("operator", op.name)
        except UnknownComponentError as exc:
            raise ConfigError(str(exc).split(" More ")[0], key=f"{key}.name") from None
        belongs = sorted(getattr(cls, "pipelines", ()))
        if pipeline not in belongs:
            kinds = " and ".join(b.removesuffix("_pipeline") for b in belongs) or "neither pipeline's"
            wanted = pipeline.removesuffix("_pipeline")
            raise ConfigError(
                f"operator {op.name!r} is {_a(kinds)} operator, not {_a(wanted)} operator", key=key
            )
        check_init_args(cls, dict(op.args or {}), f"operator {op.name!r}", f"{key}.args")


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
