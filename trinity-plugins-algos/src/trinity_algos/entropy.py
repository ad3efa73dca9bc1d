"""Entropy bonuses: the trainer subtracts the returned term from the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import EntropyLossFn, aggregate_loss

# ``none`` is the core's null component, registered here under that name (see trinity.algorithm).
from trinity.algorithm.entropy import NoEntropyLossFn
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
            usual = ~expert_mask.to(device=entropy.device, dtype=torch.bool).reshape(-1)
            if usual.shape[0] != entropy.shape[0]:
                raise ValueError(
                    f"entropy_loss_fn 'mix': expert_mask has {usual.shape[0]} rows, entropy has {entropy.shape[0]}"
                )
            mask = action_mask * usual.unsqueeze(-1).to(action_mask.dtype)
        value = aggregate_loss(entropy, mask, loss_agg_mode)
        return value * self.entropy_coef, {"entropy_loss": float(value.detach())}


__all__ = ["DefaultEntropyLossFn", "MixEntropyLossFn", "NoEntropyLossFn"]
