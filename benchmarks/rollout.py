"""Benchmark: rollout throughput of the transformers engine against plain ``model.generate``.

    python benchmarks/rollout.py [--prompts 16] [--n 4] [--max-tokens 64] [--hidden 256]
                                 [--layers 4] [--repeats 3] [--threads 2]

Both paths sample the same prompts (chat template applied, the same left-padded batch, the same
seed) from the same locally created tiny model. The engine additionally keeps the logits,
computes each sampled token's logprob, cuts responses at EOS and builds Experiences; the baseline
does none of that. Throughput is response tokens per second (tokens up to and including EOS).
Prints the median of each and the ratio engine / plain, median and best-of-N (target >= 0.9);
the two paths alternate, so load from other processes hits both alike. On a shared, busy
machine wall-clock ratios swing widely (a thread that loses its core stalls the whole step), so
the ratio of tokens per second of *process CPU time* is printed too: it counts the work each
path does and hardly moves with other processes' load (most telling with ``--threads 1``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from trinity.explorer.engines.transformers_engine import TransformersEngine
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
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

        engine_tps, plain_tps, engine_cpu, plain_cpu = [], [], [], []
        plain_generate(engine, prompt_ids[:2], 1, 4, 0)  # warm-up
        for r in range(args.repeats):
            seed = 1000 + r
            start, cpu = time.perf_counter(), time.process_time()
            groups = engine.generate_tokens(prompt_ids, sampling.updated(seed=seed))
            engine_tokens = sum(e.response_length for g in groups for e in g)
            engine_tps.append(engine_tokens / (time.perf_counter() - start))
            engine_cpu.append(engine_tokens / (time.process_time() - cpu))

            start, cpu = time.perf_counter(), time.process_time()
            plain_tokens = plain_generate(engine, prompt_ids, args.n, args.max_tokens, seed)
            plain_tps.append(plain_tokens / (time.perf_counter() - start))
            plain_cpu.append(plain_tokens / (time.process_time() - cpu))
            print(f"repeat {r}: engine {engine_tokens} tok, {engine_tps[-1]:.0f} tok/s | "
                  f"plain {plain_tokens} tok, {plain_tps[-1]:.0f} tok/s")  # fmt: skip

    e, p = statistics.median(engine_tps), statistics.median(plain_tps)
    print(f"sequences per call: {args.prompts} x n={args.n}, max_tokens={args.max_tokens}, "
          f"model hidden={args.hidden} layers={args.layers}, threads={args.threads}")  # fmt: skip
    print(f"transformers engine: {e:.0f} tokens/s (median of {args.repeats})")
    print(f"plain model.generate: {p:.0f} tokens/s")
    print(f"ratio engine / plain: {e / p:.3f} median, {max(engine_tps) / max(plain_tps):.3f} best-of-"
          f"{args.repeats}  (target >= 0.9)")  # fmt: skip
    ec, pc = statistics.median(engine_cpu), statistics.median(plain_cpu)
    print(f"ratio per CPU second: {ec / pc:.3f} median ({ec:.0f} vs {pc:.0f} tokens per CPU second)")


if __name__ == "__main__":
    main()
