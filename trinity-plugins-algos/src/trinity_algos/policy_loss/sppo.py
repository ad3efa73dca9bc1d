"""sPPO, token form (arXiv:2108.05828, as cited by Trinity-RFT): a log-ratio surrogate with a hard
trust region."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
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
        log_ratio = logprob - old_logprob
        with torch.no_grad():
            ratio = torch.exp(log_ratio)
            inside = (ratio >= 1.0 / (1.0 + self.epsilon)) & (ratio <= 1.0 + self.epsilon)
        pg_losses = -advantages * log_ratio * inside.to(logprob.dtype)
        loss = aggregate_loss(pg_losses, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            clipfrac = masked_mean((~inside).to(logprob.dtype), action_mask)
            ppo_kl = masked_mean(-log_ratio, action_mask)
        return loss, {
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(ppo_kl),
        }


__all__ = ["SPPOPolicyLossFn"]
