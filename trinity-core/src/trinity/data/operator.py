"""The two operator contracts of the data processor (component kind ``operator``).

An :class:`ExperienceOperator` sees the experiences of one explore step, between the explorer
and the buffer: it may change them (reshape rewards, add ``info`` stats), drop some (the
pipeline counts the drops) and report metrics. A :class:`TaskOperator` sees task rows (plain
dicts, as read from the taskset file) in batches before exploring: it maps or filters them.

Both are built as ``cls(**args)`` with ``args`` = ``default_args()`` updated by the config's
``args``, so an unknown argument fails at start with the operator named. Before its first
batch an operator is given the job's services through :meth:`Operator.bind` (the address of
each auxiliary model the job serves, the Data-Juicer service). Plugins register more through
the ``register_operators`` hook (``docs/data.md`` has a worked example).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from trinity.config.sections.data import DataJuicerServiceConfig
    from trinity.experience import Experience


def _no_model(name: str) -> str | None:
    return None


@dataclass(frozen=True)
class OperatorContext:
    """What the job offers its operators (see :meth:`Operator.bind`).

    Attributes:
        model_url: ``model_url(name)`` is the OpenAI-compatible base URL (``.../v1``) of the
            model ``name`` when this job serves it (an ``explorer.auxiliary_models`` entry whose
            ``name`` or ``model_path`` is ``name``; started on first request), else ``None``.
        data_juicer: the job's ``service.data_juicer`` settings (``None``: run recipes in-process).
        dry_run: the config is only being checked (``trinity run`` at load, ``--dry-run``): resolve
            names and fail on what is missing, but start and connect to nothing; ``model_url``
            then returns a placeholder for the models the job would serve.
        job_dir: the job's folder (``checkpoint_job_dir``), for what an operator keeps across
            restarts (the labels of ``human_preference_annotation_mapper``); ``None`` outside a job.
        checkpoint_root: the job's ``checkpoint_root_dir`` (where ``trinity studio`` looks).
    """

    model_url: Callable[[str], str | None] = _no_model
    data_juicer: DataJuicerServiceConfig | None = None
    dry_run: bool = False
    job_dir: str | None = None
    checkpoint_root: str | None = None


class Operator:
    """Base class of every data-processor operator (what ``register_operators`` accepts).

    Subclass :class:`ExperienceOperator` or :class:`TaskOperator`, not this class.
    """

    #: The pipelines the operator can run in (``task_pipeline``, ``experience_pipeline``): set
    #: from the contract classes it derives from, so config loading checks it through the
    #: registry without building the operator.
    pipelines: ClassVar[frozenset[str]] = frozenset()
    #: The pipeline a contract class adds to its subclasses' :attr:`pipelines`.
    pipeline: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found = {cls.__dict__["pipeline"]} if cls.__dict__.get("pipeline") else set()
        for base in cls.__mro__[1:]:
            found |= set(getattr(base, "pipelines", ()))
        cls.pipelines = frozenset(found)

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        """Arguments used where the config gives none (shown by the studio and the docs)."""
        return {}

    def bind(self, context: OperatorContext) -> None:
        """Take what the job offers before the first batch: e.g. point an LLM scorer at an
        auxiliary model served by this job (``context.model_url(name)``). Raise ``ValueError``
        (one line) for what the operator needs and cannot get. The default takes nothing."""

    def close(self) -> None:
        """Release what the operator holds (clients, processes); called once at the end."""


class ExperienceOperator(Operator):
    """Maps or filters the experiences of one explore step.

    Override :meth:`process`. Experiences of one task share ``eid.tid`` (a GRPO group); a
    filter that drops a group's signal should drop the whole group. Metrics are plain numbers,
    logged as ``pipeline/<operator name>/<key>`` with the explore step's metrics.
    """

    pipeline: ClassVar[str | None] = "experience_pipeline"

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], Mapping[str, float]]:
        """The experiences to keep (changed in place or new) and metrics about this step."""
        raise NotImplementedError


class TaskOperator(Operator):
    """Maps or filters task rows (dicts) before exploring.

    Override :meth:`process`, which gets a batch of rows (at most ``batch_size`` of them) and
    returns the rows to keep. With ``task_pipeline.num_process`` > 1 batches go to worker
    processes, so an operator must be picklable and must not rely on seeing every row in one
    call unless it sets ``whole_dataset = True`` (then it gets all rows at once, in the main
    process: deduplication, top-k).
    """

    pipeline: ClassVar[str | None] = "task_pipeline"
    #: Rows per call to :meth:`process`.
    batch_size: int = 256
    #: Whether :meth:`process` must see every row in one call (runs in the main process).
    whole_dataset: bool = False
    #: Whether the same rows and arguments always give the same output, so that a repeated job
    #: may reuse the pipeline's saved output; false for output that grows with time (people's
    #: labels): the pipeline then runs again each time.
    reusable_output: ClassVar[bool] = True

    def input_fields(self) -> list[str]:
        """Fields of the input rows the operator reads, kept in the rows even where
        ``task_pipeline.target_fields`` does not name them (it narrows the rows to its fields)."""
        return []

    def process(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Mapping[str, float]]:
        """The rows to keep (changed or new dicts) and metrics about this batch (summed)."""
        raise NotImplementedError
