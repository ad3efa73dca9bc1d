"""Experience pipeline overhead: an explore step's buffer write with and without the pipeline.

    python benchmarks/pipeline.py [--groups 16] [--repeat 8] [--tokens 512] [--steps 20]

A step is ``--groups`` tasks x ``--repeat`` rollouts of ``--tokens`` tokens (half response),
rewards 0/1 with a quarter of the groups all-correct and a quarter all-wrong. Each round writes
``--steps`` steps into a fresh SQLite buffer, once through the plain writer and once through the
experience pipeline of every built-in operator (reward shaping, pass rate, invalid-reward, reward
and reward-std filters, duplicate filter), interleaved, fastest of 3 rounds each. Printed: the
time per step of each and their ratio. This is the pipeline's cost against the buffer write it
wraps, a harsher baseline than a whole explore step (whose generation dwarfs both). The pipeline
drops the zero-variance groups, so its buffer writes less: the "same rows" line times a plain
writer given exactly what the pipeline kept, to show the pipeline's own cost.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from trinity.buffer.sql import SQLStorage, SQLWriter
from trinity.data.experience_ops import EXPERIENCE_OPERATORS as OPS
from trinity.data.pipeline import ExperiencePipeline, PipelineWriter
from trinity.experience import EID, Experience


def copy(exp: Experience) -> Experience:
    """A copy sharing the tensors, with its own reward and info."""
    return Experience(**{**exp.__dict__, "info": dict(exp.info)})


def make_step(step: int, groups: int, repeat: int, tokens: int) -> list[Experience]:
    out = []
    half = tokens // 2
    for g in range(groups):
        for r in range(repeat):
            reward = 1.0 if g % 4 == 0 else 0.0 if g % 4 == 1 else float((g + r) % 2)
            out.append(
                Experience(
                    tokens=torch.randint(0, 30000, (tokens,)),
                    prompt_length=half,
                    logprobs=torch.randn(tokens - half),
                    reward=reward,
                    eid=EID(batch=step, task=g, run=r),
                    info={"quality": 0.1},
                )
            )
    return out


def pipeline() -> ExperiencePipeline:
    return ExperiencePipeline(
        [
            ("invalid_reward_filter", OPS["invalid_reward_filter"]()),
            (
                "reward_shaping_mapper",
                OPS["reward_shaping_mapper"]([{"stats_key": "quality", "op_type": "ADD"}]),
            ),
            ("pass_rate_calculator", OPS["pass_rate_calculator"]()),
            ("reward_filter", OPS["reward_filter"](threshold=-1.0)),
            ("reward_std_filter", OPS["reward_std_filter"]()),
            ("duplicate_filter", OPS["duplicate_filter"]()),
        ]
    )


def run(
    steps: list[list[Experience]], with_pipeline: bool, only: list[list[Experience]] | None = None
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        writer = SQLWriter(SQLStorage(f"sqlite:///{tmp}/b.db", "exp"))
        if with_pipeline:
            writer = PipelineWriter(writer, pipeline())
        warm = make_step(0, 1, 1, 8)  # connect and create the tables outside the timing
        writer.write(warm)
        writer.end_step(0)
        # Fresh copies (the pipeline reshapes rewards in place), made before the clock starts.
        data = [[copy(e) for e in exps] for exps in (only if only is not None else steps)]
        start = time.perf_counter()
        for step, exps in enumerate(data, start=1):
            writer.write(exps)
            writer.end_step(step)
        return (time.perf_counter() - start) / len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    steps = [make_step(s, args.groups, args.repeat, args.tokens) for s in range(1, args.steps + 1)]
    kept = [pipeline().process([copy(e) for e in s])[0] for s in steps]
    plain, piped, same = [], [], []
    for _ in range(3):  # interleaved rounds: both see the same machine load
        plain.append(run(steps, False))
        piped.append(run(steps, True))
        same.append(run(steps, False, kept))
    base, with_pipe, same_rows = min(plain), min(piped), min(same)
    n = args.groups * args.repeat
    print(f"step: {args.groups} groups x {args.repeat} rollouts = {n} experiences of {args.tokens} tokens")
    print(f"kept by the pipeline: {len(kept[0])} of {n} (zero-variance groups dropped)")
    print(f"plain writer:             {1000 * base:7.2f} ms/step")
    print(f"pipeline writer:          {1000 * with_pipe:7.2f} ms/step  ({with_pipe / base:.2f}x plain)")
    print(f"plain writer, same rows:  {1000 * same_rows:7.2f} ms/step")
    print(f"pipeline's own cost:      {with_pipe / same_rows:.2f}x the write of the rows it kept")
    ops = pipeline()
    sample = [copy(e) for e in steps[0]]
    for name, op in ops.operators:
        start = time.perf_counter()
        for _ in range(20):
            op.process([copy(e) for e in sample])
        print(f"  {name:24s} {1000 * (time.perf_counter() - start) / 20:6.2f} ms/step (with copying)")


if __name__ == "__main__":
    main()
