"""A CPU agent example: a tiny model learns to walk FrozenLake, turn by turn, with SFT then RL.

    python examples/agents/run.py [--work-dir ./agents-run] [--config frozen_lake.yaml]

1. generates FrozenLake tasks (train maps, and held-out test maps that no train task shares), a
   warm-up corpus of whole episodes played by a scripted shortest-path walker, and a fresh,
   randomly initialised tiny character-level model into the work folder; nothing is downloaded;
2. runs ``trinity run --config examples/agents/frozen_lake.yaml``: stage ``sft_warmup`` (a
   short supervised warm-up on those episodes, every move trained, that leaves the model far
   from the walker) then stage ``rl`` (step-wise multi-turn GiGPO on a small fixed set of
   PRACTICE_MAPS other train maps, each played about 10 times over the stage), evaluated
   greedily before the first step and every 10 steps on exactly those maps ("practice") and on
   the held-out maps ("heldout", generalisation);
3. reads the eval success rates from the run's tensorboard files and prints both before and
   after RL, with their curves and the wall time.

The work folder is recreated on every run (it must be empty or an earlier run's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARKER = ".trinity-agents-example"  # marks a work folder this script made, so it may recreate it

# FrozenLake maps of 2x2 to 4x4 tiles (``frozen_lake_rows(..., map_max_size=5)``), the goal at
# most ENV_MAX_STEPS moves from the start, MAX_TURNS moves per episode. The observation is the
# compact grid (``workflow_args.compact``: one character per cell, no system prompt), the reply
# a move in triple backticks, e.g. ```Down```.
MAP_MAX_SIZE = 5
ENV_MAX_STEPS = 5
MAX_TURNS = 6
TRAIN_TASKS = 2000
TEST_TASKS = 100
SFT_EPISODES = 1000  # episodes of the warm-up corpus, played on the first train maps
# RL practises a small fixed set of maps, each many times (see frozen_lake.yaml), and the
# "practice" eval plays exactly that set: distinct maps, none held-out, none in the warm-up corpus.
PRACTICE_MAPS = 32
# The warm-up walker: at each turn a random move with probability SFT_RANDOM, else the first
# move of a shortest safe path. It teaches the protocol (read the grid, answer one move in
# backticks, go on after the next observation) and a first idea of the way; 300 SFT steps leave
# the tiny model far from the walker (it solves about half of the held-out maps). With 0.5 or
# 0.25 random moves the SFT-only model was no better than a random walker and RL did not lift it.
SFT_RANDOM = 0.0
MOVES = ("Up", "Down", "Left", "Right")
MODEL = {"hidden_size": 128, "num_layers": 2, "num_heads": 4}
SEED = 0
WORKFLOW_ARGS = {"compact": True, "env_max_steps": ENV_MAX_STEPS, "agent_max_steps": MAX_TURNS}


def grid_cells(observation: str) -> list[list[str]]:
    """The cells of a compact grid (``"_P\\nOG"``)."""
    return [list(line) for line in observation.split("\n") if line]


def oracle_move(observation: str) -> str | None:
    """The first move of a shortest hole-free path on a compact grid."""
    from trinity_agents.frozen_lake import oracle_action

    padded = "\n".join("".join(f" {c} \t" for c in row) for row in grid_cells(observation))
    return oracle_action(padded)


def warmup_policy(rng: random.Random, random_rate: float = SFT_RANDOM):
    """The imperfect scripted walker of the warm-up corpus (``policy(messages) -> reply``)."""

    def policy(messages: list[dict[str, Any]]) -> str:
        move = oracle_move(messages[-1]["content"])
        if move is None or rng.random() < random_rate:
            move = rng.choice(MOVES)
        return f"```{move}```"

    return policy


def play(row: dict[str, Any], policy) -> tuple[list[dict[str, Any]], bool]:
    """One episode of ``policy`` on the map of ``row``: its messages and whether it succeeded."""
    from trinity.workflow import Task
    from trinity_agents.frozen_lake import PLAYER_ON_GOAL, FrozenLakeWorkflow
    from trinity_agents.scripted import scripted_model

    task = Task(workflow=FrozenLakeWorkflow, raw_task=row, workflow_args=dict(WORKFLOW_ARGS))
    workflow = FrozenLakeWorkflow(task=task, model=scripted_model(policy))
    episode = asyncio.run(workflow.play_episode())
    return episode.messages, PLAYER_ON_GOAL in str(episode.observation)


def map_key(row: dict[str, Any]) -> tuple[str, ...]:
    from trinity_agents.frozen_lake import generate_random_map

    desc, _ = generate_random_map(row["size"], row["p"], row["seed"], ENV_MAX_STEPS)
    return tuple(desc)


def make_tasks(train: int | None = None, test: int | None = None) -> tuple[list[dict], list[dict]]:
    """``train`` (default TRAIN_TASKS) and ``test`` (TEST_TASKS) rows; a train row whose map
    equals a held-out map is dropped (small maps repeat), so the held-out maps are never
    practised."""
    from trinity_agents.tasks import frozen_lake_rows

    train = TRAIN_TASKS if train is None else train
    test = TEST_TASKS if test is None else test

    test_rows = frozen_lake_rows(test, seed=SEED + 1, map_max_size=MAP_MAX_SIZE)
    held_out = {map_key(r) for r in test_rows}
    train_rows = [
        r for r in frozen_lake_rows(train, seed=SEED, map_max_size=MAP_MAX_SIZE) if map_key(r) not in held_out
    ]
    return train_rows, test_rows


def practice_maps(rows: list[dict], exclude: list[dict], count: int = PRACTICE_MAPS) -> list[dict]:
    """The first ``count`` rows of ``rows`` with distinct maps, none of them a map of ``exclude``
    (the warm-up corpus's)."""
    seen = {map_key(r) for r in exclude}
    out = []
    for row in rows:
        key = map_key(row)
        if key not in seen:
            seen.add(key)
            out.append(row)
            if len(out) == count:
                break
    return out


def warmup_corpus(rows: list[dict], seed: int = SEED) -> tuple[list[dict], float]:
    """``{"messages": [...]}`` rows, one played episode each, and the walker's success rate."""
    rng = random.Random(seed)
    out, wins = [], 0
    for row in rows:
        messages, success = play(row, warmup_policy(rng))
        out.append({"messages": messages})
        wins += success
    return out, wins / max(1, len(rows))


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def prepare(work: Path) -> None:
    """Recreate ``work`` with the tasks and corpus (``data/``) and the tiny model (``model/``)."""
    from trinity.testing.tiny_model import create_tiny_model

    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            sys.exit(
                f"{work} exists and is not an agents example work folder; choose another --work-dir "
                "(the example deletes and recreates its work folder)"
            )
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by examples/agents/run.py; deleted and recreated on each run\n")

    train, test = make_tasks()
    sft_rows = train[:SFT_EPISODES]
    rl_rows = practice_maps(train[SFT_EPISODES:], sft_rows)
    corpus, walker = warmup_corpus(sft_rows)
    data = work / "data"
    write_jsonl(data / "heldout" / "test.jsonl", test)
    write_jsonl(data / "rl" / "train.jsonl", rl_rows)
    write_jsonl(data / "sft" / "train.jsonl", corpus)
    create_tiny_model(work / "model", seed=SEED, **MODEL)
    print(
        f"[agents] {len(rl_rows)} practice maps for RL, {len(test)} held-out maps, {len(corpus)} warm-up "
        f"episodes (the walker reaches the goal in {walker:.0%}) in {data}; fresh tiny model in "
        f"{work / 'model'}",
        flush=True,
    )


def job_dirs(config_path: Path) -> list[Path]:
    """The job folder of each stage, as ``trinity run`` resolves them."""
    from trinity.config import load_config, stage_configs

    return [Path(stage.checkpoint_job_dir) for stage in stage_configs(load_config(config_path))]


def summary(config_path: Path, seconds: float) -> dict[str, float]:
    """Print the practice and held-out success rates before and after RL, their curves and where
    the results are."""
    rl = job_dirs(config_path)[-1]
    from trinity.monitor.tensorboard import eval_curves

    evals = eval_curves(rl)
    out: dict[str, float] = {"seconds": seconds}
    print("\n" + "=" * 72)
    for name, label in (
        ("practice", f"practice ({PRACTICE_MAPS} RL maps)"),
        ("heldout", "held-out (100 maps)"),
    ):
        if name not in evals:
            continue
        (s0, before), (s1, after) = evals[name][0], evals[name][-1]
        out[f"{name}_before"], out[f"{name}_after"] = before, after
        print(
            f"{label + ':':<27} {before:6.1%} (RL step {s0}) -> {after:6.1%} (RL step {s1})  "
            f"{100 * (after - before):+.1f} points"
        )
    for name in sorted(evals, key=lambda n: n != "practice"):
        print(f"eval {name}: " + ", ".join(f"step {s}: {v:.1%}" for s, v in evals[name]))
    print(f"wall time: {seconds / 60:.1f} min (greedy success rates, one episode per map)")
    checkpoints = sorted(rl.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if checkpoints:
        print(f"final weights (Hugging Face format): {checkpoints[-1]}")
    print(f"tensorboard logs: tensorboard --logdir {rl.parent}")
    print("=" * 72)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("agents-run"), help="default ./agents-run")
    parser.add_argument(
        "--config", type=Path, default=HERE / "frozen_lake.yaml", help="default frozen_lake.yaml"
    )
    args = parser.parse_args(argv)
    work = args.work_dir.resolve()
    config = args.config.resolve()

    start = time.monotonic()
    prepare(work)
    # The YAML finds the data, the model and its checkpoint folder through AGENTS_EXAMPLE_DIR.
    os.environ["AGENTS_EXAMPLE_DIR"] = str(work)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)]
    print(f"[agents] AGENTS_EXAMPLE_DIR={work} trinity run --config {config}", flush=True)
    code = subprocess.call(command, env=env)
    if code != 0:
        print(
            f"[agents] trinity run failed (exit {code}); logs under {work / 'checkpoints'}", file=sys.stderr
        )
        return code
    summary(config, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
