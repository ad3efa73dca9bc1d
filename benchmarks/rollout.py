"""Benchmark: rollout throughput of the transformers engine against plain ``model.generate``.

    python benchmarks/rollout.py [--prompts 16] [--n 4] [--max-tokens 64] [--hidden 256]
                                 [--layers 4] [--repeats 10] [--threads 1]

Both paths sample the same prompts (chat template applied, the same left-padded batch, the same
seed) from the same locally created tiny model. The engine additionally keeps the logits,
computes each sampled token's logprob, cuts responses at EOS and builds Experiences; the baseline
does none of that. Throughput is response tokens per second (tokens up to and including EOS).

The two paths are interleaved (engine, plain, plain, engine, engine, plain, ...: each repeat
runs both, and who goes first alternates), so load from other processes and cache warmth hit
both alike. Each repeat gives a paired ratio engine / plain; the spread of those ratios
(min / median / max over ``--repeats``, default 10) is printed for two clocks:

- **wall**: ``time.perf_counter``. Swings with other processes' load on a shared machine: time
  spent waiting for a core counts.
- **CPU**: ``time.process_time``, the user + system CPU time of this whole process, all its
  threads included (torch's intra-op threads, any thread the engine runs a batch on); nothing
  runs in child processes, so no children's time is missed. It counts the work each path does
  and moves less with load (caches and memory bandwidth are still shared).

torch runs one intra-op thread by default (``--threads 1``): on a small shared machine a second
thread waits (spinning, so it also burns CPU time) at every op for its partner whenever the
partner has lost its core; with 2 threads on a busy 2-core machine both clocks came out ~10x
slower and the ratios swung from 0.5 to 3.

The target is engine / plain >= 0.9."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from trinity.rollout.transformers_engine import TransformersEngine
from trinity.testing.tiny_model import create_tiny_model


def plain_generate(
    engine: TransformersEngine, prompt_ids: list[list[int]], n: int, max_tokens: int, seed: int
) -> int:
    """One batched ``model.generate`` call on the same padded batch; returns response tokens."""
    width = max(map(len, prompt_ids))
    pad = engine.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    attention_mask = (input_ids != pad).long()
    for row, p in enumerate(prompt_ids):  # pad may also be a real token: mask by length
        attention_mask[row] = torch.tensor([0] * (width - len(p)) + [1] * len(p))
    torch.manual_seed(seed)
    with torch.no_grad():
        out = engine.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=n,
            eos_token_id=engine.eos_token_ids,
            pad_token_id=pad,
        )
    eos = set(engine.eos_token_ids)
    total = 0
    for seq in out[:, width:].tolist():
        ends = [i for i, t in enumerate(seq) if t in eos]
        total += ends[0] + 1 if ends else len(seq)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10, help="paired engine/plain runs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny_model(f"{tmp}/model", hidden_size=args.hidden, num_layers=args.layers, num_heads=4)
        engine = TransformersEngine(path, dtype="float32", device="cpu")
        messages = [
            [{"role": "user", "content": f"What is {i} + {i * 7}? Answer briefly."}]
            for i in range(args.prompts)
        ]
        prompt_ids = [engine.encode(engine.apply_chat_template(m)) for m in messages]
        sampling = engine.default_args.updated(
            n=args.n, max_tokens=args.max_tokens, temperature=1.0, top_k=-1, top_p=1.0
        )

        engine_tokens, plain_tokens = 0, 0

        def run_engine(seed: int) -> int:
            groups = engine.generate_tokens(prompt_ids, sampling.updated(seed=seed))
            return sum(e.response_length for g in groups for e in g)

        def run_plain(seed: int) -> int:
            return plain_generate(engine, prompt_ids, args.n, args.max_tokens, seed)

        def timed(fn: Callable[[int], int], seed: int) -> tuple[int, float, float]:
            """(response tokens, wall seconds, process CPU seconds) of one call."""
            start, cpu = time.perf_counter(), time.process_time()
            tokens = fn(seed)
            return tokens, time.perf_counter() - start, time.process_time() - cpu

        # Warm both paths up (first-call allocations, lazy imports) outside the timing.
        run_engine(0)
        run_plain(0)
        rates: dict[str, dict[str, list[float]]] = {
            path: {"wall": [], "cpu": []} for path in ("engine", "plain")
        }
        for r in range(args.repeats):
            seed = 1000 + r
            order = ("engine", "plain") if r % 2 == 0 else ("plain", "engine")
            for path in order:
                tokens, wall, cpu = timed(run_engine if path == "engine" else run_plain, seed)
                rates[path]["wall"].append(tokens / wall)
                rates[path]["cpu"].append(tokens / cpu)
                if path == "engine":
                    engine_tokens += tokens
                else:
                    plain_tokens += tokens
            e, p = (rates[path]["wall"][-1] for path in ("engine", "plain"))
            ec, pc = (rates[path]["cpu"][-1] for path in ("engine", "plain"))
            print(
                f"repeat {r} ({order[0]} first): engine {e:.0f} tok/s, {ec:.0f} tok/CPU-s | "
                f"plain {p:.0f} tok/s, {pc:.0f} tok/CPU-s | ratio wall {e / p:.3f}, CPU {ec / pc:.3f}"
            )

    print(
        f"sequences per call: {args.prompts} x n={args.n}, max_tokens={args.max_tokens}, "
        f"model hidden={args.hidden} layers={args.layers}, threads={args.threads}; {args.repeats} "
        f"repeats, {engine_tokens} engine / {plain_tokens} plain response tokens in all"
    )
    print(
        "wall clock: time.perf_counter; CPU clock: time.process_time (user + system CPU time of "
        "this process, all its threads; nothing runs in child processes)"
    )
    for clock, unit in (("wall", "tokens/s"), ("cpu", "tokens/CPU-s")):
        engine_rates, plain_rates = rates["engine"][clock], rates["plain"][clock]
        ratios = sorted(a / b for a, b in zip(engine_rates, plain_rates, strict=True))
        print(
            f"{clock.upper():>4} ratio engine / plain over {len(ratios)} paired repeats: "
            f"min {ratios[0]:.3f}, median {statistics.median(ratios):.3f}, max {ratios[-1]:.3f}"
            f"  (medians: engine {statistics.median(engine_rates):.0f}, "
            f"plain {statistics.median(plain_rates):.0f} {unit}; target >= 0.9)"
        )
    print(f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
