"""Benchmark: the transformers engine's lean decoding step against transformers' forward.

    python benchmarks/lean_decoding.py [--model DIR] [--prompts 16] [--n 8] [--max-tokens 56]
                                       [--hidden 128] [--layers 2] [--repeats 12] [--threads 1]

Two engines on the same model, one with the lean decoding step
(:mod:`trinity.rollout.lean_decoding`) and one with ``lean_decoding=False`` (what
``enforce_eager: true`` gives), sample the same calls (the quickstart's batch by default: 16
arithmetic prompts x 8 samples, 56 tokens at most, temperature 1, each repeat its own prompts and
seed). The two are interleaved (who goes first alternates), so load from other processes hits
both alike; each repeat gives a paired ratio lean / transformers, printed as min / median / max
for the wall clock and for this process's CPU time. It also counts the samples that came out
identical (the lean step's logits equal transformers' up to rounding, so a sample differs only
where a draw falls on a near-tie). Both engines' work runs on the process's one engine thread,
as in the explorer.

Without ``--model`` it builds a random model of the quickstart's shape (``--hidden 128
--layers 2``); ``--model`` takes a saved one (the quickstart's SFT checkpoint gives its answer
lengths; a random model's answers end at random).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trinity.rollout.transformers_engine import TransformersEngine
from trinity.testing.tiny_model import create_tiny_model


def _prompts(engine: TransformersEngine, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    questions = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}+{rng.randint(0, 9)}" for _ in range(count)]
    return [engine.encode(engine.apply_chat_template([{"role": "user", "content": q}])) for q in questions]


def _timed(engine: TransformersEngine, prompts: list[list[int]], args) -> tuple[float, float, list]:
    wall, cpu = time.perf_counter(), time.process_time()
    groups = engine.generate_tokens(prompts, args)
    return time.perf_counter() - wall, time.process_time() - cpu, groups


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", help="a saved model folder (default: a random one of the quickstart's shape)"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=56)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or create_tiny_model(
            Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers, num_heads=4
        )
        lean = TransformersEngine(path, dtype="float32", device="cpu", seed=0)
        plain = TransformersEngine(path, dtype="float32", device="cpu", seed=0, lean_decoding=False)
    if lean.lean is None:
        raise SystemExit(f"{type(lean.model).__name__}: the lean decoding step does not cover this model")

    wall_ratios, cpu_ratios, times = [], [], {"lean": [], "plain": []}
    same = total = tokens = 0
    for repeat in range(args.repeats + 1):  # repeat 0 warms both up and is not counted
        prompts = _prompts(lean, args.prompts, repeat)
        sampling = lean.default_args.updated(
            n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=repeat
        )
        order = [("lean", lean), ("plain", plain)] if repeat % 2 else [("plain", plain), ("lean", lean)]
        results = {name: _timed(engine, prompts, sampling) for name, engine in order}
        if repeat == 0:
            continue
        (lw, lc, lg), (pw, pc, pg) = results["lean"], results["plain"]
        wall_ratios.append(lw / pw)
        cpu_ratios.append(lc / pc)
        times["lean"].append(lw)
        times["plain"].append(pw)
        for a, b in zip((e for g in lg for e in g), (e for g in pg for e in g), strict=True):
            total += 1
            same += a.tokens.tolist() == b.tokens.tolist()
            tokens += a.response_length

    print(
        f"lean decoding step vs transformers' forward: {args.prompts} prompts x {args.n} samples, "
        f"at most {args.max_tokens} tokens, {args.repeats} repeats, {args.threads} thread(s), "
        f"model {'random ' + str(args.hidden) + 'x' + str(args.layers) if not args.model else args.model}"
    )
    print(
        f"  generate: lean {statistics.median(times['lean']) * 1e3:.1f} ms, transformers "
        f"{statistics.median(times['plain']) * 1e3:.1f} ms (medians; {tokens / total:.1f} tokens a sample)"
    )
    print(
        f"  ratio lean / transformers, min / median / max: wall {_spread(wall_ratios)}, CPU {_spread(cpu_ratios)}"
    )
    print(f"  identical samples: {same} / {total}")


if __name__ == "__main__":
    main()
