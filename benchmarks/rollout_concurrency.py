"""Benchmark: concurrent workflow calls batched by the transformers engine vs. one call at a time.

    python benchmarks/rollout_concurrency.py [--callers 16] [--n 8] [--max-tokens 48] [--repeats 5]

The explorer's runners each ask the engine for ``n`` samples of their own task at about the same
time. Batched: ``--callers`` threads call ``generate_tokens`` together, and the engine answers
the calls queued behind a running ``generate`` with one shared ``generate``. Baseline: the same
calls, one after another, in the same process (how a lock-per-call engine serves them). Both
sample the same prompts from the same locally created tiny model, alternating, so load from
other processes hits both alike. Prints response tokens per second of each (median) and the
ratio batched / one-at-a-time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import torch

from trinity.rollout.base import SamplingArgs
from trinity.rollout.transformers_engine import TransformersEngine
from trinity.testing.tiny_model import create_tiny_model


def tokens(groups: list[list]) -> int:
    return sum(exp.response_length for group in groups for exp in group)


def one_at_a_time(engine: TransformersEngine, prompts: list[list[int]], args: SamplingArgs) -> int:
    return sum(tokens(engine.generate_tokens([p], args)) for p in prompts)


def concurrent(engine: TransformersEngine, prompts: list[list[int]], args: SamplingArgs) -> int:
    counts = [0] * len(prompts)

    def call(i: int) -> None:
        counts[i] = tokens(engine.generate_tokens([prompts[i]], args))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny_model(tmp, hidden_size=args.hidden, num_layers=args.layers, seed=0)
        engine = TransformersEngine(path, dtype="float32", device="cpu", seed=0)
        prompts = [
            engine.encode(engine.apply_chat_template([{"role": "user", "content": f"{i}+{i + 1}+{i % 7}"}]))
            for i in range(args.callers)
        ]
        sampling = SamplingArgs(n=args.n, max_tokens=args.max_tokens, temperature=1.0)
        rates: dict[str, list[float]] = {"batched": [], "one at a time": []}
        concurrent(engine, prompts, sampling)  # warm-up
        for _ in range(args.repeats):
            for name, fn in (("batched", concurrent), ("one at a time", one_at_a_time)):
                start = time.perf_counter()
                count = fn(engine, prompts, sampling)
                rates[name].append(count / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name:>14}: {statistics.median(values):9.0f} response tokens/s (median of {args.repeats})")
    ratio = statistics.median(rates["batched"]) / statistics.median(rates["one at a time"])
    print(f"batched / one at a time: {ratio:.2f}x  ({args.callers} callers x n={args.n})")
    print(f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
