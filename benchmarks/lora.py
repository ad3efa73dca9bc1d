"""LoRA against full-weight training in the native trainer: trainer memory and sync bytes per step.

    OMP_NUM_THREADS=1 python benchmarks/lora.py [--hidden 256] [--layers 4] [--rank 8] [--steps 2]

One locally created Qwen2 model (no download), the same GRPO batch, two native trainers: the
full-weight one and one with ``model.lora_configs`` (``all-linear`` targets, the default). For
each, after ``--steps`` steps:

- trainer memory: the bytes of the tensors the trainer holds between steps (the model's
  parameters and buffers, the reference model's, the gradients and the optimizer state); the
  activations of a step come on top and are the same for both up to the adapter's few matmuls;
- sync bytes: what one weight sync sends (``state_dict()``): the whole model for full training;
  with LoRA the adapter alone (to a transformers engine, and to vLLM, which serves it as its LoRA
  adapter), or the merged weights of the adapted modules (to vLLM over ``nccl``).

Prints both trainers' numbers and LoRA / full as ratios.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from trinity.config import resolve_config
from trinity.config.validation import validate_config
from trinity.experience import Experience
from trinity.testing.conformance import make_rollouts
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer.native import NativeTrainer


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def trainer_memory(trainer: NativeTrainer) -> int:
    """Bytes of the tensors the trainer holds between steps (see the module docstring)."""
    tensors = list(trainer.model.parameters()) + list(trainer.model.buffers())
    tensors += [p.grad for p in trainer.model.parameters()]
    if trainer.ref_model is not None:
        tensors += list(trainer.ref_model.parameters()) + list(trainer.ref_model.buffers())
    for state in trainer.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return _bytes(tensors)


def _config(model: str, root: str, lora: dict | None):
    data = {
        "mode": "train",
        "project": "bench",
        "name": "lora" if lora else "full",
        "checkpoint_root_dir": root,
        "model": {"model_path": model, "max_prompt_tokens": 16, "max_response_tokens": 16},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-3}},
        "buffer": {
            "batch_size": 4,
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
            },
        },
        "trainer": {"trainer_type": "native", "use_dynamic_bsz": False},
    }
    if lora:
        data["model"]["lora_configs"] = [lora]
    return resolve_config(validate_config(data))


def _batch(tokenizer) -> list[Experience]:
    return make_rollouts(tokenizer, groups=4)


def measure(model: str, root: str, lora: dict | None, steps: int) -> dict[str, int]:
    trainer = NativeTrainer(_config(model, root, lora), device="cpu")
    exps = _batch(trainer.tokenizer)
    for _ in range(steps):
        trainer.train_step(exps)
    out = {"memory": trainer_memory(trainer), "sync": _bytes(trainer.state_dict().values())}
    if lora:
        for form, adapter_only in (("adapter", True), ("merged", False)):
            trainer.sync_adapter_only = adapter_only
            out[f"sync {form}"] = _bytes(trainer.state_dict().values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(create_tiny_model(f"{tmp}/model", hidden_size=args.hidden, num_layers=args.layers))
        full = measure(model, f"{tmp}/ckpt", None, args.steps)
        lora = measure(
            model, f"{tmp}/ckpt", {"lora_rank": args.rank, "lora_alpha": 2 * args.rank}, args.steps
        )
    mib = 2**20
    print(
        f"model: hidden {args.hidden}, {args.layers} layers; LoRA rank {args.rank} on all-linear; GRPO with KL"
    )
    print(f"{'':30}{'full':>12}{'LoRA':>12}{'LoRA/full':>12}")
    print(
        f"{'trainer memory (MiB)':30}{full['memory'] / mib:12.2f}{lora['memory'] / mib:12.2f}"
        f"{lora['memory'] / full['memory']:12.3f}"
    )
    for form in ("adapter", "merged"):
        label = f"sync/step {form} (MiB)"
        print(
            f"{label:30}{full['sync'] / mib:12.2f}{lora[f'sync {form}'] / mib:12.2f}"
            f"{lora[f'sync {form}'] / full['sync']:12.3f}"
        )


if __name__ == "__main__":
    main()
