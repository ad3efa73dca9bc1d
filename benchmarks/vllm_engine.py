"""The vLLM rollout engine (its CPU build here) against the transformers engine, same script.

    python benchmarks/vllm_engine.py [--hidden 128] [--layers 2] [--heads 4] [--rounds 6]

Needs vLLM installed (``nox -s vllm`` makes such a venv: ``.nox/vllm/bin/python
benchmarks/vllm_engine.py``). Both engines serve the same locally created Qwen2 (the
quickstart's size by default) in fp32 and get the same batch, a quickstart GRPO step's: 16
prompts of 24 tokens, 8 samples each, up to 48 new tokens, temperature 1, seeded. Rounds
alternate between the engines so both see the same machine load. Prints, per engine, the median
generation time and sampled tokens per second, and the sync time of a full state dict (the
transformers engine copies into its parameters; vLLM writes a shared-memory file that its worker
reloads in place); then the paired per-round ratios (min-max over rounds) and their medians.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from typing import Any

import torch

from trinity.config import InferenceModelConfig
from trinity.rollout.base import SamplingArgs
from trinity.rollout.transformers_engine import TransformersEngine
from trinity.rollout.vllm_engine import VLLMEngineActor, sampling_params_kwargs
from trinity.rollout.vllm_start import engine_kwargs, is_cpu_build
from trinity.sync.memory import to_wire
from trinity.testing.tiny_model import create_tiny_model

PROMPTS, SAMPLES, PROMPT_TOKENS, MAX_TOKENS = 16, 8, 24, 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        # `nox -s bench` runs every benchmark without vLLM: say how to run this one instead.
        print("[vllm_engine] skipped: vLLM is not installed here; run `nox -s vllm -- bench`")
        return

    folder = tempfile.mkdtemp(prefix="bench_vllm_")
    path = str(
        create_tiny_model(folder, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads)
    )
    state = _state(path)
    params = sum(t.numel() for t in state.values())
    prompts = [[5 + (p * 7 + i) % 90 for i in range(PROMPT_TOKENS)] for p in range(PROMPTS)]

    hf = TransformersEngine(path, dtype="float32", seed=0)
    config = InferenceModelConfig(model_path=path, dtype="float32", max_model_len=256, seed=0)
    loop = asyncio.new_event_loop()
    vllm_actor = VLLMEngineActor(engine_kwargs(config, on_cpu=is_cpu_build()))

    def run_hf(seed: int) -> int:
        return _new_tokens(hf.generate_tokens(prompts, _args(seed)))

    def run_vllm(seed: int) -> int:
        call = vllm_actor.generate(prompts, sampling_params_kwargs(_args(seed)), [""] * PROMPTS, 0)
        return _new_tokens(loop.run_until_complete(call))

    def sync_hf() -> None:
        hf.update_weights(state, version=1)

    def sync_vllm() -> None:
        loop.run_until_complete(vllm_actor.update_weights(to_wire(state)))

    run_hf(-1), run_vllm(-1)  # warm-up
    gen: dict[str, list[float]] = {"transformers": [], "vllm": []}
    tps: dict[str, list[float]] = {"transformers": [], "vllm": []}
    sync: dict[str, list[float]] = {"transformers": [], "vllm": []}
    for r in range(args.rounds):
        for name, run, push in (("transformers", run_hf, sync_hf), ("vllm", run_vllm, sync_vllm)):
            tick = time.perf_counter()
            tokens = run(r)
            seconds = time.perf_counter() - tick
            gen[name].append(seconds)
            tps[name].append(tokens / seconds)
            tick = time.perf_counter()
            push()
            sync[name].append(time.perf_counter() - tick)
    vllm_actor.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))  # lets the engine's output task take its cancellation
    hf.shutdown()

    print(
        f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, {params / 1e6:.2f}M parameters, fp32; "
        f"batch {PROMPTS} prompts x {SAMPLES} samples, <= {MAX_TOKENS} new tokens; {args.rounds} rounds"
    )
    for name in gen:
        print(
            f"{name:>12}: generate {statistics.median(gen[name]):.3f} s "
            f"({statistics.median(tps[name]):.0f} tokens/s), sync {1000 * statistics.median(sync[name]):.1f} ms"
        )
    speed = [v / t for v, t in zip(tps["vllm"], tps["transformers"])]
    sync_ratio = [v / t for v, t in zip(sync["vllm"], sync["transformers"])]
    print(
        f"vLLM / transformers tokens per second: median {statistics.median(speed):.2f} "
        f"(rounds {min(speed):.2f}-{max(speed):.2f})"
    )
    print(
        f"vLLM / transformers sync time: median {statistics.median(sync_ratio):.2f} "
        f"(rounds {min(sync_ratio):.2f}-{max(sync_ratio):.2f})"
    )


def _args(seed: int) -> SamplingArgs:
    return SamplingArgs(n=SAMPLES, temperature=1.0, max_tokens=MAX_TOKENS, seed=1000 + seed)


def _new_tokens(groups: list[list[Any]]) -> int:
    return sum(len(e.tokens) - e.prompt_length for group in groups for e in group)


def _state(path: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


if __name__ == "__main__":
    main()
