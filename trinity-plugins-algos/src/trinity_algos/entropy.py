"""Entropy bonuses: the trainer subtracts the returned term from the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import EntropyLossFn, aggregate_loss

# ``none`` is the core's null component, registered here under that name (see trinity.algorithm).
from trinity.algorithm.entropy import NoEntropyLossFn

if TYPE_CHECKING:
    import torch


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


__all__ = ["DefaultEntropyLossFn", "NoEntropyLossFn"]
