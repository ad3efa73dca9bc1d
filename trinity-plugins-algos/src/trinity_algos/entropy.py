"""Entropy bonuses: the trainer subtracts the returned term from the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import EntropyLossFn, aggregate_loss

# ``none`` is the core's null component, registered here under that name (see trinity.algorithm).
from trinity.algorithm.entropy import NoEntropyLossFn
from trinity.algorithm.masked import _safe_denominator
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class DefaultEntropyLossFn(EntropyLossFn):
    """``entropy_coef * agg(entropy)`` over valid tokens; metric ``entropy_loss`` is unweighted."""

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Coefficient-weighted aggregated entropy."""
        value = aggregate_loss(entropy, action_mask, loss_agg_mode)
        return value * self.entropy_coef, {"entropy_loss": float(value.detach())}


class MixEntropyLossFn(EntropyLossFn):
    """``entropy_coef * agg(entropy)`` over the valid tokens of non-expert rows only (MIX / CHORD).

    Expert rows are demonstrations, not the policy's samples: an entropy bonus there would
    push the policy away from the expert's tokens. Rows are dropped by masking, which under every
    ``loss_agg_mode`` equals aggregating over the usual rows alone. Without ``expert_mask`` every
    row counts (the ``default`` entropy bonus). Metric ``entropy_loss`` is unweighted.
    """

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        expert_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Coefficient-weighted entropy of the usual rows."""
        mask = action_mask
        if expert_mask is not None:
            if not (
                expert_mask.dtype is torch.bool
                and expert_mask.ndim == 1
                and expert_mask.is_cpu
                and entropy.is_cpu
            ):
                expert_mask = expert_mask.to(device=entropy.device, dtype=torch.bool).reshape(-1)
            if expert_mask.shape[0] != entropy.shape[0]:
                raise ValueError(
                    f"entropy_loss_fn 'mix': expert_mask has {expert_mask.shape[0]} rows, entropy has {entropy.shape[0]}"
                )
            dtype = entropy.dtype
            if loss_agg_mode == "token-mean" and action_mask.dtype is dtype:
                # aggregate_loss's token-mean written out: this term is small enough for every
                # call to show. Same operations in the same order, so the same bits.
                usual = (~expert_mask).unsqueeze(-1)
                mask = action_mask * (usual.float() if dtype is torch.float32 else usual.to(dtype))
                value = (entropy * mask).sum() / mask.sum()
                metric = value.item()
                if metric != metric:  # NaN: maybe an empty mask (0 / 0), which must give 0
                    value = (entropy * mask).sum() / _safe_denominator(mask.sum())
                    metric = value.item()
                return value * _scalar(self.entropy_coef, value), {"entropy_loss": metric}
            mask = action_mask * (~expert_mask).unsqueeze(-1).to(action_mask.dtype)
        value = aggregate_loss(entropy, mask, loss_agg_mode)
        return value * self.entropy_coef, {"entropy_loss": float(value.detach())}


_CPU_SCALARS: dict[tuple[float, Any], torch.Tensor] = {}


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor | float:
    """``value`` as a 0-dim CPU tensor of ``like``'s dtype, made once (for a float32/64 CPU
    ``like``; else ``value`` itself). ``like * tensor`` then skips wrapping the Python number on
    every call, and gives the same result: a wrapped Python number is applied in ``like``'s
    dtype too. (Half types apply a wrapped number in float32, so they keep the number.)"""
    scalar = _CPU_SCALARS.get((value, like.dtype))
    if scalar is not None and like.is_cpu:
        return scalar
    if not (like.is_cpu and like.dtype in (torch.float32, torch.float64)):
        return value
    if len(_CPU_SCALARS) > 64:
        _CPU_SCALARS.clear()
    scalar = _CPU_SCALARS[(value, like.dtype)] = torch.tensor(value, dtype=like.dtype)
    return scalar


__all__ = ["DefaultEntropyLossFn", "MixEntropyLossFn", "NoEntropyLossFn"]
