"""Adapter-only weight sync for LoRA (``model.lora_configs``) to the transformers engine.

With LoRA only the adapter changes, so the trainer sends each adapted module's ``A`` and ``B``
instead of its merged weight (:func:`trinity.trainer.lora.sync_weights`), under the base module's
Hugging Face name: ``<module>.lora_A.weight`` ``(r, in)`` and ``<module>.lora_B.weight``
``(out, r)``, with ``B`` already multiplied by the adapter's scale (``lora_alpha / r``). The
engine folds them in with :class:`AdapterMerger`: ``W = W_base + B @ A``, from the base weights
of its model folder (read once, kept on the CPU), never from its current weights, which already
hold an earlier adapter (or a merged checkpoint after a resume). The other names of a sync are
plain weights, loaded as they are.

vLLM serves the adapter itself instead (``enable_lora``): :func:`write_peft_adapter` writes the
halves as a PEFT adapter folder, which its engine loads as a LoRA adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"


def is_adapter_name(name: str) -> bool:
    """Whether ``name`` is one half of an adapter (``<module>.lora_A.weight`` / ``.lora_B.weight``)."""
    return name.endswith((LORA_A, LORA_B))


def split_adapter_weights(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(plain weights, adapter halves)`` of a sync's state dict."""
    plain, adapters = {}, {}
    for name, tensor in state.items():
        (adapters if is_adapter_name(name) else plain)[name] = tensor
    return plain, adapters


class AdapterMerger:
    """Merges adapter halves into full weights over the base weights of ``base_path``.

    Args:
        base_path: the engine's model folder (the base the adapter was trained on).
        dtype: the engine's weight dtype; the base is read in it.
    """

    def __init__(self, base_path: str, dtype: Any) -> None:
        self.base_path = base_path
        self.dtype = dtype
        self._base: dict[str, torch.Tensor] | None = None

    def _base_weights(self, names: set[str]) -> dict[str, torch.Tensor]:
        if self._base is None or not names <= set(self._base):
            from transformers import AutoModelForCausalLM

            # Read once, on the CPU: only the adapted modules' weights are kept.
            model = AutoModelForCausalLM.from_pretrained(self.base_path, dtype=self.dtype)
            state = model.state_dict()
            missing = sorted(names - set(state))
            if missing:
                raise KeyError(
                    f"LoRA sync: {len(missing)} adapted module(s) not in the rollout model, e.g. {missing[0]!r}"
                )
            self._base = {**(self._base or {}), **{n: state[n].detach().clone() for n in names}}
        return self._base

    @torch.no_grad()
    def merge(self, adapters: Mapping[str, torch.Tensor], device: Any = "cpu") -> dict[str, torch.Tensor]:
        """``{<module>.weight: W_base + B @ A}`` for the adapter halves in ``adapters``, on ``device``."""
        modules = {name[: -len(LORA_A)] for name in adapters if name.endswith(LORA_A)}
        modules |= {name[: -len(LORA_B)] for name in adapters if name.endswith(LORA_B)}
        lonely = sorted(
            m for m in modules if f"{m}{LORA_A}" not in adapters or f"{m}{LORA_B}" not in adapters
        )
        if lonely:
            raise ValueError(f"LoRA sync: module {lonely[0]!r} came with only one of lora_A and lora_B")
        base = self._base_weights({f"{m}.weight" for m in modules})
        merged = {}
        for module in sorted(modules):
            a = adapters[f"{module}{LORA_A}"].to(device=device, dtype=torch.float32)
            b = adapters[f"{module}{LORA_B}"].to(device=device, dtype=torch.float32)
            w = base[f"{module}.weight"]
            if tuple(w.shape) != (b.shape[0], a.shape[1]):
                raise ValueError(
                    f"LoRA sync: {module} has B @ A of shape {(b.shape[0], a.shape[1])}, "
                    f"the model's weight is {tuple(w.shape)}"
                )
            merged[f"{module}.weight"] = (w.to(device=device, dtype=torch.float32) + b @ a).to(w.dtype)
        return merged


PEFT_PREFIX = "base_model.model."  # PEFT's prefix of the adapted module names in a saved adapter


def write_peft_adapter(adapters: Mapping[str, torch.Tensor], folder: str) -> int:
    """Write the adapter halves of a sync into ``folder`` as a PEFT LoRA adapter
    (``adapter_config.json`` and ``adapter_model.safetensors``, what vLLM's ``LoRARequest``
    loads) and return its rank. ``B`` comes pre-scaled, so the adapter's ``lora_alpha`` is its
    rank (scale 1)."""
    import json
    import os

    from safetensors.torch import save_file

    modules = sorted(
        {n[: -len(LORA_A)] for n in adapters if n.endswith(LORA_A)}
        | {n[: -len(LORA_B)] for n in adapters if n.endswith(LORA_B)}
    )
    lonely = [m for m in modules if f"{m}{LORA_A}" not in adapters or f"{m}{LORA_B}" not in adapters]
    if lonely:
        raise ValueError(f"LoRA sync: module {lonely[0]!r} came with only one of lora_A and lora_B")
    ranks = {int(adapters[f"{m}{LORA_A}"].shape[0]) for m in modules}
    if len(ranks) != 1:
        raise ValueError(
            f"LoRA sync: the adapted modules have different ranks {sorted(ranks)}; one rank is served"
        )
    (rank,) = ranks
    tensors = {f"{PEFT_PREFIX}{name}": t.detach().cpu().contiguous() for name, t in adapters.items()}
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return rank


__all__ = [
    "LORA_A",
    "LORA_B",
    "AdapterMerger",
    "is_adapter_name",
    "split_adapter_weights",
    "write_peft_adapter",
]
