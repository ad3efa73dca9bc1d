"""Base class of entropy losses."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from trinity.algorithm.component import Component

if TYPE_CHECKING:
    import torch


class EntropyLossFn(Component):
    """An entropy term; the trainer *subtracts* it from the loss (an entropy bonus)."""

    def __init__(self, entropy_coef: float = 0.0) -> None:
        self.entropy_coef = entropy_coef

    @abstractmethod
    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the (already coefficient-weighted) entropy term and metrics."""


class NoEntropyLossFn(EntropyLossFn):
    """What ``entropy_loss_fn: none`` (or unset, or ``entropy_coef: 0``) means: no entropy term.

    Returns 0 and no metrics; the trainer skips it (``isinstance(fn, NoEntropyLossFn)``) and
    then computes entropy only where the policy loss asks for it. Registered as ``none`` by
    ``trinity-plugins-algos``; the core uses it for ``none`` when no plugin registers that name.
    """

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """A zero scalar."""
        return entropy.new_zeros(()), {}


__all__ = ["EntropyLossFn", "NoEntropyLossFn"]
