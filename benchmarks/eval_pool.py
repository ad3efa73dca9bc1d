"""Benchmark: a greedy eval of 100 quickstart problems with all tasks at once (the eval pool)
against waves of ``runner_per_model`` (the training pool), in the same process.

    python benchmarks/eval_pool.py [--tasks 100] [--runners 16] [--repeats 5] [--threads 2]

The explorer runs the same eval taskset (math_workflow + math_reward, greedy, the quickstart's
prompt format) on the same locally created tiny math model both ways; the two are interleaved
(who goes first alternates) and each repeat gives a paired ratio. Printed: seconds per eval for
each, the ratio training-pool / eval-pool (min / median / max), and whether both scored the
same (they must: each task's samples depend on the task only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import trinity.explorer.explorer as explorer_module
from trinity.config import load_config
from trinity.explorer.explorer import Explorer


def _job(folder: Path, tasks: int, runners: int) -> Path:
    from trinity_math.tasks import arithmetic_problems
    from trinity_math.tiny import create_math_model

    create_math_model(folder / "model", seed=0)
    rows = [{"question": p.question, "answer": p.answer} for p in arithmetic_problems(tasks, terms=3, seed=1)]
    (folder / "data").mkdir()
    (folder / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = folder / "job.yaml"
    config.write_text(
        f"""
model: {{model_path: {folder}/model, max_prompt_tokens: 32, max_response_tokens: 56}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {{name: train, path: {folder}/data, split: test, format: {{prompt_key: question, response_key: answer, system_prompt: ""}}}}
    eval_tasksets:
      - {{name: heldout, path: {folder}/data, split: test, rollout_args: {{temperature: 0.0}},
          format: {{prompt_key: question, response_key: answer, system_prompt: ""}}}}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input: {{experience_buffer: {{name: e, storage_type: queue}}}}
explorer:
  runner_per_model: {runners}
  rollout_model: {{engine_type: transformers, dtype: float32, seed: 0}}
"""
    )
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--runners", type=int, default=16, help="runner_per_model (the quickstart's 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        explorer = Explorer(load_config(_job(Path(tmp), args.tasks, args.runners)))
        wide_cap = explorer_module.EVAL_RUNNERS_PER_ENGINE
        explorer.eval()  # warm-up: model, tokenizer, math-verify
        times: dict[str, list[float]] = {"training pool": [], "eval pool": []}
        scores: dict[str, set[float]] = {"training pool": set(), "eval pool": set()}
        for i in range(args.repeats):
            order = ["eval pool", "training pool"] if i % 2 == 0 else ["training pool", "eval pool"]
            for which in order:
                explorer_module.EVAL_RUNNERS_PER_ENGINE = wide_cap if which == "eval pool" else args.runners
                start = time.perf_counter()
                metrics = explorer.eval()
                times[which].append(time.perf_counter() - start)
                scores[which].add(metrics["eval/heldout/accuracy"])
        explorer.shutdown()
    ratios = [a / b for a, b in zip(times["training pool"], times["eval pool"])]
    for which, values in times.items():
        print(
            f"{which:14s}: {statistics.median(values):.2f} s per eval of {args.tasks} tasks (median of {args.repeats})"
        )
    print(
        f"training pool / eval pool: median {statistics.median(ratios):.2f}x "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}; wall clock, {args.threads} torch threads)"
    )
    print(
        f"accuracy: training pool {sorted(scores['training pool'])}, eval pool {sorted(scores['eval pool'])}"
    )


if __name__ == "__main__":
    main()
