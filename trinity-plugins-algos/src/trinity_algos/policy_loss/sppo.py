"""sPPO, token form (arXiv:2108.05828, as cited by Trinity-RFT): a log-ratio surrogate with a hard
trust region."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class SPPOPolicyLossFn(PolicyLossFn):
    """sPPO: ``-A * (logprob - old_logprob) * 1[1/(1+ε) <= r <= 1+ε]``, ``r = exp(logprob - old_logprob)``.

    Inside the trust region the gradient is the plain policy gradient ``-A ∇logprob`` (the
    surrogate is the log of the ratio, not the ratio); tokens whose ratio left
    ``[1/(1+ε), 1+ε]`` get none. The band is symmetric in log space. Metrics: ``pg_loss``,
    ``pg_clipfrac`` (share of valid tokens outside the band), ``ppo_kl``.
    """

    def __init__(self, epsilon: float = 0.3, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if epsilon <= 0.0:
            raise ValueError(f"policy_loss_fn 'sppo': epsilon must be > 0, got {epsilon}")
        self.epsilon = epsilon

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Masked log-ratio surrogate."""
        low, high = 1.0 / (1.0 + self.epsilon), 1.0 + self.epsilon
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, old_logprob, advantages)
        log_ratio = logprob - old_logprob
        if tm is not None:
            # token-mean: the same arithmetic on float indicators (comparisons written straight
            # into float buffers), one mask count, and -A * inside folded into the mask.
            with torch.no_grad():
                ratio = torch.exp(log_ratio.detach())
                inside = torch.ge(ratio, low, out=torch.empty_like(ratio)).mul_(ratio.le_(high))
                outside = torch.mul(inside, -1.0, out=ratio).add_(1.0)  # 1 - inside
                clipfrac = tm.mean(outside)
                ppo_kl = tm.neg_mean(log_ratio.detach())
                weight = inside.mul_(advantages)
            loss = tm.weighted(weight, log_ratio, negate=True, overwrite=True)
        else:
            with torch.no_grad():
                ratio = torch.exp(log_ratio)
                inside = (ratio >= low) & (ratio <= high)
            pg_losses = -advantages * log_ratio * inside.to(logprob.dtype)
            loss = aggregate_loss(pg_losses, action_mask, self.loss_agg_mode)
            with torch.no_grad():
                clipfrac = masked_mean((~inside).to(logprob.dtype), action_mask)
                ppo_kl = masked_mean(-log_ratio, action_mask)
        return loss, {
            "pg_loss": loss.item(),
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(ppo_kl),
        }


__all__ = ["SPPOPolicyLossFn"]
