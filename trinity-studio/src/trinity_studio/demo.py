"""A run folder with made-up metrics and experiences, written the way a real run writes them.

For the studio's tests, its benchmark and its documentation screenshots: the scalars go through
:class:`trinity.monitor.tensorboard.TensorboardMonitor` and the experiences through the SQL
buffer (:class:`trinity.buffer.sql.SQLStorage`) or the jsonl format of ``trinity debug
--output-file``, so the studio reads exactly what it reads after a real job. Imports torch.

    python -m trinity_studio.demo ROOT [EXPERIENCES]
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

DEMO_TASKSETS = ("heldout", "practice")


def reward_at(step: int) -> float:
    """The demo run's ``rollout/reward_mean`` at ``step`` (a rising curve)."""
    return round(1 - 0.8 * math.exp(-step / 4), 4)


def logprob_gap_at(step: int) -> float:
    """The demo run's ``rollout/logprob_diff/mean`` at ``step`` (the log-prob guard's measure)."""
    return round(1e-5 * (1 + step % 3), 8)


def write_scalars(run_dir: str, steps: int) -> None:
    """Explorer and trainer scalars for ``steps`` steps, named as Trinity's monitors name them."""
    from trinity.monitor.tensorboard import TensorboardMonitor

    folder = os.path.join(run_dir, "monitor", "tensorboard")
    explorer = TensorboardMonitor(folder, "explorer")
    trainer = TensorboardMonitor(folder, "trainer")
    try:
        for step in range(1, steps + 1):
            metrics: dict[str, Any] = {
                "rollout/reward_mean": reward_at(step),
                "rollout/model_version": step - 1,
                "timing/explore_step": 1.5 + 0.1 * (step % 3),
            }
            if step % 2 == 0 or step == 1:
                for i, taskset in enumerate(DEMO_TASKSETS):
                    metrics[f"eval/{taskset}/accuracy"] = min(1.0, 0.2 + 0.1 * step + 0.05 * i)
            explorer.log(metrics, step)
            trainer.log(
                {
                    "actor/loss": 1.0 / step,
                    "actor/pg_loss": 0.8 / step,
                    "timing/step": 2.0 + 0.05 * step,
                    "rollout/logprob_diff/mean": logprob_gap_at(step),
                },
                step,
            )
    finally:
        explorer.close()
        trainer.close()


def demo_experiences(count: int, response_length: int = 8) -> Iterator[Any]:
    """``count`` arithmetic experiences with logprobs, advantages and an action mask."""
    import torch

    from trinity.experience import EID, Experience

    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        a, b = i % 10, (i // 10) % 10
        prompt, answer = f"{a}+{b}=", str(a + b)
        response = f"<answer>{answer}</answer>"[:response_length]
        tokens = torch.tensor([ord(c) for c in prompt + response], dtype=torch.long)
        n = len(response)
        reward = float(i % 3 == 0)
        yield Experience(
            tokens=tokens,
            prompt_length=len(prompt),
            logprobs=-torch.rand(n, generator=generator) * 2,
            reward=reward,
            action_mask=torch.tensor([j % 5 != 4 for j in range(n)]),
            advantages=torch.full((n,), reward - 1 / 3),
            prompt_text=prompt,
            response_text=response,
            eid=EID(batch=i // 16, task=i // 4, run=i % 4),
            model_version=i // 16,
        )


def write_sql_experiences(url: str, count: int, table: str = "experiences", chunk: int = 1000) -> None:
    """``count`` demo experiences written to an SQL buffer in transactions of ``chunk``."""
    from trinity.buffer.sql import SQLStorage

    storage = SQLStorage(url, table)
    batch = []
    for exp in demo_experiences(count):
        batch.append(exp)
        if len(batch) == chunk:
            storage.write(batch)
            batch = []
    if batch:
        storage.write(batch)
    storage.engine.dispose()


def write_jsonl_experiences(path: str, count: int) -> None:
    """``count`` demo experiences as ``trinity debug --output-file`` writes them."""
    from trinity.buffer.file import experience_to_json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for exp in demo_experiences(count):
            f.write(experience_to_json(exp) + "\n")


def write_demo_tokenizer(path: str) -> str:
    """A character-level tokenizer in which a character's token id is its code (what the demo
    experiences use: ``ord(c)``), saved at ``path``."""
    from trinity.testing.tiny_model import build_tokenizer

    build_tokenizer("".join(chr(c) for c in range(4, 127))).save_pretrained(path)
    return path


def write_demo_config(run_dir: str, root: str, project: str, name: str, model_path: str) -> None:
    """The config a run saves in its folder (``config.yaml``, as ``trinity run`` writes it)."""
    from trinity.config import Config

    config = Config(
        project=project,
        name=name,
        checkpoint_root_dir=root,
        model={"model_path": model_path, "max_prompt_tokens": 8, "max_response_tokens": 16},
        buffer={
            "batch_size": 4,
            "trainer_input": {
                "experience_buffer": {
                    "name": "experiences",
                    "storage_type": "queue",
                    "path": "sqlite:///" + os.path.join(run_dir, "buffer", "experiences.db"),
                }
            },
        },
    )
    with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as f:
        f.write("# The resolved config of this run (a demo).\n" + config.to_yaml())


def make_demo_run(
    root: str,
    project: str = "demo",
    name: str = "tiny",
    steps: int = 8,
    experiences: int = 40,
    finished: bool = True,
) -> str:
    """A run folder ``root/project/name`` (its saved config, logs, scalars, an SQL buffer, and a
    tokenizer as its model); returns its path.

    ``finished``: its files are dated an hour back, so the studio infers ``finished``."""
    run_dir = os.path.join(root, project, name)
    os.makedirs(os.path.join(run_dir, "log"), exist_ok=True)
    model = write_demo_tokenizer(os.path.join(run_dir, "model"))
    write_demo_config(run_dir, root, project, name, model)
    for role in ("explorer", "trainer"):
        with open(os.path.join(run_dir, "log", f"{role}.log"), "w") as f:
            f.write(f"[{role}] started\n[{role}] finished {steps} steps\n")
    write_scalars(run_dir, steps)
    if experiences:
        write_sql_experiences(os.path.join(run_dir, "buffer", "experiences.db"), experiences)
    if finished:
        past = time.time() - 3600
        for folder, _, files in os.walk(run_dir):
            for file in files:
                os.utime(os.path.join(folder, file), (past, past))
    return run_dir


if __name__ == "__main__":
    print(make_demo_run(sys.argv[1], experiences=int(sys.argv[2]) if len(sys.argv) > 2 else 40))
