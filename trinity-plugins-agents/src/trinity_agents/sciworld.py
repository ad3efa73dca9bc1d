"""``sciworld_workflow``: ScienceWorld's text-based science experiments (Trinity-RFT's name).

ScienceWorld (Wang et al., 2022) is a simulator written in Scala: the PyPI package ``scienceworld``
(optional extra ``sciworld``: ``pip install './trinity-plugins-agents[sciworld]'``, about 7 MB with
the simulator's jar) starts it in a Java VM (a Java runtime, e.g. Debian's
``default-jre-headless``, must be on ``PATH``) and talks to it through py4j.
:func:`make_sciworld_env` is the one place that touches the package;
:attr:`SciWorldWorkflow.env_factory` can be swapped for anything with ``ScienceWorldEnv``'s API.

Each task row is Trinity-RFT's (its ``examples/grpo_sciworld/get_sciworld_data.py``; here
:func:`write_sciworld_data`, ``python -m trinity_agents.tasks sciworld OUT_DIR``): the column
``format.prompt_key`` (``task_desc`` in Trinity-RFT's config) holds a JSON text
``{"task_name": ..., "var_num": ..., "jar_path": ...}``; a JSON object is read too, and a missing
or empty ``jar_path`` means the jar shipped in the ``scienceworld`` package.

The episode is Trinity-RFT's: the task and variation are loaded with the ``easy`` simplifications
(teleporting, open doors and containers, self-watering pots, no electrical actions) and an
environment step limit of 100, the gold path generated (its length is logged as
``golden_rounds``); the first user message is ``Observation: \\n`` followed by ``Task
Description: <the task>`` and the room the game starts in; each later one is ``Observation: \\n``
and the simulator's answer. The text of the first ``<action>`` block of each reply (up to
``</action>`` or the end of the reply; ``""`` when there is none) is sent to the simulator as it
is: a reply without one is not an error, the simulator answers "No known action matches that
input." and the turn counts in ``malformed_actions`` (and ``invalid_actions``, which also counts
actions the simulator did not recognise). The episode ends when the simulator says so (task
completed, failed: a negative score, or past its step limit) or after ``max_env_steps`` turns.

The reward is Trinity-RFT's: the highest running sum of the simulator's step rewards (score
deltas, 0-100) over the episode, divided by 100, and never below 0. As there, what the reset's
``look around`` already scored is not counted: in the ``find-*`` tasks a solved game (score 100)
earns 0.92. ``success`` (the simulator's score reached 100) and ``score`` (the score at the end)
are logged beside it.

``workflow_args`` (besides :class:`~trinity_agents.multi_turn.MultiTurnWorkflow`'s ``step_wise``,
``turn_timeout``, ``max_model_len``): ``max_env_steps`` (alias ``max_turns``), the most turns per
episode, default 30 (Trinity-RFT's fixed number).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trinity_agents.alfworld import parse_action
from trinity_agents.multi_turn import Episode, MultiTurnWorkflow, StepResult

if TYPE_CHECKING:
    from trinity.workflow import Task

SYSTEM_PROMPT = """You are an agent carrying out a science experiment in a text-based virtual world.

## How to answer
At every step, first think, then act to carry out the task you were given. Always put your thinking inside <think> </think> and your action inside <action> </action>.
Take exactly one action per step.
Never address the user: complete the task on your own.

## Commands
These are the commands you can use (OBJ: an object, LOC: a location):
    open OBJ: open a container
    close OBJ: close a container
    activate OBJ: turn a device on
    deactivate OBJ: turn a device off
    connect OBJ to OBJ: connect electrical components
    disconnect OBJ: disconnect electrical components
    use OBJ [on OBJ]: use a device or an item
    look around: describe the room you are in
    examine OBJ: describe an object in detail
    look at OBJ: describe what a container holds
    read OBJ: read a note or a book
    move OBJ to OBJ: put an object in a container
    pick up OBJ: put an object in your inventory
    pour OBJ into OBJ: pour a liquid into a container
    mix OBJ: mix the contents of a container chemically
    teleport to LOC: go straight to a room
    focus on OBJ: say which object the task is about
    wait: do nothing for 10 steps
    wait1: do nothing for one step

A reply looks like this:
<think> First I should look in the bedroom ... </think><action>teleport to bedroom</action>"""

#: The simulator's answer to an input it cannot parse (a reply without ``<action>`` gets it).
UNKNOWN_ACTION = "No known action matches that input."
#: Trinity-RFT's simulator settings: all of ScienceWorld's simplifications, 100 steps at most.
SIMPLIFICATIONS = "easy"
ENV_STEP_LIMIT = 100
#: The 17 tasks of Trinity-RFT's training split (its get_sciworld_data.py); the others are its test split.
TRAIN_TASK_NAMES = (
    "boil",
    "melt",
    "change-the-state-of-matter-of",
    "use-thermometer",
    "measure-melting-point-known-substance",
    "power-component",
    "test-conductivity",
    "find-living-thing",
    "find-plant",
    "grow-plant",
    "chemistry-mix",
    "chemistry-mix-paint-secondary-color",
    "lifespan-shortest-lived",
    "identify-life-stages-2",
    "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces",
    "mendelian-genetics-known-plant",
)


def missing_packages() -> str:
    """The one-line error when the ``scienceworld`` package is not installed: how to install it."""
    from trinity.plugins import install_hint

    return (
        "sciworld_workflow needs the `scienceworld` package (ScienceWorld's simulator), which is not "
        f"installed: {install_hint('trinity-plugins-agents', extra='sciworld')}; it runs on Java "
        "(e.g. `apt-get install default-jre-headless`)"
    )


def format_observation(observation: str) -> str:
    """The user message of a turn (Trinity-RFT's): ``Observation: \\n<text>``."""
    return "Observation: \n" + str(observation)


# -- task rows -------------------------------------------------------------------------------


def task_config_of(row: dict[str, Any], prompt_key: str | None) -> dict[str, Any]:
    """The row's task: ``{"task_name", "var_num", "jar_path"}`` from the JSON text (or object)
    under ``prompt_key`` (else ``task_desc``). ``ValueError`` with one line when it is not one."""
    key = prompt_key if prompt_key and prompt_key in row else "task_desc"
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"sciworld row's {key!r} is not JSON text: {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"sciworld row has no task under {key!r} (a JSON object with task_name, var_num and "
            f"jar_path; row keys: {', '.join(sorted(map(str, row))) or 'none'})"
        )
    name, var = value.get("task_name"), value.get("var_num")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"sciworld task {value!r} has no task_name")
    if isinstance(var, bool) or not isinstance(var, int) or var < 0:
        raise ValueError(f"sciworld task {value!r}: var_num must be an integer >= 0")
    jar = value.get("jar_path") or None
    if jar is not None and not isinstance(jar, str):
        raise ValueError(f"sciworld task {value!r}: jar_path must be a path")
    return {"task_name": name, "var_num": var, "jar_path": jar}


# -- the simulator ---------------------------------------------------------------------------


def make_sciworld_env(jar_path: str | None = None, env_step_limit: int = ENV_STEP_LIMIT) -> Any:
    """A started ScienceWorld simulator (``scienceworld.ScienceWorldEnv``, its own Java VM)
    running ``jar_path`` (default: the jar of the installed package), no task loaded yet.
    Close it with :func:`close_sciworld_env`.

    ``ImportError`` naming the extra when the package is missing; ``FileNotFoundError`` when
    there is no ``java`` or no jar at ``jar_path``.
    """
    try:
        from scienceworld import ScienceWorldEnv
    except ImportError:
        raise ImportError(missing_packages()) from None
    if shutil.which("java") is None:
        raise FileNotFoundError(
            "ScienceWorld's simulator runs on Java and there is no `java` on PATH: install a Java "
            "runtime (e.g. `apt-get install default-jre-headless`)"
        )
    if jar_path is not None and not os.path.isfile(jar_path):
        raise FileNotFoundError(
            f"ScienceWorld jar {jar_path!r} does not exist (leave jar_path out of the task rows to use "
            "the jar of the installed scienceworld package)"
        )
    return ScienceWorldEnv("", jar_path, envStepLimit=env_step_limit)


def close_sciworld_env(env: Any, timeout: float = 10.0) -> None:
    """Close ``env`` and make sure its Java VM has exited (killed after ``timeout`` seconds)."""
    gateway = getattr(env, "_gateway", None)
    process = getattr(gateway, "java_process", None)
    try:
        env.close()
    finally:
        if process is not None:
            try:
                process.wait(timeout)
            except Exception:  # still running (or not waitable): do not leave it behind
                process.kill()
                process.wait(timeout)


def task_variations(env: Any) -> dict[str, int]:
    """Every task of the simulator ``env`` and its number of variations."""
    return {name: int(env.get_max_variations(name)) for name in env.get_task_names()}


def sciworld_rows(
    variations: dict[str, int],
    task_names: Iterable[str],
    jar_path: str | None,
    percentage: float,
    rng: random.Random,
) -> list[dict[str, Any]]:
    """Trinity-RFT's rows for ``task_names``: the first ``int(variations * percentage)``
    variations of each, ``{"task_desc": <JSON task>, "targe": ""}`` (its column names, typo
    included), shuffled with ``rng``."""
    rows = []
    for name in task_names:
        if name not in variations:
            raise ValueError(
                f"ScienceWorld has no task {name!r} (its tasks: {', '.join(sorted(variations))})"
            )
        for var in range(int(variations[name] * percentage)):
            task = {"task_name": name, "var_num": var, "jar_path": jar_path}
            rows.append({"task_desc": json.dumps(task), "targe": ""})
    rng.shuffle(rows)
    return rows


def write_sciworld_data(
    out_dir: str | Path,
    *,
    train_task_names: Iterable[str] = TRAIN_TASK_NAMES,
    test_task_names: Iterable[str] | None = None,
    percentage: float = 0.5,
    jar_path: str | None = None,
    seed: int = 42,
    env: Any = None,
) -> dict[str, int]:
    """Write Trinity-RFT's ScienceWorld taskset to ``out_dir``: ``train.jsonl``, ``test.jsonl``
    and ``dataset_dict.json``, as its ``get_sciworld_data.py`` does, with the tasks and their
    numbers of variations read from the simulator itself (``env``, else one started here).

    ``test_task_names`` defaults to the simulator's tasks not in ``train_task_names``;
    ``jar_path`` (default: the installed package's jar) is written into every row. Returns the
    number of rows per split.
    """
    if not 0 < percentage <= 1:
        raise ValueError(f"percentage must be in (0, 1], got {percentage}")
    if jar_path is None:
        try:
            from scienceworld.constants import JAR_PATH
        except ImportError:
            raise ImportError(missing_packages()) from None
        jar_path = JAR_PATH
    own = env is None
    env = make_sciworld_env(jar_path) if own else env
    try:
        variations = task_variations(env)
    finally:
        if own:
            close_sciworld_env(env)
    train_names = list(train_task_names)
    test_names = (
        [n for n in variations if n not in train_names] if test_task_names is None else list(test_task_names)
    )
    rng = random.Random(seed)
    splits = {
        "train": sciworld_rows(variations, train_names, jar_path, percentage, rng),
        "test": sciworld_rows(variations, test_names, jar_path, percentage, rng),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    info = {
        "citation": "",
        "description": "ScienceWorld tasks (task name and variation), written by trinity_agents.sciworld",
        "splits": {s: {"name": s, "num_examples": len(rows)} for s, rows in splits.items()},
    }
    (out / "dataset_dict.json").write_text(json.dumps(info, indent=2))
    return {s: len(rows) for s, rows in splits.items()}


# -- workflow --------------------------------------------------------------------------------


class SciWorldWorkflow(MultiTurnWorkflow):
    """One ScienceWorld task variation per run, on a simulator of its own (see the module
    docstring); one concatenated Experience per episode unless ``workflow_args.step_wise``."""

    max_turns_keys: ClassVar[tuple[str, ...]] = ("max_env_steps", "max_turns")
    default_max_turns: ClassVar[int] = 30
    #: ``env_factory(jar_path)`` returns a started simulator with ``ScienceWorldEnv``'s API; the
    #: workflow loads the task, plays and closes it (``close_factory``). Tests replace both.
    env_factory: ClassVar[Callable[[str | None], Any]] = staticmethod(make_sciworld_env)
    close_factory: ClassVar[Callable[[Any], None]] = staticmethod(close_sciworld_env)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """A ScienceWorld row holds a task (see :func:`task_config_of`) whose jar, if named, exists."""
        try:
            task = task_config_of(row, getattr(format_args, "prompt_key", None))
        except ValueError as exc:
            return str(exc)
        if task["jar_path"] is not None and not os.path.isfile(task["jar_path"]):
            return f"ScienceWorld jar does not exist: {task['jar_path']} (rewrite the rows on this machine)"
        return None

    def reset(self, task: Task) -> None:
        super().reset(task)
        try:
            self.task_config = task_config_of(task.raw_task or {}, task.format_args.prompt_key)
        except ValueError as exc:
            raise ValueError(f"task {task.index} of taskset {task.taskset_name!r}: {exc}") from None
        self.env: Any = None
        self.golden_rounds = 0
        self.gold_actions: list[str] = []

    # -- environment -----------------------------------------------------------------------

    def _start(self) -> str:
        env = self.env = type(self).env_factory(self.task_config["jar_path"])
        env.load(
            self.task_config["task_name"], self.task_config["var_num"], SIMPLIFICATIONS, generateGoldPath=True
        )
        self.gold_actions = list(env.get_gold_action_sequence())
        self.golden_rounds = len(self.gold_actions)
        observation, _ = env.reset()
        return f"Task Description: {env.get_task_description()}\n{observation}"

    async def reset_env(self) -> str:
        # The simulator answers over a socket (its VM takes about a second to start): in a
        # thread, so that the other episodes on this event loop go on meanwhile.
        return await asyncio.to_thread(self._start)

    async def step_env(self, response_text: str) -> StepResult:
        action = parse_action(response_text)
        text, reward, done, infos = await asyncio.to_thread(self.env.step, action)
        text = str(text)
        info = {
            "action": action,
            "malformed": "<action>" not in (response_text or ""),
            "action_valid": bool(action) and not text.startswith(UNKNOWN_ACTION),
            "score": int((infos or {}).get("score", 0)),
        }
        # Step rewards in the episode reward's unit (the simulator's are 0-100 points).
        return StepResult(text, float(reward) / 100.0, bool(done), info)

    async def close_env(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await asyncio.to_thread(type(self).close_factory, env)

    # -- protocol --------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return self.task.format_args.system_prompt or SYSTEM_PROMPT

    def format_observation(self, observation: Any, turn: int) -> str:
        return format_observation(str(observation))

    def episode_reward(self, episode: Episode) -> float:
        """Trinity-RFT's: the highest running sum of the step rewards, at least 0."""
        running = best = 0.0
        for turn in episode.turns:
            running += turn.reward
            best = max(best, running)
        return best

    def episode_info(self, episode: Episode) -> dict[str, Any]:
        scores = [t.info.get("score", 0) for t in episode.turns]
        return {
            # Trinity-RFT's three: its env_rounds is the index of the last turn (env_steps - 1).
            "env_rounds": len(episode.turns) - 1,
            "golden_rounds": self.golden_rounds,
            "score": scores[-1] if scores else 0,
            "success": bool(scores and max(scores) >= 100),
            "invalid_actions": sum(not t.info.get("action_valid", True) for t in episode.turns),
            "malformed_actions": sum(bool(t.info.get("malformed")) for t in episode.turns),
            "task_name": self.task_config["task_name"],
            "var_num": self.task_config["var_num"],
        }


__all__ = [
    "ENV_STEP_LIMIT",
    "SIMPLIFICATIONS",
    "SYSTEM_PROMPT",
    "TRAIN_TASK_NAMES",
    "UNKNOWN_ACTION",
    "SciWorldWorkflow",
    "close_sciworld_env",
    "format_observation",
    "make_sciworld_env",
    "missing_packages",
    "sciworld_rows",
    "task_config_of",
    "task_variations",
    "write_sciworld_data",
]
