"""Weight sync through Ray's object store (``synchronizer.sync_method: memory``).

The trainer packs its weights as CPU tensors (:func:`pack_weights`) and puts them in the object
store once (:func:`publish_weights`); every explorer engine then receives the same object
(:func:`apply_weights`), calling ``update_weights(state_dict, version)`` on it. Works without a
GPU and across nodes; it copies the whole model through the object store once per sync, so for
large models on GPUs ``nccl`` (a broadcast straight to the rollout workers,
:mod:`trinity.sync.nccl`) is faster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def pack_weights(source: Any) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of ``source``'s weights (a module or a state dict).

    Tensors that share storage (tied embeddings) stay shared, so the packed dict is no bigger
    than the model.
    """
    state = source.state_dict() if hasattr(source, "state_dict") else source
    if not isinstance(state, Mapping):
        raise TypeError(f"pack_weights needs a torch module or a state dict, got {type(source).__name__}")
    packed: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen[key] = tensor.detach().to("cpu", copy=True).contiguous()
        packed[name] = seen[key]
    return packed


def publish_weights(state_dict: Mapping[str, torch.Tensor]) -> Any:
    """``ray.put`` the packed weights; returns the ``ObjectRef`` to hand to explorers."""
    import ray

    return ray.put(dict(state_dict))


def apply_weights(engine: Any, weights: Any, version: int) -> Any:
    """Give ``weights`` (a state dict or an ``ObjectRef`` to one) to ``engine`` as ``version``.

    ``engine`` is a local object with ``update_weights(state_dict, version)`` or a Ray actor
    handle of one. For an actor the call is asynchronous and its ``ObjectRef`` is returned (Ray
    resolves a top-level ``ObjectRef`` argument inside the actor, without a copy through the
    caller); for a local engine the engine's return value is returned.
    """
    method = engine.update_weights
    if hasattr(method, "remote"):
        return method.remote(weights, version)
    if _is_object_ref(weights):
        import ray

        weights = ray.get(weights)
    return method(weights, version)


def _is_object_ref(value: Any) -> bool:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a core dependency
        return False
    return isinstance(value, ray.ObjectRef)


__all__ = ["apply_weights", "pack_weights", "publish_weights"]
