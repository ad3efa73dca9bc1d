"""A base class for multi-turn (agentic) workflows: the model drives an environment turn by turn.

Subclass :class:`MultiTurnWorkflow` and implement two methods (plain or ``async``):

- ``reset_env()``: start an episode for ``self.task`` and return the first observation;
- ``step_env(response_text)``: apply the model's reply, return a :class:`StepResult`
  (or a tuple ``(observation, reward, done[, info])``).

The base class runs the loop: it shows each observation as a user message
(:meth:`~MultiTurnWorkflow.format_observation`), asks the model for one reply per turn, and stops
when the environment says ``done``, after ``max_turns`` turns, when a turn outlives
``turn_timeout`` seconds, or when the conversation would no longer fit in ``max_model_len``
tokens. The episode becomes training data in one of two shapes (``workflow_args.step_wise``):

- concatenated (default): one Experience for the whole conversation, built by
  ``model.convert_messages_to_experience`` (the assistant tokens in ``action_mask``);
- step-wise: one Experience per model call, all of one episode with the same ``eid.run`` and
  ``eid.step`` = the turn (0, 1, ...), for ``algorithm_type: multi_step_grpo`` / ``gigpo``.

``workflow_args`` read here (subclasses add their own):

==================  =========================================================================
``max_turns``       most model calls per episode (aliases: see ``max_turns_keys``; default
                    ``default_max_turns``)
``step_wise``       ``true``: one Experience per turn; ``false`` (default): one per episode
``turn_timeout``    seconds one turn (model call plus environment step) may take; ``null``: no
                    limit (the task as a whole is still bounded by ``explorer.max_timeout``)
``max_model_len``   longest conversation in tokens; default: the model's ``max_model_len``
                    when the model wrapper exposes one, else no limit
``min_turn_tokens`` a turn needs room for at least this many reply tokens (default 1)
==================  =========================================================================
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Task, Workflow

if TYPE_CHECKING:
    from trinity.experience import Experience

#: Why an episode ended (``Episode.terminate_reason``, ``info["terminate_reason"]``).
DONE = "done"
MAX_TURNS = "max_turns"
MAX_MODEL_LEN = "max_model_len"
TURN_TIMEOUT = "turn_timeout"
TERMINATE_REASONS = (DONE, MAX_TURNS, MAX_MODEL_LEN, TURN_TIMEOUT)


@dataclass
class StepResult:
    """What the environment answers to one reply."""

    observation: Any
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Any) -> StepResult:
        """A :class:`StepResult` from itself or a ``(observation, reward, done[, info])`` tuple."""
        if isinstance(value, StepResult):
            return value
        if isinstance(value, tuple) and len(value) in (3, 4):
            observation, reward, done = value[:3]
            info = dict(value[3] or {}) if len(value) == 4 else {}
            return cls(observation, float(reward), bool(done), info)
        raise TypeError(
            "step_env() must return a StepResult or a tuple (observation, reward, done[, info]), "
            f"got {type(value).__name__}"
        )


@dataclass
class Turn:
    """One model call and the environment's answer to it."""

    index: int  #: 0, 1, ... (``eid.step`` in step-wise mode)
    observation: Any  #: the observation the model acted on
    prompt: str  #: the user message that showed it
    response_text: str
    experience: Experience  #: what ``model.chat_async`` returned for this call
    reward: float = 0.0  #: the environment's reward for this step
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  #: the environment's step info
    state_hash: str = ""  #: :meth:`MultiTurnWorkflow.state_hash` of ``observation``
    next_observation: Any = None  #: what the environment showed after this step


@dataclass
class Episode:
    """A played episode: the conversation, its turns and why it ended."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False  #: the environment ended it
    terminate_reason: str = ""  #: one of :data:`TERMINATE_REASONS`
    observation: Any = None  #: the latest observation (after the last turn)

    @property
    def step_rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def truncated(self) -> bool:
        """Ended by a limit (turns, length, timeout) rather than by the environment."""
        return not self.done


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _optional_number(args: dict[str, Any], key: str, kind: type) -> Any:
    value = args.get(key)
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"workflow_args.{key} must be a positive number or null, got {value!r}") from None
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"workflow_args.{key} must be a positive number or null, got {value!r}")
    return number


def positive_int(value: Any, key: str) -> int:
    """``workflow_args[key]`` as an integer >= 1; ``ValueError`` naming the key otherwise."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or (isinstance(value, float) and value != number) or number < 1:
        raise ValueError(f"workflow_args.{key} must be an integer >= 1, got {value!r}")
    return number


def as_bool(value: Any, key: str) -> bool:
    """``workflow_args[key]`` as a bool (``true``/``false``, also as text or 0/1); ``ValueError`` otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"workflow_args.{key} must be true or false, got {value!r}")


def rollout_kwargs(rollout_args: Any) -> dict[str, Any]:
    """The taskset's ``rollout_args`` as keyword arguments for ``model.chat`` (unset ones left
    out, so the engine's defaults apply)."""
    if rollout_args is None:
        return {}
    if hasattr(rollout_args, "model_dump"):
        return rollout_args.model_dump(exclude_none=True)
    return {k: v for k, v in dict(rollout_args).items() if v is not None}


class MultiTurnWorkflow(Workflow):
    """Runs one episode of an environment per run (see the module docstring).

    Subclasses implement :meth:`reset_env` and :meth:`step_env` and may override
    :meth:`system_prompt` (or :meth:`initial_messages`), :meth:`format_observation`, :meth:`state_hash`,
    :meth:`episode_reward`, :meth:`episode_info` and :meth:`close_env`. To read their own
    ``workflow_args`` or task columns, override :meth:`reset` and call ``super().reset(task)``
    first (the instance is reused across tasks: ``can_reset``).
    """

    is_async: ClassVar[bool] = True
    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = False  # one episode per run; the runner numbers the runs

    #: ``workflow_args`` keys of the turn limit, the first one present wins.
    max_turns_keys: ClassVar[tuple[str, ...]] = ("max_turns", "max_env_steps")
    default_max_turns: ClassVar[int] = 10
    default_step_wise: ClassVar[bool] = False

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    # -- configuration ---------------------------------------------------------------------

    def reset(self, task: Task) -> None:
        """Point this instance at ``task`` and read the base class's ``workflow_args``."""
        self.task = task
        self.repeat_times = task.repeat_times
        self.workflow_args: dict[str, Any] = dict(task.workflow_args or {})
        args = self.workflow_args
        key = next((k for k in self.max_turns_keys if args.get(k) is not None), None)
        self.max_turns = positive_int(
            self.default_max_turns if key is None else args[key], key or "max_turns"
        )
        self.step_wise = as_bool(args.get("step_wise", self.default_step_wise), "step_wise")
        self.turn_timeout: float | None = _optional_number(args, "turn_timeout", float)
        self.max_model_len: int | None = _optional_number(args, "max_model_len", int)
        self.min_turn_tokens: int = _optional_number(args, "min_turn_tokens", int) or 1

    # -- what subclasses implement ---------------------------------------------------------

    def reset_env(self) -> Any:
        """Start an episode for ``self.task``; return the first observation (may be ``async``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset_env()")

    def step_env(self, response_text: str) -> StepResult | tuple:
        """Apply the model's reply; return a :class:`StepResult` or ``(observation, reward,
        done[, info])`` (may be ``async``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step_env(response_text)")

    def close_env(self) -> Any:
        """Release the episode's environment (called after every episode; may be ``async``)."""
        return None

    def system_prompt(self) -> str | None:
        """The system message; default: the taskset's ``format.system_prompt``."""
        return self.task.format_args.system_prompt

    def initial_messages(self) -> list[dict[str, Any]]:
        """The conversation before the first observation; default: the :meth:`system_prompt`
        as a system message, if any. (A second attempt that shows the model its first one
        returns that conversation here.)"""
        system = self.system_prompt()
        return [{"role": "system", "content": system}] if system else []

    def format_observation(self, observation: Any, turn: int) -> str:
        """The user message showing ``observation`` before turn ``turn`` (0-based)."""
        return str(observation)

    def state_hash(self, observation: Any) -> str:
        """An id of the environment state the model acts on (GiGPO groups equal states of one
        task's episodes); default: a digest of ``str(observation)``."""
        return hashlib.sha256(str(observation).encode()).hexdigest()[:16]

    def episode_reward(self, episode: Episode) -> float:
        """The episode's reward; default: the sum of the environment's step rewards."""
        return float(sum(episode.step_rewards))

    def episode_info(self, episode: Episode) -> dict[str, Any]:
        """Extra ``info`` of the episode (its numbers are logged as metrics too)."""
        return {}

    # -- running ---------------------------------------------------------------------------

    def run(self) -> list[Experience]:
        """Synchronous entry point (for callers without an event loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async())
        raise RuntimeError(f"{type(self).__name__}.run() was called inside an event loop; await run_async()")

    async def run_async(self) -> list[Experience]:
        """Play one episode and return its Experience(s)."""
        episode = await self.play_episode()
        return await self.to_experiences(episode)

    async def play_episode(self) -> Episode:
        """Run the reset/step loop; the conversation always ends with an assistant message."""
        episode = Episode()
        messages = episode.messages
        try:
            observation = episode.observation = await _resolve(self.reset_env())
            messages.extend(self.initial_messages())
            limit = self.resolve_max_model_len()
            prompt_limit = self.resolve_max_prompt_tokens()
            base_args = {**rollout_kwargs(self.task.rollout_args), "n": 1}
            per_turn_cap = base_args.get("max_tokens") or self._engine_max_tokens()
            for index in range(self.max_turns):
                prompt = self.format_observation(observation, index)
                mark = len(messages)
                messages.append({"role": "user", "content": prompt})
                args = dict(base_args)
                if limit is not None or prompt_limit is not None:
                    used = await self.count_prompt_tokens(messages)
                    if used is not None:
                        budget = None if limit is None else limit - used
                        # Over max_prompt_tokens the engine answers with a placeholder masked out
                        # of training: the conversation has no room left, as past max_model_len.
                        full = prompt_limit is not None and used > prompt_limit
                        if full or (budget is not None and budget < self.min_turn_tokens):
                            del messages[mark:]
                            if not episode.turns:
                                raise ValueError(
                                    f"{type(self).__name__}: the first prompt takes {used} tokens, over "
                                    f"max_prompt_tokens {prompt_limit} or leaving less than min_turn_tokens "
                                    f"({self.min_turn_tokens}) of max_model_len {limit} for the reply; raise "
                                    "the limits or shorten the prompt"
                                )
                            episode.terminate_reason = MAX_MODEL_LEN
                            break
                        if budget is not None:
                            args["max_tokens"] = min(per_turn_cap or budget, budget)
                try:
                    turn = await self._timed(self._turn(index, observation, prompt, messages, args))
                except asyncio.TimeoutError:
                    if self.turn_timeout is None:
                        raise  # the environment's own error, not a turn limit
                    del messages[mark:]
                    if not episode.turns:
                        raise TimeoutError(
                            f"{type(self).__name__}: the first turn took longer than turn_timeout "
                            f"({self.turn_timeout} s)"
                        ) from None
                    episode.terminate_reason = TURN_TIMEOUT
                    break
                episode.turns.append(turn)
                observation = episode.observation = turn.next_observation
                if turn.done:
                    episode.done = True
                    episode.terminate_reason = DONE
                    break
                if limit is not None and turn.experience.tokens.shape[0] >= limit:
                    episode.terminate_reason = MAX_MODEL_LEN  # no room left for another turn
                    break
            else:
                episode.terminate_reason = MAX_TURNS
        finally:
            await _resolve(self.close_env())
        return episode

    async def _timed(self, coro: Any) -> Any:
        if self.turn_timeout is None:
            return await coro
        return await asyncio.wait_for(coro, self.turn_timeout)

    async def _turn(
        self, index: int, observation: Any, prompt: str, messages: list[dict[str, Any]], args: dict[str, Any]
    ) -> Turn:
        experiences = await self.model.chat_async(messages, **args)
        exp = experiences[0]
        reply = exp.response_text or ""
        messages.append({"role": "assistant", "content": reply})
        step = StepResult.coerce(await _resolve(self.step_env(reply)))
        return Turn(
            index=index,
            observation=observation,
            prompt=prompt,
            response_text=reply,
            experience=exp,
            reward=float(step.reward),
            done=bool(step.done),
            info=dict(step.info),
            state_hash=self.state_hash(observation),
            next_observation=step.observation,
        )

    # -- lengths ---------------------------------------------------------------------------

    def resolve_max_model_len(self) -> int | None:
        """``workflow_args.max_model_len``, else the model's (``model.max_model_len`` or its
        engine's), else ``None`` (no length limit)."""
        if self.max_model_len is not None:
            return self.max_model_len
        for owner in (self.model, getattr(self.model, "engine", None)):
            value = getattr(owner, "max_model_len", None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def resolve_max_prompt_tokens(self) -> int | None:
        """The model's ``max_prompt_tokens`` when its engine masks longer prompts out
        (``enable_prompt_truncation``): a conversation that grows past it ends there, as one past
        ``max_model_len`` does; ``None`` otherwise."""
        value = getattr(self.model, "max_prompt_tokens", None)
        if not getattr(self.model, "enable_prompt_truncation", False):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def _engine_max_tokens(self) -> int | None:
        defaults = getattr(getattr(self.model, "engine", None), "default_args", None)
        value = getattr(defaults, "max_tokens", None)
        return value if isinstance(value, int) and value > 0 else None

    async def count_prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        """Tokens of the prompt the model will see for ``messages`` (chat template with the
        generation prompt); ``None`` when the model exposes no tokenizer (then the length limit
        is only checked on the tokens each call returns)."""
        engine = getattr(self.model, "engine", None)
        tokenizer = getattr(self.model, "tokenizer", None) or getattr(engine, "tokenizer", None)
        if tokenizer is None:
            return None
        if callable(getattr(engine, "apply_chat_template", None)):
            text = engine.apply_chat_template(messages)
        else:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- experiences -----------------------------------------------------------------------

    async def to_experiences(self, episode: Episode) -> list[Experience]:
        """The episode as training data: one Experience (concatenated) or one per turn."""
        if not episode.turns:
            return []
        reward = float(self.episode_reward(episode))
        step_rewards = episode.step_rewards
        # Per-step rewards sum to the episode reward: whatever the environment's step rewards
        # do not account for (a custom episode_reward, a penalty) lands on the last step.
        step_rewards[-1] += reward - math.fsum(step_rewards)
        extra = dict(self.episode_info(episode))
        info = {
            "env_steps": len(episode.turns),
            "env_done": int(episode.done),
            "truncated": episode.truncated,
            "terminate_reason": episode.terminate_reason,
            "episode_reward": reward,
            **extra,
        }
        metrics = {
            "env_steps": float(len(episode.turns)),
            "env_done": float(episode.done),
            "truncated": float(episode.truncated),
            "turn_timeout": float(episode.terminate_reason == TURN_TIMEOUT),
            "max_model_len_reached": float(episode.terminate_reason == MAX_MODEL_LEN),
            "max_turns_reached": float(episode.terminate_reason == MAX_TURNS),
        }
        for key, value in extra.items():
            if isinstance(value, (int, float)):  # bool included
                metrics[key] = float(value)

        if not self.step_wise:
            exp = await self._convert(episode.messages)
            exp.reward = reward
            exp.info = {**(exp.info or {}), **info, "step_rewards": step_rewards}
            exp.metrics = {**(exp.metrics or {}), **metrics}
            exp.eid.run = self.run_id_base
            exp.eid.step = 0
            return [exp]

        import torch

        out = []
        last = len(episode.turns) - 1
        for turn, step_reward in zip(episode.turns, step_rewards):
            exp = turn.experience
            exp.eid.run = self.run_id_base
            exp.eid.step = turn.index
            exp.reward = reward
            if exp.action_mask is None:
                exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
            exp.info = {
                **(exp.info or {}),
                **turn.info,
                "step": turn.index,
                "step_reward": step_reward,
                "env_state_hash": turn.state_hash,
            }
            if turn.index == last:  # episode-level numbers once per episode
                exp.info.update(info)
                exp.metrics = {**(exp.metrics or {}), **metrics}
            out.append(exp)
        return out

    async def _convert(self, messages: list[dict[str, Any]]) -> Experience:
        convert_async = getattr(self.model, "convert_messages_to_experience_async", None)
        if callable(convert_async):
            return await convert_async(messages)
        # It scores the whole conversation (a forward pass, or a round trip to the engine):
        # in a thread, so the other episodes on this event loop go on meanwhile.
        return await asyncio.to_thread(self.model.convert_messages_to_experience, messages)

    def process_messages_to_experience(
        self, messages: list[dict[str, Any]], reward: float, info: dict[str, Any] | None = None
    ) -> Experience:
        """Trinity-RFT's helper, for porting its multi-turn workflows: one Experience for
        ``messages`` with ``reward``, ``info`` and the numbers of ``info`` as metrics."""
        exp = self.model.convert_messages_to_experience(messages)
        exp.reward = float(reward)
        exp.info = {**(exp.info or {}), **(info or {})}
        exp.metrics = {
            **(exp.metrics or {}),
            **{k: float(v) for k, v in (info or {}).items() if isinstance(v, (int, float))},
        }
        exp.eid.run = self.run_id_base
        return exp


__all__ = [
    "DONE",
    "MAX_MODEL_LEN",
    "MAX_TURNS",
    "TERMINATE_REASONS",
    "TURN_TIMEOUT",
    "Episode",
    "MultiTurnWorkflow",
    "StepResult",
    "Turn",
    "as_bool",
    "positive_int",
    "rollout_kwargs",
]
