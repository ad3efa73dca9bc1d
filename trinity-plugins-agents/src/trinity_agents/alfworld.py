"""``alfworld_workflow`` and ``step_wise_alfworld_workflow``: ALFWorld's household text games.

Each task row names one ALFWorld game, a ``game.tw-pddl`` file from ALFWorld's data (Trinity-RFT's
rows, written by its ``examples/grpo_alfworld/get_alfworld_data.py``: ``{"game_file": PATH,
"target": ""}``; the path is read under ``format.prompt_key``, else the ``game_file`` column).
The game is played with TextWorld's PDDL engine and ALFWorld's name demangler (optional extra
``alfworld``: ``pip install './trinity-plugins-agents[alfworld]'``, then ``alfworld-download`` for the
games); :func:`make_alfworld_env` is the one place that touches those packages, and
:attr:`AlfworldWorkflow.env_factory` can be swapped for any environment with TextWorld's gym API
(``reset() -> (observation, infos)``, ``step(command) -> (observation, score, done, infos)``).

The protocol is Trinity-RFT's: the system prompt lists ALFWorld's commands and asks for the
reasoning inside ``<think></think>`` and one command inside ``<action></action>``; each turn shows
``Observation: <text>`` (with a reminder of the format after the game's ``Nothing happens.``). The
text of the first ``<action>`` block (up to ``</action>`` or the end of the reply) is sent to the
game as it is. A won game ends the episode with reward 1; an episode that the game did not end
scores -0.1.

``workflow_args`` (besides :class:`~trinity_agents.multi_turn.MultiTurnWorkflow`'s ``step_wise``,
``turn_timeout``, ``max_model_len``):

============================  ===================================================================
``max_env_steps``             most turns (model calls) per episode (default 30; alias ``max_turns``)
``show_admissible_commands``  also list the game's admissible commands each turn (default false,
                              as in Trinity-RFT, which requests but does not show them)
============================  ===================================================================
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from trinity_agents.multi_turn import Episode, MultiTurnWorkflow, StepResult, as_bool

if TYPE_CHECKING:
    from trinity.workflow import Task

#: ALFWorld's commands as the system prompts list them (this one and RAFT's).
COMMANDS = """  look:                             look around where you are
  inventory:                        list what you carry (you can hold only 1 object)
  go to (receptacle):               walk to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  pick an object up from a receptacle
  move (object) to (receptacle):    put an object in or on a receptacle
  examine (something):              look closely at a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object with a receptacle
  clean (object) with (receptacle): clean an object with a receptacle
  cool (object) with (receptacle):  cool an object with a receptacle
  slice (object) with (object):     slice an object with a sharp object"""

SYSTEM_PROMPT = (
    """You are an agent acting in a text-based household environment.

## How to answer
At every step, first think, then act to carry out the task you were given. Always put your thinking inside <think> </think> and your action inside <action> </action>.
Take exactly one action per step.
Never address the user: complete the task on your own.

## Commands
These are the commands you can use:
"""
    + COMMANDS
    + """

A reply looks like this:
<think> To do the task, I first need to ... </think><action>go to cabinet 1</action>"""
)

#: The game's answer to a command it cannot carry out.
NOTHING_HAPPENS = "Nothing happens."
#: The reward of an episode the game did not end (Trinity-RFT's).
UNFINISHED_REWARD = -0.1


def missing_packages() -> str:
    """The one-line error when ALFWorld's packages are not installed: how to install them."""
    from trinity.plugins import install_hint

    return (
        "ALFWorld workflows need the `alfworld` and `textworld` packages, which are not installed: "
        f"{install_hint('trinity-plugins-agents', extra='alfworld')}, then download the games with "
        "`alfworld-download` (into $ALFWORLD_DATA, default ~/.cache/alfworld) and point the taskset's "
        "`game_file` rows at them"
    )


# -- text protocol ---------------------------------------------------------------------------


def parse_action(response: str) -> str:
    """The command in ``response``: the text after the first ``<action>``, up to the next
    ``</action>`` (or the end of the reply), stripped; ``""`` when there is no ``<action>``."""
    text = response or ""
    start = text.find("<action>")
    if start < 0:
        return ""
    rest = text[start + len("<action>") :]
    end = rest.find("</action>")
    return (rest if end < 0 else rest[:end]).strip()


def format_observation(observation: str, admissible_commands: list[str] | None = None) -> str:
    """The user message of a turn: ``Observation: <text>``, a reminder after ``Nothing
    happens.``, and the admissible commands when given."""
    text = f"Observation: {observation}"
    if NOTHING_HAPPENS in observation:
        text += (
            " That action had no effect: check that it is a valid command here and that your reply "
            "follows the format, <think>...</think><action>...</action>."
        )
    if admissible_commands:
        text += "\nAdmissible commands: " + ", ".join(admissible_commands)
    return text


@dataclass(frozen=True)
class AlfworldObservation:
    """What the game shows at one point: its text, plus what identifies the state."""

    text: str
    admissible_commands: tuple[str, ...] = ()
    inventory: str = ""
    won: bool = False

    def __str__(self) -> str:
        return self.text


def _observation(text: Any, infos: Any) -> AlfworldObservation:
    infos = infos if isinstance(infos, dict) else {}
    commands = infos.get("admissible_commands") or ()
    return AlfworldObservation(
        text=str(text),
        admissible_commands=tuple(str(c) for c in commands),
        inventory=str(infos.get("inventory") or ""),
        won=bool(infos.get("won", False)),
    )


# -- environment -----------------------------------------------------------------------------


def make_alfworld_env(game_file: str) -> Any:
    """A TextWorld gym environment playing ALFWorld game ``game_file`` (a ``game.tw-pddl``),
    with ALFWorld's name demangler (``cabinet 1`` rather than the game's internal ids), the
    admissible commands, inventory, room description and ``won`` in its ``infos``, and no step
    limit of its own (the workflow's ``max_env_steps`` is the limit).

    ``ImportError`` with one line naming the extra when the packages are missing;
    ``FileNotFoundError`` when the game file is not there.
    """
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.gym.envs import TextworldGymEnv
    except ImportError:
        raise ImportError(missing_packages()) from None
    if not os.path.isfile(game_file):
        raise FileNotFoundError(
            f"ALFWorld game file {game_file!r} does not exist (download the games with "
            "`alfworld-download`, then write the taskset rows from $ALFWORLD_DATA)"
        )
    infos = textworld.EnvInfos(description=True, inventory=True, admissible_commands=True, won=True)
    return TextworldGymEnv([game_file], infos, max_episode_steps=None, wrappers=[AlfredDemangler])


def game_file_of(row: dict[str, Any], prompt_key: str | None) -> Any:
    """The row's game file: the column ``prompt_key`` when the row has it, else ``game_file``."""
    if prompt_key and prompt_key in row:
        return row[prompt_key]
    return row.get("game_file")


# -- workflow --------------------------------------------------------------------------------


class AlfworldWorkflow(MultiTurnWorkflow):
    """One ALFWorld game per run (see the module docstring); one concatenated Experience per
    episode unless ``workflow_args.step_wise`` is true."""

    max_turns_keys: ClassVar[tuple[str, ...]] = ("max_env_steps", "max_turns")
    default_max_turns: ClassVar[int] = 30
    #: ``env_factory(game_file)`` returns the game's environment (TextWorld's gym API); tests
    #: and other backends replace it.
    env_factory: ClassVar[Callable[[str], Any]] = staticmethod(make_alfworld_env)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """An ALFWorld row names an existing game file (under ``format.prompt_key``, else
        ``game_file``)."""
        prompt_key = getattr(format_args, "prompt_key", None)
        path = game_file_of(row, prompt_key)
        if not isinstance(path, str) or not path.strip():
            return (
                f"alfworld row has no game file under {prompt_key!r} or 'game_file' "
                f"(row keys: {', '.join(sorted(map(str, row))) or 'none'})"
            )
        if not os.path.isfile(path):
            return f"alfworld game file does not exist: {path} (download the games with alfworld-download)"
        return None

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.show_admissible_commands = as_bool(
            self.workflow_args.get("show_admissible_commands", False), "show_admissible_commands"
        )
        raw = task.raw_task or {}
        path = game_file_of(raw, task.format_args.prompt_key)
        if not isinstance(path, str) or not path.strip():
            raise ValueError(
                f"alfworld task {task.index} of taskset {task.taskset_name!r} has no game file under "
                f"{task.format_args.prompt_key!r} or 'game_file' (row keys: {sorted(raw)})"
            )
        self.game_file = path
        self.env: Any = None
        self._admissible: tuple[str, ...] = ()  # the commands of the state shown last

    async def run_async(self) -> list[Any]:
        try:
            return await super().run_async()
        finally:
            self._drop_history()

    def _drop_history(self) -> None:
        """Trinity-RFT's step-wise config turns on ``explorer.rollout_model.enable_history`` (its
        workflow collected the calls from there). This one keeps its calls itself, so it empties
        the runner's history after each episode instead of letting it grow for the whole job."""
        if getattr(self.model, "enable_history", False) is True:
            extract = getattr(self.model, "extract_experience_from_history", None)
            if callable(extract):
                extract()

    # -- environment -----------------------------------------------------------------------

    def reset_env(self) -> AlfworldObservation:
        self.env = type(self).env_factory(self.game_file)
        text, infos = self.env.reset()
        return _observation(text, infos)

    def step_env(self, response_text: str) -> StepResult:
        action = parse_action(response_text)
        before = self._admissible
        text, score, done, infos = self.env.step(action)
        observation = _observation(text, infos)
        valid = bool(action) and (action in before if before else NOTHING_HAPPENS not in str(text))
        info = {"action": action, "action_valid": valid, "won": observation.won}
        # TextWorld's score is the game's running total: 1 once won. It counts when the game ends.
        return StepResult(observation, float(score) if done else 0.0, bool(done), info)

    def close_env(self) -> None:
        if self.env is not None:
            close = getattr(self.env, "close", None)
            self.env = None
            if callable(close):
                close()

    # -- protocol --------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return self.task.format_args.system_prompt or SYSTEM_PROMPT

    def format_observation(self, observation: Any, turn: int) -> str:
        commands = getattr(observation, "admissible_commands", ())
        self._admissible = tuple(commands)
        return format_observation(str(observation), list(commands) if self.show_admissible_commands else None)

    def state_hash(self, observation: Any) -> str:
        """The game state the model acts on: what it shows, what it carries and what it may do
        (``Nothing happens.`` alone names no state)."""
        parts = [
            str(observation),
            getattr(observation, "inventory", ""),
            *getattr(observation, "admissible_commands", ()),
        ]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]

    def episode_reward(self, episode: Episode) -> float:
        """The game's score when it ended the episode (1 when won), else -0.1."""
        if not episode.done:
            return UNFINISHED_REWARD
        return float(episode.turns[-1].reward)

    def episode_info(self, episode: Episode) -> dict[str, Any]:
        return {
            "won": bool(getattr(episode.observation, "won", False)),
            "invalid_actions": sum(not t.info.get("action_valid", True) for t in episode.turns),
            "game_file": self.game_file,
        }


class StepWiseAlfworldWorkflow(AlfworldWorkflow):
    """:class:`AlfworldWorkflow` with ``step_wise`` on by default: one Experience per model
    call, the episode's reward on each (for ``algorithm_type: multi_step_grpo``, ``gigpo``)."""

    default_step_wise: ClassVar[bool] = True


__all__ = [
    "NOTHING_HAPPENS",
    "SYSTEM_PROMPT",
    "UNFINISHED_REWARD",
    "AlfworldObservation",
    "AlfworldWorkflow",
    "StepWiseAlfworldWorkflow",
    "format_observation",
    "game_file_of",
    "make_alfworld_env",
    "missing_packages",
    "parse_action",
]
