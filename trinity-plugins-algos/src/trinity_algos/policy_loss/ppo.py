"""PPO's clipped surrogate objective with dual clipping (Ye et al., arXiv:1912.09729)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# exp() of a log-ratio beyond this overflows float32 ratios into inf; veRL clamps at the same bound.
LOG_RATIO_CLAMP = 20.0


def resolve_clip_range(
    who: str, clip_range: float | None, low: float | None, high: float | None
) -> tuple[float, float]:
    """``(low, high)`` from explicit bounds, falling back to the symmetric ``clip_range``."""
    low = clip_range if low is None else low
    high = clip_range if high is None else high
    if low is None or high is None:
        raise ValueError(
            f"policy_loss_fn {who!r}: set clip_range, or both clip_range_low and clip_range_high"
        )
    return float(low), float(high)


def ppo_clipped_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    action_mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO loss and its metrics (``pg_loss``, ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``)."""
    log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_max = torch.maximum(loss_unclipped, loss_clipped)
    # Dual clip: for A < 0 the pessimistic bound is capped at -A * c, so a huge ratio on a bad
    # action cannot blow the loss up.
    loss_dual = torch.minimum(-advantages * clip_ratio_c, loss_max)
    negative = advantages < 0
    pg_losses = torch.where(negative, loss_dual, loss_max)
    pg_loss = aggregate_loss(pg_losses, action_mask, loss_agg_mode)
    with torch.no_grad():
        clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(logprob.dtype), action_mask)
        lower = torch.gt(loss_max, -advantages * clip_ratio_c) & negative
        clipfrac_lower = masked_mean(lower.to(logprob.dtype), action_mask)
        ppo_kl = masked_mean(-log_ratio, action_mask)
    return pg_loss, {
        "pg_loss": float(pg_loss.detach()),
        "pg_clipfrac": float(clipfrac),
        "pg_clipfrac_lower": float(clipfrac_lower),
        "ppo_kl": float(ppo_kl),
    }


class PPOPolicyLossFn(PolicyLossFn):
    """PPO: ``max(-A r, -A clip(r, 1 - low, 1 + high))``, capped at ``-A c`` where ``A < 0``.

    ``r = exp(clamp(logprob - old_logprob, -20, 20))``. ``clip_range_low`` / ``clip_range_high``
    override the symmetric ``clip_range`` (DAPO's clip-higher).
    """

    def __init__(
        self,
        clip_range: float | None = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.clip_range_low, self.clip_range_high = resolve_clip_range(
            "ppo", clip_range, clip_range_low, clip_range_high
        )
        if clip_ratio_c <= 1.0:
            raise ValueError(
                f"policy_loss_fn 'ppo': clip_ratio_c must be > 1.0 (dual clip), got {clip_ratio_c}"
            )
        self.clip_ratio_c = clip_ratio_c

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate loss over valid tokens."""
        return ppo_clipped_loss(
            logprob,
            old_logprob,
            action_mask,
            advantages,
            self.clip_range_low,
            self.clip_range_high,
            self.clip_ratio_c,
            self.loss_agg_mode,
        )


__all__ = ["PPOPolicyLossFn", "ppo_clipped_loss", "resolve_clip_range"]
