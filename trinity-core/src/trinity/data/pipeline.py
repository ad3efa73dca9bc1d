"""The experience pipeline: ``data_processor.experience_pipeline.operators`` run on each explore
step's experiences, between the explorer and the buffer.

It runs inside the explorer actor, as a :class:`PipelineWriter` around the buffer writer: the
experiences are already in that process, so the built-in operators cost a pass over a Python
list (no extra Ray hop or serialisation, which would cost more than the operators themselves),
and the step's end is marked only after its processed experiences are written, so the trainer
never reads half a step. Heavy operators (Data-Juicer recipes, LLM scoring) run there too; they
slow the explore step they process, which the step's timing metrics show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.buffer.base import BufferWriter
    from trinity.config import Config, OperatorConfig
    from trinity.data.operator import ExperienceOperator, Operator, OperatorContext
    from trinity.data.served_models import ModelServer
    from trinity.experience import Experience

logger = logging.getLogger(__name__)


def build_operator(op: OperatorConfig, contract: type[Operator], where: str) -> Operator:
    """Instantiate the registered operator ``op.name`` with ``default_args()`` updated by
    ``op.args``; ``where`` (the config key) names it in every error."""
    from trinity.plugins import get_component

    cls = get_component("operator", op.name)
    if not issubclass(cls, contract):
        raise ValueError(
            f"{where}: operator {op.name!r} is {_contract_name(cls)}, not {_contract_name(contract)}"
        )
    args = {**cls.default_args(), **dict(op.args or {})}
    try:
        return cls(**args)
    except TypeError as exc:
        raise ValueError(f"{where}: operator {op.name!r} rejects its args {sorted(args)}: {exc}") from None


def bind_operators(named: Sequence[tuple[str, Operator]], context: OperatorContext, key: str) -> None:
    """:meth:`~trinity.data.operator.Operator.bind` each operator in order; on a failure the
    operators are closed (an auto-started service stops) and ``ValueError`` names the key."""
    for i, (name, op) in enumerate(named):
        try:
            op.bind(context)
        except Exception as exc:
            for _, other in named:
                other.close()
            message = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"{key}[{i}] ({name}): {message}") from None


def operator_context(
    config: Config, model_url: Callable[[str], str | None], *, dry_run: bool = False
) -> OperatorContext:
    """The :class:`~trinity.data.operator.OperatorContext` of ``config``'s job."""
    from trinity.data.operator import OperatorContext

    return OperatorContext(
        model_url=model_url,
        data_juicer=config.service.data_juicer,
        dry_run=dry_run,
        job_dir=config.checkpoint_job_dir,
        checkpoint_root=config.checkpoint_root_dir,
    )


def _contract_name(cls: type) -> str:
    from trinity.data.operator import ExperienceOperator, TaskOperator

    if issubclass(cls, ExperienceOperator):
        return "an experience operator"
    if issubclass(cls, TaskOperator):
        return "a task operator"
    return "an operator of neither contract"


class ExperiencePipeline:
    """The configured experience operators, in order.

    :meth:`process` returns the experiences left and the step's metrics:
    ``pipeline/<op>/<metric>`` from each operator, ``pipeline/<op>/dropped`` (experiences it
    removed), ``pipeline/dropped`` (all removed) and ``pipeline/seconds``.
    """

    def __init__(
        self, operators: Sequence[tuple[str, ExperienceOperator]], resources: Sequence[Any] = ()
    ) -> None:
        self.operators = list(operators)
        self.resources = list(resources)  # closed after the operators (served models)

    @classmethod
    def from_config(
        cls,
        config: Config,
        model_url: Callable[[str], str | None] | None = None,
        resources: Sequence[Any] = (),
    ) -> ExperiencePipeline | None:
        """The pipeline of ``config.data_processor.experience_pipeline``, its operators bound to
        the job's services (``model_url``: see :class:`~trinity.data.operator.OperatorContext`);
        ``None`` without operators."""
        from trinity.data.operator import ExperienceOperator

        pipeline = config.data_processor.experience_pipeline if config.data_processor else None
        if pipeline is None or not pipeline.operators:
            return None
        key = "data_processor.experience_pipeline.operators"
        ops = [
            (op.name, build_operator(op, ExperienceOperator, f"{key}[{i}]"))
            for i, op in enumerate(pipeline.operators)
        ]
        try:
            bind_operators(ops, operator_context(config, model_url or (lambda name: None)), key)
        except ValueError:
            for resource in resources:
                resource.close()
            raise
        return cls(ops, resources)  # type: ignore[arg-type]

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        total_in = len(experiences)
        for name, op in self.operators:
            before = len(experiences)
            try:
                experiences, op_metrics = op.process(list(experiences))
            except Exception as exc:
                raise RuntimeError(
                    f"experience operator {name!r} failed on {before} experiences: {exc!r}"
                ) from exc
            for key, value in (op_metrics or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    metrics[f"pipeline/{name}/{key}"] = float(value)
            metrics[f"pipeline/{name}/dropped"] = float(before - len(experiences))
        metrics["pipeline/dropped"] = float(total_in - len(experiences))
        metrics["pipeline/seconds"] = time.perf_counter() - start
        return experiences, metrics

    def close(self) -> None:
        for _, op in self.operators:
            op.close()
        for resource in self.resources:
            resource.close()


class PipelineWriter:
    """A :class:`~trinity.buffer.base.BufferWriter` that runs the experience pipeline on what it
    is given, then writes the result to ``inner`` (and, with ``save_input``, the unprocessed
    experiences to ``input_writer``). :meth:`metrics` adds the last step's pipeline metrics."""

    def __init__(
        self, inner: BufferWriter, pipeline: ExperiencePipeline, input_writer: BufferWriter | None = None
    ) -> None:
        self.inner, self.pipeline, self.input_writer = inner, pipeline, input_writer
        self.last: dict[str, float] = {}
        self.dropped = 0

    def write(self, experiences: Sequence[Experience]) -> None:
        if self.input_writer is not None:
            self.input_writer.write(experiences)
        kept, self.last = self.pipeline.process(list(experiences))
        self.dropped += len(experiences) - len(kept)
        if kept:
            self.inner.write(kept)

    def end_step(self, step: int) -> None:
        self.inner.end_step(step)

    def finish(self) -> None:
        self.pipeline.close()
        if self.input_writer is not None:
            self.input_writer.finish()
        self.inner.finish()

    def metrics(self) -> dict[str, float]:
        return {**self.inner.metrics(), **self.last, "pipeline/dropped_total": float(self.dropped)}


def with_experience_pipeline(
    config: Config, writer: BufferWriter, served: ModelServer | None = None
) -> BufferWriter:
    """``writer`` behind the configured experience pipeline (``writer`` itself when there is none).

    ``served``: a :class:`~trinity.data.served_models.ModelServer` whose auxiliary models the
    operators may call (closed with the pipeline)."""
    pipeline = ExperiencePipeline.from_config(
        config, served.url if served is not None else None, [served] if served is not None else ()
    )
    if pipeline is None:
        return writer
    settings = config.data_processor.experience_pipeline
    input_writer = None
    if settings.save_input:
        input_writer = _input_writer(config, settings.input_save_path)
    names = ", ".join(name for name, _ in pipeline.operators)
    logger.info("experience pipeline: %s%s", names, " (raw input saved too)" if input_writer else "")
    return PipelineWriter(writer, pipeline, input_writer)


def _input_writer(config: Config, path: str | None) -> BufferWriter:
    """Where ``save_input`` keeps the unprocessed experiences: ``input_save_path`` (a ``.jsonl``
    file, a folder, or an SQLAlchemy URL / ``.db`` file), by default
    ``<job dir>/experience_pipeline_input.jsonl``."""
    import os

    from trinity.buffer.file import FileWriter
    from trinity.buffer.sql import SQLStorage, SQLWriter

    name = "experience_pipeline_input"
    if not path:
        return FileWriter(os.path.join(config.checkpoint_job_dir, f"{name}.jsonl"), name)
    if "://" in path or path.endswith((".db", ".sqlite")):
        return SQLWriter(SQLStorage(path, name))
    return FileWriter(path, name)
