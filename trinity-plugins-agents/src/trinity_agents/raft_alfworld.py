"""``RAFT_alfworld_workflow`` and ``RAFT_reflect_alfworld_workflow``: RAFT data from ALFWorld games.

Trinity-RFT's RAFT workflows for ALFWorld (its ``examples/RAFT_alfworld``), on the games, rows
and environment of :mod:`trinity_agents.alfworld`. The model answers every turn with three
blocks, ``<experience>`` (general strategies and pitfalls for this kind of task), ``<think>`` and
``<action>``; only the action goes to the game. An attempt is one game of at most
``max_env_steps`` turns (default 50), which also ends, unsuccessfully, when the model gives the
same action three turns in a row (the third one is not played).

``RAFT_alfworld_workflow`` keeps an attempt that won (reward >= 1) with every reply in the
three-block format: the whole conversation is one SFT-style Experience (reward: the game's).
Anything else gives a *placeholder*, one masked token with reward 0 that trains nothing but
carries the attempt's metrics (``success``, ``reward``, ``steps``), as Trinity-RFT's empty
experience does.

``RAFT_reflect_alfworld_workflow`` does the same with a won first attempt; after a lost one it
plays the game again with the first conversation in context, followed by a system message that
says how the first attempt went and asks for better ``<experience>`` (:data:`SECOND_ATTEMPT_GUIDANCE`).
The second attempt is kept when every reply is in the format and its reward beats the first's
(or, winning, in fewer steps); the Experience is the *clean* conversation of the second attempt
(the plain system prompt and its own turns, without the first attempt or the guidance), so the
model learns to do it right the first time.

Evaluation tasks (``is_eval``) play one attempt and return a placeholder with its metrics
(``accuracy``: won or not).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trinity_agents.alfworld import COMMANDS, NOTHING_HAPPENS, AlfworldWorkflow, _observation
from trinity_agents.multi_turn import Episode, StepResult

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.workflow import Task

logger = logging.getLogger(__name__)

# The prompts say what Trinity-RFT's RAFT_prompt/*.j2 templates say, in our own words.
RAFT_SYSTEM_PROMPT = (
    """You are an agent acting in a text-based virtual environment.

## Response format
Every response MUST have exactly these three parts, all of them, in this order:

<experience>The working principles, strategies, common knowledge and likely pitfalls that matter for the current task.</experience>

<think>your reasoning</think>

<action>exactly one command</action>

## Commands
"""
    + COMMANDS
    + """

A response looks like this:
<experience>In household tasks it pays to explore first and learn which objects and receptacles there are. Typical mistakes: forgetting that only one object can be carried, and acting on an object before examining it.</experience>

<think>To do the task, I first need to ...</think>

<action>go to cabinet 1</action>

## Note
The <experience> part must state working principles, strategies, common-sense knowledge and pitfalls that hold for this kind of task in general: no generic filler, no placeholders, no rules that fit only this one situation."""
)

#: The system message that starts a second attempt (``{reward_feedback}``: :func:`reward_feedback`).
SECOND_ATTEMPT_GUIDANCE = """{reward_feedback}

This is your second attempt, and it must go better. Write a more careful and complete <experience>...</experience> part: strategies, common pitfalls and knowledge of the domain that help with the task and avoid the mistakes made before. Learn from the first attempt and use what you learned to decide better; you must update your experience with it. Do NOT give the same action several times in a row: it wastes steps and achieves nothing; when you notice you are repeating yourself, stop and try something else. Do not say in your responses that this is a second attempt and do not refer to earlier attempts: act as if starting afresh, but bring in the general experience and strategies you can draw for this kind of task."""

#: Appended to an observation holding the game's ``Nothing happens.``.
NOTHING_HAPPENS_HINT = (
    " Check that your action is a valid command here and that you followed the response format exactly."
)

_RESPONSE = re.compile(
    r"<experience>\s*(.*?)\s*</experience>.*?<think>\s*(.*?)\s*</think>.*?<action>\s*(.*?)\s*</action>",
    re.DOTALL,
)
#: Identical actions in a row that end an attempt (first attempts; Trinity-RFT's rule).
REPEAT_LIMIT = 3


def parse_response(response: str | None) -> dict[str, str]:
    """The three parts of a reply: ``{"experience", "think", "action"}``, each stripped. They must
    come in that order, each block closed; otherwise all three are ``""`` (so the game gets an
    empty action)."""
    match = _RESPONSE.search(response or "")
    if match is None:
        return {"experience": "", "think": "", "action": ""}
    experience, think, action = (part.strip() for part in match.groups())
    return {"experience": experience, "think": think, "action": action}


def response_format_ok(parsed: dict[str, str]) -> bool:
    """All three parts of a parsed reply hold some text."""
    return all(parsed.get(key, "").strip() for key in ("experience", "think", "action"))


def format_raft_observation(observation: str) -> str:
    """The user message of a turn: ``Observation: <text>``, with a reminder after the game's
    ``Nothing happens.``."""
    text = str(observation)
    if NOTHING_HAPPENS in text:
        text += NOTHING_HAPPENS_HINT
    return "Observation: " + text


def reward_feedback(reward: float, steps: int, done: bool, max_env_steps: int) -> str:
    """How an attempt went, in words (the start of :data:`SECOND_ATTEMPT_GUIDANCE`).

    As in Trinity-RFT, the workflow passes the attempt's *success* as ``done``.
    """
    if done and reward >= 1:
        return (
            f"In your attempt you completed the task in {steps} steps, with a reward of {reward:.3f}. "
            "Keep succeeding, and be more efficient."
        )
    if done:
        return (
            f"In your attempt you finished the task in {steps} steps but got a reward of only "
            f"{reward:.3f}. Improve your play to succeed fully."
        )
    if steps >= max_env_steps:
        return (
            f"In your attempt you used all {max_env_steps} steps without completing the task (reward: "
            f"{reward:.3f}). Be more efficient and focused to finish within the step limit."
        )
    return (
        f"In your attempt you stopped after {steps} steps, with a reward of {reward:.3f}, without "
        "completing the task. Improve your strategy and persist to succeed."
    )


def placeholder_experience(
    reward: float = 0.0, info: dict[str, Any] | None = None, metrics: dict[str, float] | None = None
) -> Experience:
    """An Experience that trains nothing (one prompt token, one masked response token) and
    carries an attempt's ``info`` and ``metrics``: Trinity-RFT's empty experience."""
    import torch

    from trinity.experience import Experience

    return Experience(
        tokens=torch.zeros(2, dtype=torch.long),
        prompt_length=1,
        logprobs=torch.zeros(1, dtype=torch.float32),
        action_mask=torch.zeros(1, dtype=torch.bool),
        reward=float(reward),
        info=dict(info or {}),
        metrics=dict(metrics or {}),
    )


@dataclass
class Attempt:
    """One played game: the conversation, how it ended, and the parsed replies."""

    messages: list[dict[str, Any]]
    reward: float
    done: bool  #: the game ended it (not the turn limit, a length or time limit, or repeating)
    steps: int  #: model calls
    parsed: list[dict[str, str]] = field(default_factory=list)
    repeated: bool = False  #: ended by the same action three times in a row

    @property
    def success(self) -> bool:
        return self.done and self.reward >= 1

    @property
    def format_ok(self) -> bool:
        """Every reply had all three parts."""
        return all(response_format_ok(p) for p in self.parsed)


class RAFTAlfworldWorkflow(AlfworldWorkflow):
    """``RAFT_alfworld_workflow``: one attempt per run; a won attempt in the three-block format
    is the Experience, anything else a placeholder (see the module docstring).

    ``workflow_args``: ``max_env_steps`` (default 50, alias ``max_turns``),
    ``show_admissible_commands``, ``turn_timeout``, ``max_model_len`` as for
    :class:`~trinity_agents.alfworld.AlfworldWorkflow` (``step_wise`` does not apply: RAFT data is
    one conversation).
    """

    default_max_turns: ClassVar[int] = 50

    def reset(self, task: Task) -> None:
        super().reset(task)
        if self.step_wise:
            raise ValueError(
                f"{type(self).__name__}: workflow_args.step_wise does not apply (RAFT keeps whole "
                "conversations); leave it out"
            )
        self._check_repeats = True
        self._actions: list[str] = []
        self._parsed: list[dict[str, str]] = []
        self._prefix: list[dict[str, Any]] | None = None  # set for a second attempt
        self._shown: Any = None  # the observation of the current turn

    # -- protocol --------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return self.task.format_args.system_prompt or RAFT_SYSTEM_PROMPT

    def initial_messages(self) -> list[dict[str, Any]]:
        if self._prefix is not None:
            return [dict(m) for m in self._prefix]
        return super().initial_messages()

    def format_observation(self, observation: Any, turn: int) -> str:
        commands = tuple(getattr(observation, "admissible_commands", ()))
        self._admissible = commands
        self._shown = observation
        text = format_raft_observation(str(observation))
        if self.show_admissible_commands and commands:
            text += "\nAdmissible commands: " + ", ".join(commands)
        return text

    def step_env(self, response_text: str) -> StepResult:
        parsed = parse_response(response_text)
        self._parsed.append(parsed)
        action = parsed["action"]
        before = self._admissible
        valid = bool(action) and (action in before if before else True)
        if self._check_repeats:
            self._actions.append(action)
            recent = self._actions[-REPEAT_LIMIT:]
            if len(recent) == REPEAT_LIMIT and len(set(recent)) == 1:
                # Trinity-RFT ends the attempt here, unsuccessfully, without playing the action.
                info = {"action": action, "action_valid": valid, "repeated": True}
                return StepResult(self._shown, 0.0, True, info)
        text, score, done, infos = self.env.step(action)
        observation = _observation(text, infos)
        if not before:
            valid = bool(action) and NOTHING_HAPPENS not in str(text)
        info = {"action": action, "action_valid": valid, "won": observation.won}
        # The attempt's reward is the last score the game gave (1 once won), ended or not.
        return StepResult(observation, float(score), bool(done), info)

    # -- attempts --------------------------------------------------------------------------

    async def play_attempt(
        self, prefix: list[dict[str, Any]] | None = None, check_repeats: bool = True
    ) -> Attempt:
        """Play one game. With ``prefix`` the model sees it before the game's first observation,
        and the returned conversation starts with the plain system prompt instead."""
        self._prefix, self._check_repeats = prefix, check_repeats
        self._actions, self._parsed = [], []
        try:
            episode = await self.play_episode()
        finally:
            self._prefix = None
        return self._attempt(episode, prefix)

    def _attempt(self, episode: Episode, prefix: list[dict[str, Any]] | None) -> Attempt:
        messages = episode.messages
        if prefix is not None:
            messages = [*super().initial_messages(), *messages[len(prefix) :]]
        last = episode.turns[-1] if episode.turns else None
        repeated = bool(last is not None and last.info.get("repeated"))
        return Attempt(
            messages=messages,
            reward=0.0 if last is None or repeated else float(last.reward),
            done=episode.done and not repeated,
            steps=len(episode.turns),
            parsed=list(self._parsed),
            repeated=repeated,
        )

    async def run_async(self) -> list[Experience]:
        try:
            if self.task.is_eval:
                return [self.eval_experience(await self.play_attempt())]
            return await self.train_experiences()
        finally:
            self._drop_history()

    def eval_experience(self, attempt: Attempt) -> Experience:
        """A placeholder with the attempt's ``success``, ``reward``, ``steps`` and ``accuracy``."""
        info = {"success": attempt.success, "reward": attempt.reward, "steps": attempt.steps}
        metrics = {k: float(v) for k, v in info.items()}
        metrics["accuracy"] = float(attempt.success)
        return self._numbered(placeholder_experience(attempt.reward, info, metrics))

    async def train_experiences(self) -> list[Experience]:
        """One attempt: the Experience when it won in the format, else a placeholder."""
        first = await self.play_attempt()
        kept = first.reward >= 1 and first.format_ok
        return [await self._result(first, kept, self._first_info(first))]

    # -- experiences -----------------------------------------------------------------------

    @staticmethod
    def _first_info(attempt: Attempt) -> dict[str, Any]:
        return {
            "success": attempt.success,
            "reward": attempt.reward,
            "steps": attempt.steps,
            "format_valid": attempt.format_ok,
            "repeated_actions": attempt.repeated,
        }

    async def _result(self, attempt: Attempt, kept: bool, info: dict[str, Any]) -> Experience:
        """The attempt's conversation as an Experience when ``kept``, else a placeholder; both
        with ``info``, its numbers as metrics, ``raft_kept`` and the game file."""
        info = {**info, "raft_kept": kept, "game_file": self.game_file}
        metrics = {k: float(v) for k, v in info.items() if isinstance(v, (int, float))}
        if not kept:
            return self._numbered(placeholder_experience(0.0, info, metrics))
        exp = await self._convert(attempt.messages)
        exp.reward = float(attempt.reward)
        exp.info = {**(exp.info or {}), **info}
        exp.metrics = {**(exp.metrics or {}), **metrics}
        return self._numbered(exp)

    def _numbered(self, exp: Experience) -> Experience:
        exp.eid.run = self.run_id_base
        exp.eid.step = 0
        return exp


class RAFTReflectAlfworldWorkflow(RAFTAlfworldWorkflow):
    """``RAFT_reflect_alfworld_workflow``: a lost first attempt is followed by a second one that
    sees the first and :data:`SECOND_ATTEMPT_GUIDANCE`; the second's clean conversation is kept
    when it is in the format and did better (see the module docstring).

    ``workflow_args``, besides :class:`RAFTAlfworldWorkflow`'s: ``record_dir`` (default none):
    a folder where each task's two attempts are written as JSON, into ``sft_data/`` when kept,
    else ``non_sft_data/`` (Trinity-RFT always writes them, to ``RAFT_reflect_alfworld_data/``).
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        record_dir = self.workflow_args.get("record_dir")
        if record_dir is not None and not isinstance(record_dir, str):
            raise ValueError(f"workflow_args.record_dir must be a folder path or null, got {record_dir!r}")
        self.record_dir = record_dir or None

    async def train_experiences(self) -> list[Experience]:
        first = await self.play_attempt()
        if first.reward >= 1:
            # Won: kept in the format; otherwise dropped without a second attempt.
            return [await self._result(first, first.format_ok, self._first_info(first))]
        feedback = reward_feedback(first.reward, first.steps, first.success, self.max_turns)
        guidance = {"role": "system", "content": SECOND_ATTEMPT_GUIDANCE.format(reward_feedback=feedback)}
        try:
            second = await self.play_attempt([*first.messages, guidance], check_repeats=False)
        except Exception as exc:
            # As Trinity-RFT: the first attempt still counts; the failure is logged and counted.
            logger.warning("%s: second attempt on %s failed: %s", type(self).__name__, self.game_file, exc)
            info = {**self._first_info(first), "second_attempt_failed": True, "error": str(exc)}
            return [await self._result(first, False, info)]
        reward_improved = second.reward > first.reward
        fewer_steps = second.steps < first.steps
        kept = second.format_ok and (reward_improved or (fewer_steps and second.reward >= 1))
        info = {
            "reward": first.reward,
            "steps": first.steps,
            "trajectory_length": second.steps,
            "second_reward": second.reward,
            "second_steps": second.steps,
            "improvement": reward_improved,
            "success": first.success,
            "second_success": second.reward >= 1,
            "format_valid": second.format_ok,
            "second_attempt_failed": False,
        }
        if self.record_dir:
            self._record(first, second, kept)
        return [await self._result(second, kept, info)]

    def _record(self, first: Attempt, second: Attempt, kept: bool) -> None:
        """Write both attempts of this task as JSON under ``record_dir``."""
        folder = os.path.join(self.record_dir, "sft_data" if kept else "non_sft_data")
        os.makedirs(folder, exist_ok=True)
        task_id = f"{time.strftime('%Y%m%d_%H%M%S')}_{time.time_ns() % 10**9:09d}_{os.getpid()}"
        record = {
            "task_id": task_id,
            "game_file": self.game_file,
            "first_exploration": {
                "trajectory": first.messages,
                "reward": first.reward,
                "steps": first.steps,
                "success": first.success,
            },
            "second_exploration": {
                "trajectory": second.messages,
                "reward": second.reward,
                "steps": second.steps,
                "success": second.reward >= 1,
            },
            "training_data": second.messages,
            "kept_for_sft": kept,
        }
        with open(os.path.join(folder, f"{task_id}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, ensure_ascii=False, indent=2)


__all__ = [
    "NOTHING_HAPPENS_HINT",
    "RAFT_SYSTEM_PROMPT",
    "REPEAT_LIMIT",
    "SECOND_ATTEMPT_GUIDANCE",
    "Attempt",
    "RAFTAlfworldWorkflow",
    "RAFTReflectAlfworldWorkflow",
    "format_raft_observation",
    "parse_response",
    "placeholder_experience",
    "response_format_ok",
    "reward_feedback",
]
