"""Single-turn workflows: ask once, sample ``repeat_times`` answers in one call, score each.

Registered names:

* ``simple_workflow`` / ``async_simple_workflow``  the prompt as the user turn, the taskset's
  reward function;
* ``math_workflow`` / ``async_math_workflow``  the same with a DeepSeek-R1 system prompt asking
  for ``<think>…</think><answer>…</answer>``; ``math_reward`` unless the taskset names another;
* ``math_boxed_workflow``  a "put your final answer in ``\\boxed{}``" prompt and
  ``math_boxed_reward``; ``workflow_args.use_base: true`` sends a raw text prompt through
  ``model.generate`` (base models), ``with_think`` / ``format_score_coef`` reach the reward,
  and so do the response's token ids (``response_token``, as in Trinity-RFT: e.g. for
  ``math_dapo_reward``'s overlong penalty; the other workflows pass them to rewards that ask).

Each Experience gets ``reward`` = the sum of the reward function's parts, the parts in
``metrics`` (with, for the verifying math rewards, ``reward_refused`` and ``reward_timeout``:
see :meth:`trinity_math.rewards._VerifyingReward.take_metrics`), and ``eid.run`` =
``run_id_base + i``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import RewardFn, Task, Workflow
from trinity_math.rewards import MathBoxedRewardFn, MathRewardFn

if TYPE_CHECKING:
    from trinity.experience import Experience

R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e.,\n"
    "<think> reasoning process here </think>\n<answer> answer here </answer>."
)
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
BOXED_THINK_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems. First think about the reasoning "
    "process, written as <think>\n...your reasoning...\n</think>\n, then give the final answer "
    "as a closed-form result within \\boxed{}."
)


def _as_dict(args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    if hasattr(args, "model_dump"):
        return args.model_dump()
    return dict(args)


class PromptWorkflow(Workflow):
    """Reads a chat prompt from the task row: ``format.system_prompt`` (else
    :attr:`default_system_prompt`), the prompt (``format.prompt_key``) as the user turn
    (:meth:`user_content`), ``format.reply_prefix`` as the start of the assistant turn, which the
    model continues. Samples ``repeat_times`` answers in one call (:attr:`rollout_args`).
    Subclasses read their ``workflow_args`` in :meth:`_configure`."""

    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = True

    #: System prompt used when the taskset's ``format.system_prompt`` is not set.
    default_system_prompt: ClassVar[str | None] = None

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    @property
    def display_name(self) -> str:
        """How messages name this workflow."""
        return type(self).__name__

    def reset(self, task: Task) -> None:
        """Point this instance at ``task``."""
        self.task = task
        prompt = self.read_prompt(task)
        if prompt is None:
            raise ValueError(
                f"{self.display_name}: task {task.index} of taskset {task.taskset_name!r} has no "
                f"prompt column {task.format_args.prompt_key!r} (columns: {sorted(task.raw_task)}); "
                "set the taskset's `format.prompt_key`"
            )
        self.task_desc = prompt
        self.truth = self.read_truth(task)
        fmt = task.format_args
        self.system_prompt = (
            fmt.system_prompt if fmt.system_prompt is not None else self.default_system_prompt
        )
        self.reply_prefix = fmt.reply_prefix
        self.workflow_args = dict(task.workflow_args or {})
        self._configure(self.workflow_args)

    def read_prompt(self, task: Task) -> Any:
        """The task's prompt (``None``: it has none); subclasses may read other columns."""
        return task.task_desc

    def read_truth(self, task: Task) -> str | None:
        """The task's reference answer; subclasses may read other columns."""
        return task.truth

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        """Read ``workflow_args`` (subclasses); this workflow has none."""

    @property
    def rollout_args(self) -> dict[str, Any]:
        """The taskset's ``rollout_args`` that are set, with ``n = repeat_times``."""
        args = {k: v for k, v in _as_dict(self.task.rollout_args).items() if v is not None}
        args["n"] = self.repeat_times
        return args

    def user_content(self) -> str:
        """The user turn: the task's prompt."""
        return self.task_desc

    def format_messages(self) -> list[dict[str, str]]:
        """The chat sent to the model."""
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.user_content()})
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages


class SimpleWorkflow(PromptWorkflow):
    """Prompt → ``repeat_times`` answers (one ``model.chat(n=...)`` call) → reward each.

    Messages as :class:`PromptWorkflow`. The reward function is
    ``task.reward_fn(**reward_fn_args)`` called as ``reward_fn(response_text, truth)``.
    """

    is_async: ClassVar[bool] = False

    #: Reward function used when the taskset names none.
    default_reward_fn: ClassVar[type[RewardFn] | None] = None
    #: Pass every reward the response's token ids as ``response_token`` (see :meth:`score`).
    passes_response_token: ClassVar[bool] = False

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        self._reward_key: tuple[type, str] | None = None
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def reset(self, task: Task) -> None:
        """Point this instance at ``task``; the reward function is rebuilt only if it changed."""
        super().reset(task)
        reward_cls = task.reward_fn or self.default_reward_fn
        if reward_cls is None:
            raise ValueError(
                f"{type(self).__name__} needs a reward function: set the taskset's "
                "`default_reward_fn_type` (e.g. math_reward, countdown_reward)"
            )
        key = (reward_cls, repr(sorted((task.reward_fn_args or {}).items())))
        if key != self._reward_key:  # reward functions may be costly to build: reuse when equal
            self.reward_fn: RewardFn = reward_cls(**(task.reward_fn_args or {}))
            self._reward_key = key

    def reward_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments for every reward call (subclasses)."""
        return {}

    def score(self, responses: list[Experience]) -> list[Experience]:
        """Set ``reward``, ``metrics`` and ``eid.run`` on each response; returns them.

        The response's token ids reach the reward as ``response_token`` when the workflow sets
        ``passes_response_token`` or the reward sets ``needs_response_token`` (as
        ``math_dapo_reward`` does, for its overlong penalty).
        """
        kwargs = dict(self.reward_kwargs())
        with_tokens = self.passes_response_token or getattr(self.reward_fn, "needs_response_token", False)
        for i, exp in enumerate(responses):
            if with_tokens:
                kwargs["response_token"] = exp.tokens[exp.prompt_length :]
            parts = self.reward_fn(exp.response_text or "", self.truth, **kwargs)
            exp.metrics.update({name: float(value) for name, value in parts.items()})
            exp.reward = float(sum(parts.values()))
            if callable(take := getattr(self.reward_fn, "take_metrics", None)):
                # Counts that are not reward parts (a verifying reward's refusals, timeouts).
                exp.metrics.update(take())
            exp.eid.run = self.run_id_base + i
        return responses

    def _start_verifier(self) -> None:
        # In the thread that will score: a verifying reward's worker starts while we generate.
        start = getattr(self.reward_fn, "start_verifier", None)
        if callable(start):
            start()

    def run(self) -> list[Experience]:
        """One ``model.chat`` call for all ``repeat_times`` samples, then score them."""
        self._start_verifier()
        return self.score(self.model.chat(self.format_messages(), **self.rollout_args))

    async def run_async(self) -> list[Experience]:
        """Same as :meth:`run` through ``model.chat_async``."""
        self._start_verifier()
        return self.score(await self.model.chat_async(self.format_messages(), **self.rollout_args))


class AsyncSimpleWorkflow(SimpleWorkflow):
    """``simple_workflow`` run by awaiting ``model.chat_async``."""

    is_async: ClassVar[bool] = True


class MathWorkflow(SimpleWorkflow):
    """``simple_workflow`` with the DeepSeek-R1 ``<think>/<answer>`` system prompt and ``math_reward``.

    ``format.system_prompt`` replaces the default prompt; ``default_reward_fn_type`` (e.g.
    ``countdown_reward``) replaces the reward.
    """

    default_system_prompt: ClassVar[str | None] = R1_SYSTEM_PROMPT
    default_reward_fn: ClassVar[type[RewardFn] | None] = MathRewardFn


class AsyncMathWorkflow(MathWorkflow):
    """``math_workflow`` run by awaiting ``model.chat_async``."""

    is_async: ClassVar[bool] = True


class MathBoxedWorkflow(SimpleWorkflow):
    """Answers in ``\\boxed{}``, scored by ``math_boxed_reward`` unless the taskset names another.

    ``workflow_args``:
        use_base: send ``System: ...\\nUser:\\n<prompt>\\nAssistant:\\n`` through
            ``model.generate`` instead of a chat (for base models without a chat template).
        with_think: ask for a ``<think>`` block and penalise its absence in the reward.
        format_score_coef: size of that penalty (default 0.1).
    """

    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("use_base", "with_think", "format_score_coef")
    # Trinity-RFT's math_boxed_workflow gives every reward the response's tokens.
    passes_response_token: ClassVar[bool] = True

    default_reward_fn: ClassVar[type[RewardFn] | None] = MathBoxedRewardFn

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        unknown = sorted(set(workflow_args) - set(self.WORKFLOW_ARGS))
        if unknown:
            raise ValueError(
                f"math_boxed_workflow: unknown workflow_args {unknown}; valid: {list(self.WORKFLOW_ARGS)}"
            )
        self.use_base = bool(workflow_args.get("use_base", False))
        self.with_think = workflow_args.get("with_think")
        self.format_score_coef = workflow_args.get("format_score_coef")
        if self.task.format_args.system_prompt is None:
            self.system_prompt = BOXED_THINK_SYSTEM_PROMPT if self.with_think else BOXED_SYSTEM_PROMPT

    def reward_kwargs(self) -> dict[str, Any]:
        kwargs = {"with_think": self.with_think, "format_score_coef": self.format_score_coef}
        return {k: v for k, v in kwargs.items() if v is not None}

    def format_prompt(self) -> str:
        """The raw prompt used with ``use_base``."""
        text = f"System: {self.system_prompt}\n" if self.system_prompt else ""
        text += f"User:\n{self.task_desc}\nAssistant:\n"
        return text + (self.reply_prefix or "")

    def run(self) -> list[Experience]:
        if self.use_base:
            return self.score(self.model.generate([self.format_prompt()], **self.rollout_args))
        return super().run()

    async def run_async(self) -> list[Experience]:
        if self.use_base:
            return self.score(await self.model.generate_async([self.format_prompt()], **self.rollout_args))
        return await super().run_async()
