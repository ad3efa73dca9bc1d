"""TOPR: Tapered Off-Policy REINFORCE (Le Roux et al., arXiv:2503.14286)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import LOG_RATIO_CLAMP

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class TOPRPolicyLossFn(PolicyLossFn):
    """TOPR: ``-sg(α) * A * logprob`` with ``α = clip(π/μ, 0, 1)`` where ``A <= advantage_threshold``
    and ``α = 1`` elsewhere.

    Good samples get the plain (SFT-like) REINFORCE gradient; bad ones a truncated importance
    weight, so pushing down an already unlikely sample fades out. The paper uses rewards for
    ``A``; an advantage is the same with a baseline. As in Trinity-RFT the ratio is per token,
    ``π/μ = exp(logprob - old_logprob)`` (the paper writes it per sequence). Metrics:
    ``topr_loss``, ``avg_alpha``, ``avg_ratio`` (ratio from the log-ratio clamped to ±20).
    """

    def __init__(self, advantage_threshold: float = 0.0, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.advantage_threshold = advantage_threshold

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Tapered REINFORCE loss over valid tokens."""
        with torch.no_grad():
            log_ratio = logprob - old_logprob
            # exp(min(x, 0)) = clip(exp(x), 0, 1), without overflow for large x.
            truncated = torch.exp(torch.clamp(log_ratio, max=0.0))
            alpha = torch.where(advantages <= self.advantage_threshold, truncated, torch.ones_like(truncated))
        loss = aggregate_loss(-alpha * advantages * logprob, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            avg_alpha = masked_mean(alpha, action_mask)
            avg_ratio = masked_mean(ratio, action_mask)
        return loss, {
            "topr_loss": float(loss.detach()),
            "avg_alpha": float(avg_alpha),
            "avg_ratio": float(avg_ratio),
        }


__all__ = ["TOPRPolicyLossFn"]
