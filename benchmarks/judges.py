"""Benchmark: what a judge model costs per step, as a ratio of the step's rollout time.

    python benchmarks/judges.py [--tasks 16] [--repeats 10] [--judge-tokens 40] [--threads 2]

One explore step of ``math_ruler_workflow`` (RULER: the policy answers each question
``repeat_times`` times, then a judge model reads the whole group and scores it), in this
process, on the transformers engine: the quickstart's tiny math model as the policy (its
prompt format, 56 response tokens, 8 answers a question) and a tiny model of the same size as
the judge (greedy, ``--judge-tokens`` reply tokens; it reads the question and the 8 answers,
about ten times the policy's prompt). The judge's calls are timed apart from the rest of each
workflow run (the policy's sampling and the gold reward), the questions one after another (the
explorer's runners would batch both models' calls across questions), so each repeat gives the
ratio judge / rollout for one step; printed: seconds per step of each and the ratio (min / median /
max over the repeats). The tiny judge cannot write scores, so every judging takes the counted
fallback (also printed): the cost measured is the judge's prefill and decoding, which a real
judge of the same size pays alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


class TimedJudge:
    """A model wrapper whose ``chat`` calls are timed (the judge's share of a step)."""

    def __init__(self, model: Any) -> None:
        self.model, self.seconds = model, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def chat(self, messages: list[dict[str, Any]], **args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.model.chat(messages, **args)
        finally:
            self.seconds += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=16, help="questions per step (default 16)")
    parser.add_argument("--repeats", type=int, default=10, help="steps measured (default 10)")
    parser.add_argument("--judge-tokens", type=int, default=40, help="judge reply tokens (default 40)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("trinity_math").setLevel(logging.ERROR)  # each fallback's line: counted below

    from trinity.config import FormatConfig, GenerationConfig
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout.base import SamplingArgs
    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.workflow import Task
    from trinity_math.ruler import MathRULERWorkflow
    from trinity_math.tasks import arithmetic_problems
    from trinity_math.tiny import create_math_model

    with tempfile.TemporaryDirectory() as tmp:
        policy_path = create_math_model(Path(tmp) / "policy", seed=0)
        judge_path = create_math_model(Path(tmp) / "judge", seed=1)
        policy = ModelWrapper(TransformersEngine(policy_path, dtype="float32", device="cpu", seed=0))
        judge_engine = TransformersEngine(
            judge_path,
            dtype="float32",
            device="cpu",
            seed=0,
            max_model_len=4096,
            default_args=SamplingArgs(temperature=0.0, max_tokens=args.judge_tokens),
        )
        judge = TimedJudge(ModelWrapper(judge_engine))
        problems = arithmetic_problems(args.tasks * (args.repeats + 1), terms=3, seed=1)
        rows: list[tuple[float, float]] = []
        fallbacks = 0
        for repeat in range(args.repeats + 1):  # the first step warms up, not counted
            judge.seconds, start = 0.0, time.perf_counter()
            for p in problems[repeat * args.tasks : (repeat + 1) * args.tasks]:
                task = Task(
                    workflow=MathRULERWorkflow,
                    raw_task={"question": p.question, "answer": p.answer},
                    format_args=FormatConfig(prompt_key="question", response_key="answer", system_prompt=""),
                    rollout_args=GenerationConfig(temperature=1.0, max_tokens=56),
                    repeat_times=8,
                )
                workflow = task.to_workflow(policy, [judge])
                workflow.set_repeat_times(8, 0)
                experiences = workflow.run()
                fallbacks += sum("judge_failure" in e.info for e in experiences[:1])
            total = time.perf_counter() - start
            if repeat:
                rows.append((total - judge.seconds, judge.seconds))
    rollout = [r for r, _ in rows]
    judging = [j for _, j in rows]
    ratios = sorted(j / r for r, j in rows)
    print(f"{args.tasks} questions x 8 answers a step, {args.repeats} steps, {args.threads} torch threads")
    print(f"rollout (policy sampling + gold reward): {statistics.median(rollout):.2f} s/step (median)")
    print(f"judging (one judge call a question):      {statistics.median(judging):.2f} s/step (median)")
    print(
        f"judge / rollout: min {ratios[0]:.2f}  median {statistics.median(ratios):.2f}  max {ratios[-1]:.2f}"
    )
    print(f"judgings that took the fallback: {fallbacks} of {args.tasks * (args.repeats + 1)}")


if __name__ == "__main__":
    main()
