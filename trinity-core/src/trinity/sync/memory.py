"""The trainer's weights as plain CPU tensors (what ``sync_method: memory`` puts in Ray's
object store; see :class:`trinity.sync.transport.MemoryTransport`)."""

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


__all__ = ["pack_weights"]
