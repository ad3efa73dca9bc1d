"""Tasks, workflows, reward functions and the model interface workflows talk to.

:class:`ModelWrapperProtocol` is what a workflow may rely on of its ``model``;
:class:`trinity.explorer.model_wrapper.ModelWrapper` is the class the explorer hands it.
"""

from __future__ import annotations

import asyncio
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from trinity.algorithm.component import Component

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trinity.config import FormatConfig, GenerationConfig
    from trinity.experience import Experience


def _format_config() -> FormatConfig:
    from trinity.config import FormatConfig

    return FormatConfig()


def _generation_config() -> GenerationConfig:
    from trinity.config import GenerationConfig

    return GenerationConfig()


@dataclass
class Task:
    """One row of a taskset, with everything needed to build and run its workflow.

    ``workflow`` and ``reward_fn`` are the registered classes (resolved by the taskset reader
    from ``default_workflow_type`` / ``workflow_key`` and friends). ``raw_task`` is the row
    itself; ``format_args``, ``rollout_args``, ``workflow_args`` and ``reward_fn_args`` come
    from the taskset's config.
    """

    workflow: type[Workflow] | None = None
    reward_fn: type[RewardFn] | None = None
    raw_task: dict[str, Any] = field(default_factory=dict)
    format_args: FormatConfig = field(default_factory=_format_config)
    rollout_args: GenerationConfig = field(default_factory=_generation_config)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    repeat_times: int = 1
    is_eval: bool = False
    taskset_name: str = ""
    index: int = 0

    @property
    def task_desc(self) -> str | None:
        """The prompt text, read with ``format_args.prompt_key``."""
        value = self.raw_task.get(self.format_args.prompt_key)
        return None if value is None else str(value)

    @property
    def truth(self) -> str | None:
        """The reference answer, read with ``format_args.response_key``."""
        value = self.raw_task.get(self.format_args.response_key)
        return None if value is None else str(value)

    def to_workflow(self, model: ModelWrapperProtocol, auxiliary_models: list[Any] | None = None) -> Workflow:
        """Instantiate this task's workflow."""
        if self.workflow is None:
            raise ValueError(f"task {self.index} of taskset {self.taskset_name!r} has no workflow")
        return self.workflow(task=self, model=model, auxiliary_models=auxiliary_models)


class Workflow(ABC):
    """Runs one task against the model and returns Experiences.

    Flags (class attributes) tell the runner what it may do:
        can_reset: the instance can be reused for another task through :meth:`reset`.
        can_repeat: the workflow produces ``repeat_times`` rollouts itself (e.g. one
            ``chat(n=...)`` call); otherwise the runner runs it ``repeat_times`` times.
        is_async: the runner awaits :meth:`run_async` instead of calling :meth:`run`.
    """

    can_reset: ClassVar[bool] = False
    can_repeat: ClassVar[bool] = False
    is_async: ClassVar[bool] = False
    #: The ``workflow_args`` keys this workflow reads, if it declares them: a taskset giving
    #: any other key then fails when the config loads, naming it. ``None``: ``workflow_args``
    #: is a free mapping the workflow reads as it likes (nothing is checked).
    WORKFLOW_ARGS: ClassVar[tuple[str, ...] | None] = None

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapperProtocol,
        auxiliary_models: list[Any] | None = None,
    ) -> None:
        self.task = task
        self.model = model
        self.auxiliary_models = list(auxiliary_models or [])
        self.repeat_times = task.repeat_times
        self.run_id_base = 0

    @abstractmethod
    def run(self) -> list[Experience]:
        """Run the task and return the Experiences it produced."""

    async def run_async(self) -> list[Experience]:
        """Async twin of :meth:`run`; by default runs :meth:`run` in a worker thread."""
        return await asyncio.to_thread(self.run)

    def reset(self, task: Task) -> None:
        """Prepare this instance for ``task`` (only when ``can_reset``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be reset (can_reset is False)")

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        """Called by the runner: how many rollouts to produce, and the first run id to use."""
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    @classmethod
    def experiences_per_rollout(cls, workflow_args: Mapping[str, Any]) -> float:
        """Experiences one rollout of this workflow makes, on average, for a training taskset
        with these ``workflow_args`` (default 1).

        The batch geometry (:class:`trinity.config.geometry.BatchGeometry`) divides a training
        batch by it to know how many explore steps fill one. A workflow that adds experiences of
        its own besides its rollouts (the trainable RULER's judgings, trained beside the
        answers) says how many; step-wise workflows, one experience per turn, need not (their
        algorithm types read one explore step per train step whatever it holds).
        """
        return 1.0

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """Why this workflow cannot run taskset row ``row``, or ``None``.

        The taskset reader calls it once per row (``format_args`` is the taskset's
        :class:`~trinity.config.FormatConfig`); a row with a problem is a counted, logged skip
        rather than a failure mid-run. The default asks for what prompt-based workflows read: a
        text under ``format.prompt_key`` or a chat under ``format.messages_key`` (plus the types
        of the response, system prompt and tools columns). Workflows that read their own columns
        from ``task.raw_task`` (an environment's seed, a game file, ToolACE conversations)
        override it to check those instead.
        """
        from trinity.buffer.rows import prompt_row_problem

        return prompt_row_problem(row, format_args)


class RewardFn(Component, ABC):
    """Scores a response: ``__call__(response, truth, **kw) -> {part: value}``.

    The reward is the sum of the values; each part is logged as a metric.
    """

    @abstractmethod
    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        """Return the reward's parts for ``response`` against ``truth``."""


@runtime_checkable
class ModelWrapperProtocol(Protocol):
    """What a workflow sees of the rollout model (one engine, possibly remote).

    :class:`trinity.explorer.model_wrapper.ModelWrapper` implements it; test doubles may too.
    """

    @property
    def model_version(self) -> int:
        """Version of the weights currently loaded (increments on every sync)."""

    def chat(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        """Generate replies to a chat; ``n`` in ``rollout_args`` gives several samples."""

    def generate(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Generate continuations of raw prompts (no chat template)."""

    async def chat_async(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        """Async twin of :meth:`chat`."""

    async def generate_async(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Async twin of :meth:`generate`."""

    def logprobs(self, tokens: list[int]) -> Any:
        """Log-probabilities of ``tokens[1:]`` under the current weights."""

    def convert_messages_to_experience(self, messages: list[dict[str, Any]]) -> Experience:
        """Tokenise a whole conversation with the chat template; ``action_mask`` marks the
        assistant tokens; logprobs are recomputed under the current weights."""

    def get_openai_client(self) -> Any:
        """An OpenAI-compatible client backed by this engine (bound to 127.0.0.1)."""


def __getattr__(name: str) -> Any:
    # ``trinity.workflow.ModelWrapper`` was this protocol's old name; it now names only the
    # class in trinity.explorer.model_wrapper, so old imports keep working with a warning.
    if name == "ModelWrapper":
        warnings.warn(
            "trinity.workflow.ModelWrapper is now trinity.workflow.ModelWrapperProtocol (the class "
            "workflows receive is trinity.explorer.model_wrapper.ModelWrapper)",
            DeprecationWarning,
            stacklevel=2,
        )
        return ModelWrapperProtocol
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
