"""Likelihood losses: SFT (maximum likelihood) and OPMD (advantage-weighted likelihood)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss
from trinity.algorithm.masked import token_mean_for

if TYPE_CHECKING:
    import torch


class SFTLossFn(PolicyLossFn):
    """Supervised fine-tuning: ``agg(-logprob)`` over valid tokens."""

    def __call__(
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Negative log-likelihood of the response tokens."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob)
        if tm is not None:
            loss = tm.neg_loss(logprob)
        else:
            loss = aggregate_loss(-logprob, action_mask, self.loss_agg_mode)
        return loss, {"sft_loss": loss.item()}


class OPMDPolicyLossFn(PolicyLossFn):
    """Online policy mirror descent: ``agg(-A * logprob) / (1 + tau)``.

    ``tau`` is the strength of the regularisation towards the previous policy; dividing by
    ``1 + tau`` keeps the gradient scale comparable across values of ``tau``.
    """

    def __init__(self, tau: float = 1.0, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.tau = tau

    def __call__(
        self,
        logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantage-weighted negative log-likelihood, scaled by ``1 / (1 + tau)``."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, advantages)
        if tm is not None:
            loss = tm.weighted(advantages, logprob, negate=True) / (1.0 + self.tau)
        else:
            loss = aggregate_loss(-advantages * logprob, action_mask, self.loss_agg_mode) / (1.0 + self.tau)
        return loss, {"opmd_loss": loss.item()}


__all__ = ["OPMDPolicyLossFn", "SFTLossFn"]
