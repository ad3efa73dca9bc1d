"""TOPR: Tapered Off-Policy REINFORCE (Le Roux et al., arXiv:2503.14286)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import token_mean_for
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
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, old_logprob, advantages)
        if tm is not None:
            # token-mean: the same arithmetic with one mask count, in-place temporaries, the
            # constant weight folded into the mask, and alpha's ``where`` as a maximum with a
            # 0/1 flag: max(t, 1) = 1 and max(t, 0) = t for t = exp(min(x, 0)) in [0, 1]. Only a
            # NaN (in t or A) tells the two apart, and then the sums below are NaN: such a batch
            # takes the general path, so every result is the general path's.
            with torch.no_grad():
                log_ratio = logprob.detach() - old_logprob
                alpha = torch.clamp(log_ratio, max=0.0).exp_()
                above = torch.gt(advantages, self.advantage_threshold, out=torch.empty_like(alpha))
                alpha = torch.maximum(alpha, above, out=alpha)
                alpha_sum = tm.sum(alpha)
                ratio_sum = tm.sum(log_ratio.clamp_(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp_())
                weight = alpha.mul_(advantages)
            loss = tm.weighted(weight, logprob, negate=True, overwrite=True)
            sums = torch.stack((loss.detach(), alpha_sum / tm.denominator, ratio_sum / tm.denominator))
            topr_loss, avg_alpha, avg_ratio = sums.tolist()
            if not math.isnan(topr_loss + avg_alpha):
                return loss, {"topr_loss": topr_loss, "avg_alpha": avg_alpha, "avg_ratio": avg_ratio}
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
            "topr_loss": loss.item(),
            "avg_alpha": float(avg_alpha),
            "avg_ratio": float(avg_ratio),
        }


__all__ = ["TOPRPolicyLossFn"]
