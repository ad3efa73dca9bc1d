"""``frozen_lake_workflow``: FrozenLake (gymnasium's ``FrozenLakeEnv``) played through text.

Each task row names a map by ``seed``, ``size`` and ``p`` (Trinity-RFT's FrozenLake rows:
``{"seed", "size", "p", "index", "uid"}``); :func:`generate_random_map` draws it with gymnasium's
seeded generator: every tile is frozen with probability ``p``, start and goal are random distinct
tiles, and maps are redrawn until the goal can be reached from the start in at most
``env_max_steps`` moves. The same row gives the same map on every machine.

The protocol is Trinity-RFT's: each turn the model sees the grid (``P`` player, ``_`` frozen,
``O`` hole, ``G`` goal, each cell as `` X \\t``), and answers with its reasoning and the next
move in triple backticks, e.g. ```` ```Up``` ```` (``Left``/``Down``/``Right``/``Up``, any case,
or the digits 1-4 in that order). A reply without a valid move leaves the player in place; the next
observation then says the last response was invalid. Reaching the goal gives reward 1 and ends the
episode; a hole ends it with 0.

``workflow_args`` (besides :class:`~trinity_agents.multi_turn.MultiTurnWorkflow`'s ``step_wise``,
``turn_timeout``, ``max_model_len``):

==================  ================================================================
``agent_max_steps`` most turns (model calls) per episode (default 10; alias ``max_turns``)
``env_max_steps``   maps are drawn so that the goal is at most this many moves away (8)
``is_slippery``     gymnasium's slippery ice: a move may go sideways (default false)
``desc``            a fixed map for every task, as rows of ``S``/``F``/``H``/``G``
``compact``         a short protocol for small-context models (default false): no system
                    prompt unless ``format.system_prompt`` sets one, and each observation is
                    the bare grid, one character per cell (``P``, ``_``, ``O``, ``G``), one
                    line per row (:func:`compact_grid`); replies are the same
==================  ================================================================
"""

from __future__ import annotations

import re
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar

from trinity_agents.multi_turn import Episode, MultiTurnWorkflow, StepResult, as_bool, positive_int

if TYPE_CHECKING:
    from trinity.workflow import Task

SYSTEM_PROMPT = """You are an agent walking on a frozen lake, shown as a grid.

Goal: move the player P onto the goal G.

Map symbols:
_ frozen tile | O hole | G goal | P player

Rules:
1. Do not step into a hole (O): the game ends with no reward.
2. Reaching the goal (G) ends the game with reward 1.0.
3. Moving off the edge of the map leaves you where you are.
4. The ice may be slippery: now and then a move goes sideways. Do not worry about it much.

Valid actions: Up | Down | Left | Right

Each turn you see the current map. Think about the shortest safe path, then give only the NEXT action inside triple backticks, for example ```Up```. Reach the goal in as few steps as you can.
Every reply must end with exactly one action: Up, Down, Left or Right inside ``` ```."""

#: gymnasium's FrozenLake actions.
GYM_ACTIONS = {"Left": 0, "Down": 1, "Right": 2, "Up": 3}
#: Trinity-RFT's action digits (1 Left, 2 Down, 3 Right, 4 Up).
_DIGITS = {"1": "Left", "2": "Down", "3": "Right", "4": "Up"}
_NAMES = {name.lower(): name for name in GYM_ACTIONS}
_MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
_FENCED = re.compile(r"```(.*?)```", re.DOTALL)

# Rendered cells: the tile symbol padded as " X \t" (Trinity-RFT's text grid).
PLAYER, FROZEN, HOLE, GOAL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "_", "O", "G", "X", "√"


# -- maps ------------------------------------------------------------------------------------


def shortest_path_length(board: list[str] | list[list[str]]) -> int | None:
    """Fewest moves from ``S`` to ``G`` over non-hole tiles (``None`` when unreachable)."""
    rows = [list(r) for r in board]
    size_r, size_c = len(rows), len(rows[0])
    start = next((r, c) for r in range(size_r) for c in range(size_c) if rows[r][c] == "S")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G":
            return dist[(r, c)]
        for dr, dc in _MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size_r and 0 <= nc < size_c and rows[nr][nc] != "H" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return None


def generate_random_map(
    size: int = 8, p: float = 0.8, seed: int = 0, max_steps: int = 5, max_tries: int = 100_000
) -> tuple[list[str], tuple[int, int]]:
    """A seeded random map whose goal is at most ``max_steps`` moves from the start.

    Draws from ``gymnasium.utils.seeding.np_random(seed)``: the tiles (``F`` with probability
    ``p``, else ``H``), then start and goal cells until they differ; the whole map is redrawn
    until the goal is reachable within ``max_steps``. Returns the rows (``S``/``F``/``H``/``G``)
    and the goal's ``(row, col)``.
    """
    from gymnasium.utils import seeding

    size, p, max_steps = int(size), float(p), int(max_steps)
    if size < 2:
        raise ValueError(f"frozen lake: size must be at least 2 (start and goal differ), got {size}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"frozen lake: p (probability of a frozen tile) must be in (0, 1], got {p}")
    if max_steps < 1:
        raise ValueError(f"frozen lake: max_steps must be at least 1, got {max_steps}")
    rng, _ = seeding.np_random(int(seed))
    for _ in range(max_tries):
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p]).tolist()
        while True:
            start = (int(rng.integers(0, size)), int(rng.integers(0, size)))
            goal = (int(rng.integers(0, size)), int(rng.integers(0, size)))
            if start != goal:
                break
        board[start[0]][start[1]] = "S"
        board[goal[0]][goal[1]] = "G"
        steps = shortest_path_length(board)
        if steps is not None and steps <= max_steps:
            return ["".join(row) for row in board], goal
    raise ValueError(
        f"frozen lake: no map of size {size} with p={p} has its goal within {max_steps} moves "
        f"after {max_tries} draws (seed {seed})"
    )


def check_map(desc: Any) -> list[str]:
    """``desc`` as a list of equal-length rows of ``S``/``F``/``H``/``G`` with one ``S`` and one
    ``G``; ``ValueError`` otherwise."""
    rows = [str(r) for r in desc] if isinstance(desc, (list, tuple)) else None
    ok = (
        rows
        and len({len(r) for r in rows}) == 1
        and rows[0]
        and all(set(r) <= set("SFHG") for r in rows)
        and "".join(rows).count("S") == 1
        and "".join(rows).count("G") == 1
    )
    if not ok:
        raise ValueError(
            "workflow_args.desc must be a list of equal-length rows of S, F, H, G with exactly "
            f"one S and one G, got {desc!r}"
        )
    return rows


# -- text protocol ---------------------------------------------------------------------------


def render(desc: list[str], position: tuple[int, int]) -> str:
    """The text grid: one line per row, each cell `` X \\t``; the start tile shows as frozen."""
    lines = []
    for r, row in enumerate(desc):
        cells = []
        for c, tile in enumerate(row):
            if (r, c) == tuple(position):
                symbol = {"H": PLAYER_IN_HOLE, "G": PLAYER_ON_GOAL}.get(tile, PLAYER)
            else:
                symbol = {"H": HOLE, "G": GOAL}.get(tile, FROZEN)
            cells.append(f" {symbol} \t")
        lines.append("".join(cells))
    return "\n".join(lines)


def parse_grid(text: str) -> list[list[str]]:
    """The symbols of the rendered grid in ``text`` (a grid, or a user message holding one), row
    by row: the lines with tab-separated cells (inverse of :func:`render`)."""
    return [
        [cell.strip() for cell in line.split("\t") if cell.strip()]
        for line in text.split("\n")
        if "\t" in line
    ]


def parse_action(response: str) -> str | None:
    """The move in the last triple-backtick block of ``response``: ``"Left"``, ``"Down"``,
    ``"Right"`` or ``"Up"`` (names in any case, or digits 1-4 in that order); ``None`` if there
    is no block or it holds anything else."""
    blocks = _FENCED.findall(response or "")
    if not blocks:
        return None
    text = blocks[-1].strip()
    return _NAMES.get(text.lower()) or _DIGITS.get(text)


def oracle_action(observation: str) -> str | None:
    """The first move of a shortest hole-free path from ``P`` to ``G`` in a rendered grid
    (``None`` when there is none): a perfect player on non-slippery ice."""
    grid = parse_grid(observation)
    start = next(((r, c) for r, row in enumerate(grid) for c, s in enumerate(row) if s == PLAYER), None)
    if start is None:
        return None
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == GOAL:
            return first[(r, c)]
        for name, (dr, dc) in _MOVES.items():
            nr, nc = r + dr, c + dc
            if (
                0 <= nr < len(grid)
                and 0 <= nc < len(grid[nr])
                and grid[nr][nc] != HOLE
                and (nr, nc) not in first
            ):
                first[(nr, nc)] = first[(r, c)] or name
                queue.append((nr, nc))
    return None


def compact_grid(grid: str) -> str:
    """The rendered grid in ``grid`` with one character per cell and no padding (the
    observation of ``workflow_args.compact``): ``"_P\nOG"``."""
    return "\n".join("".join(row) for row in parse_grid(grid))


def format_observation(grid: str, turn: int, remaining: int, last_invalid: bool) -> str:
    """The user message of a turn."""
    text = (
        f"Current Observation ({turn}): \n{grid}\n"
        "You have not reached the goal yet: P is not on G. Give your next action."
    )
    if last_invalid:
        text += (
            "\nYour last response was invalid: your position did not change. Check your reasoning, "
            "the action and the format of your reply: give only the NEXT action inside ``` ```, "
            "for example ```Up```."
        )
    return text + f"\nThe maximum number of steps remaining is {remaining}."


# -- workflow --------------------------------------------------------------------------------


class FrozenLakeWorkflow(MultiTurnWorkflow):
    """FrozenLake episodes (see the module docstring for task columns and ``workflow_args``)."""

    max_turns_keys: ClassVar[tuple[str, ...]] = ("max_turns", "agent_max_steps")
    default_max_turns: ClassVar[int] = 10

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """FrozenLake rows have no prompt column: ``seed``, ``size`` and ``p`` must be numbers
        (each optional: 42, 4, 0.8), with ``size`` at least 2 and ``p`` in (0, 1]."""
        try:
            size, p = int(row.get("size", 4)), float(row.get("p", 0.8))
            int(row.get("seed", 42))
        except (TypeError, ValueError):
            return f"frozen lake row: seed, size and p must be numbers, got { {k: row.get(k) for k in ('seed', 'size', 'p')} }"
        if size < 2:
            return f"frozen lake row: size must be at least 2 (start and goal differ), got {size}"
        if not 0 < p <= 1:
            return f"frozen lake row: p must be in (0, 1], got {p}"
        return None

    def reset(self, task: Task) -> None:
        super().reset(task)
        args = self.workflow_args
        self.env_max_steps = positive_int(args.get("env_max_steps", 8), "env_max_steps")
        self.is_slippery = as_bool(args.get("is_slippery", False), "is_slippery")
        self.compact = as_bool(args.get("compact", False), "compact")
        raw = task.raw_task or {}
        try:
            self.seed = int(raw.get("seed", 42))
            self.size = int(raw.get("size", 4))
            self.p = float(raw.get("p", 0.8))
        except (TypeError, ValueError):
            raise ValueError(
                f"frozen lake task {task.index}: seed, size and p must be numbers, got "
                f"{ {k: raw.get(k) for k in ('seed', 'size', 'p')} }"
            ) from None
        if args.get("desc") is not None:
            self.desc = check_map(args["desc"])
        else:
            self.desc, _ = generate_random_map(self.size, self.p, self.seed, self.env_max_steps)
        self.env: Any = None
        self._previous: str | None = None  # the last observation shown (to flag invalid moves)

    # -- environment -----------------------------------------------------------------------

    def reset_env(self) -> str:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        self.env = FrozenLakeEnv(desc=list(self.desc), is_slippery=self.is_slippery)
        # One stream per (task, run): slippery moves differ between a task's rollouts.
        self.env.reset(seed=self.seed + self.run_id_base)
        self._previous = None
        return self.render()

    def position(self) -> tuple[int, int]:
        return divmod(int(self.env.s), int(self.env.ncol))

    def render(self) -> str:
        return render(self.desc, self.position())

    def step_env(self, response_text: str) -> StepResult:
        action = parse_action(response_text)
        if action is None:
            return StepResult(self.render(), 0.0, False, {"action_valid": False, "action_effective": False})
        before = int(self.env.s)
        state, reward, terminated, _truncated, _ = self.env.step(GYM_ACTIONS[action])
        info = {"action_valid": True, "action": action, "action_effective": int(state) != before}
        return StepResult(self.render(), float(reward), bool(terminated), info)

    def close_env(self) -> None:
        self.env = None

    # -- protocol --------------------------------------------------------------------------

    def system_prompt(self) -> str | None:
        if self.compact:
            return self.task.format_args.system_prompt or None
        return self.task.format_args.system_prompt or SYSTEM_PROMPT

    def format_observation(self, observation: Any, turn: int) -> str:
        last_invalid = turn > 0 and observation == self._previous
        self._previous = observation
        if self.compact:
            return compact_grid(str(observation))
        return format_observation(str(observation), turn, self.max_turns - turn, last_invalid)

    def episode_info(self, episode: Episode) -> dict[str, Any]:
        return {
            "success": PLAYER_ON_GOAL in str(episode.observation),
            "test_score": float(sum(episode.step_rewards)),
            "invalid_actions": sum(not t.info.get("action_valid", True) for t in episode.turns),
            "seed": self.seed,
            "map_size": len(self.desc),
        }


__all__ = [
    "GYM_ACTIONS",
    "SYSTEM_PROMPT",
    "FrozenLakeWorkflow",
    "check_map",
    "compact_grid",
    "format_observation",
    "generate_random_map",
    "oracle_action",
    "parse_action",
    "parse_grid",
    "render",
    "shortest_path_length",
]
