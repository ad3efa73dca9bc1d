"""LoRA in the native trainer (``model.lora_configs``), with PEFT (``pip install 'trinity-core[lora]'``).

With one entry in ``model.lora_configs`` the native trainer wraps its model in a PEFT LoRA model:

- only the adapter's parameters require gradients, so the optimizer (and its state) holds only
  them; the base weights are frozen and kept in the compute dtype;
- the reference log-probs come from the same model with the adapter disabled
  (:func:`adapter_disabled`): no second copy of the model;
- weight sync (:func:`sync_weights`) sends only what the adapter changes (the other weights are
  the frozen base the rollout engines loaded from ``model.model_path``): the adapter alone (each
  module's ``A`` and scaled ``B``, :mod:`trinity.sync.lora_weights`), which the transformers
  engine folds into its base weights and vLLM serves as its LoRA adapter; over ``nccl`` to vLLM,
  whose workers reload plain weights only, the merged weights ``W + scale * B @ A`` of the
  adapted modules under the base model's names;
- a checkpoint holds the adapter (``adapter/``, PEFT's format, what resume reads) and a merged
  export (``huggingface/``: the full model with the adapter folded in, what checkpoint sync,
  ``trinity convert`` and ``from_pretrained`` read).

Keys: ``lora_rank`` (PEFT's ``r``), ``lora_alpha``, ``target_modules`` (``all-linear``, one module
name or regular expression, or a comma-separated list of names), ``exclude_modules`` (the same
forms) and ``path`` (an existing adapter to continue training). PEFT is imported only when LoRA is
configured: the core runs without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from trinity.config.sections.model import LoRAConfig
else:
    torch = lazy_import("torch")

ADAPTER_DIR = "adapter"
MERGED_DIR = "huggingface"
_ADAPTER = "default"  # PEFT's name for the single adapter


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ImportError(
            "model.lora_configs needs PEFT, which is not installed: pip install 'trinity-core[lora]'"
        ) from None
    return peft


def lora_config_of(configs: list[LoRAConfig] | None) -> LoRAConfig | None:
    """The one adapter to train, or ``None`` without LoRA; more than one is refused in one line."""
    if not configs:
        return None
    if len(configs) > 1:
        raise ValueError(
            f"model.lora_configs has {len(configs)} adapters; the native trainer trains one (as Trinity-RFT does)"
        )
    return configs[0]


def _modules(spec: str | None) -> str | list[str] | None:
    """``all-linear`` and a single name or regular expression stay a string (PEFT's forms); a
    comma-separated list becomes a list of names."""
    if spec is None or "," not in spec:
        return spec
    return [part.strip() for part in spec.split(",") if part.strip()]


def apply_lora(model: Any, lora: LoRAConfig) -> Any:
    """``model`` wrapped in a trainable PEFT LoRA model as ``lora`` says (a new adapter, or the
    one saved at ``lora.path``); only the adapter's parameters require gradients."""
    peft = _peft()
    if lora.path:
        return peft.PeftModel.from_pretrained(model, lora.path, is_trainable=True)
    config = peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=lora.lora_rank,
        lora_alpha=lora.lora_alpha,
        target_modules=_modules(lora.target_modules),
        exclude_modules=_modules(lora.exclude_modules),
        lora_dropout=0.0,
        bias="none",
    )
    return peft.get_peft_model(model, config)


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (without importing PEFT when it is not installed)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


@contextlib.contextmanager
def adapter_disabled(model: Any) -> Iterator[None]:
    """The base model's forward pass, in eval mode, for the reference log-probs."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield
    finally:
        model.train(was_training)


def _lora_layers(model: Any) -> Iterator[tuple[str, Any]]:
    """``(base name, module)`` of each adapted module: the Hugging Face module name."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A:
            yield name, module


@torch.no_grad()
def merged_weights(model: Any, *, only_adapted: bool = True) -> dict[str, torch.Tensor]:
    """The weights of the model with the adapter folded in, under the base model's Hugging Face
    names, as detached CPU tensors in the base weights' dtype.

    ``only_adapted``: just the weights of the adapted modules (what changes when the adapter
    trains: what weight sync sends); else the whole model (the merged export).
    """
    merged: dict[str, torch.Tensor] = {}
    for name, module in _lora_layers(model):
        base = module.get_base_layer().weight
        delta = module.get_delta_weight(_ADAPTER)
        merged[f"{name}.weight"] = (base.float() + delta.float()).to(base.dtype).cpu()
    if only_adapted:
        return merged
    full: dict[str, torch.Tensor] = {}
    for key, tensor in model.get_base_model().state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        full[key] = merged.get(key, tensor.detach().cpu())
    return full


@torch.no_grad()
def sync_weights(model: Any, *, adapter_only: bool) -> dict[str, torch.Tensor]:
    """What one weight sync sends, as detached CPU tensors under the base model's names.

    ``adapter_only``: each adapted module's ``<module>.lora_A.weight`` and ``<module>.lora_B.weight``
    with the scale folded into ``B`` (:mod:`trinity.sync.lora_weights` merges them on the
    engine); a module whose base stores its weight transposed (``fan_in_fan_out``) is sent merged.
    Else the merged weights of the adapted modules (:func:`merged_weights`).
    """
    if not adapter_only:
        return merged_weights(model)
    from trinity.sync.lora_weights import LORA_A, LORA_B

    out: dict[str, torch.Tensor] = {}
    for name, module in _lora_layers(model):
        if getattr(module, "fan_in_fan_out", False):
            base = module.get_base_layer().weight
            delta = module.get_delta_weight(_ADAPTER)
            out[f"{name}.weight"] = (base.float() + delta.float()).to(base.dtype).cpu()
            continue
        a = module.lora_A[_ADAPTER].weight
        b = module.lora_B[_ADAPTER].weight * module.scaling[_ADAPTER]
        out[f"{name}{LORA_A}"] = a.detach().to("cpu", copy=True)
        out[f"{name}{LORA_B}"] = b.detach().to("cpu", copy=True)
    return out


def sync_bytes(model: Any, *, adapter_only: bool) -> int:
    """Bytes one weight sync sends (:func:`sync_weights`), from shapes."""
    total = 0
    for _, module in _lora_layers(model):
        base = module.get_base_layer().weight
        if adapter_only and not getattr(module, "fan_in_fan_out", False):
            for half in (module.lora_A[_ADAPTER].weight, module.lora_B[_ADAPTER].weight):
                total += half.numel() * half.element_size()
        else:
            total += base.numel() * base.element_size()
    return total


def save_adapter_and_export(model: Any, folder: str, tokenizer: Any = None) -> None:
    """Write ``folder/adapter`` (the adapter alone, PEFT's format) and ``folder/huggingface``
    (the merged full model and the tokenizer: a plain Hugging Face folder)."""
    model.save_pretrained(os.path.join(folder, ADAPTER_DIR))
    export = os.path.join(folder, MERGED_DIR)
    model.get_base_model().save_pretrained(export, state_dict=merged_weights(model, only_adapted=False))
    if tokenizer is not None:
        tokenizer.save_pretrained(export)


def load_adapter(model: Any, folder: str) -> None:
    """Copy the adapter saved by :func:`save_adapter_and_export` in ``folder`` into ``model``'s
    adapter parameters (in place: an optimizer keeps pointing at them)."""
    peft = _peft()
    from peft.utils import load_peft_weights

    path = os.path.join(folder, ADAPTER_DIR)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{folder} holds no LoRA adapter ({ADAPTER_DIR}/): it was not saved with LoRA"
        )
    result = peft.set_peft_model_state_dict(model, load_peft_weights(path), adapter_name=_ADAPTER)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing:
        raise ValueError(
            f"the adapter in {path} lacks {len(missing)} weight(s) of this model's adapter, e.g. {missing[0]}"
        )


__all__ = [
    "ADAPTER_DIR",
    "MERGED_DIR",
    "adapter_disabled",
    "apply_lora",
    "is_lora_model",
    "load_adapter",
    "lora_config_of",
    "merged_weights",
    "save_adapter_and_export",
    "sync_bytes",
    "sync_weights",
]
