"""Policy losses built on the importance ratio: plain importance sampling, GSPO (sequence-level)
and CISPO (clipped weight)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import LOG_RATIO_CLAMP, clamp_flagged, resolve_clip_range

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# GSPO's sequence log-ratio is clamped from above only, as veRL does, to keep exp() finite.
GSPO_LOG_RATIO_MAX = 10.0


class ImportanceSamplingPolicyLossFn(PolicyLossFn):
    """Plain importance-sampled policy gradient: ``-A * r``, ``r = exp(clamp(logprob - old_logprob, ±20))``.

    No clipping: the surrogate whose gradient ``-A r ∇logprob`` is the unbiased off-policy
    policy gradient. Trinity-RFT uses it for on-policy distillation (Agarwal et al.,
    arXiv:2306.13649), where ``A`` is the teacher-minus-student log-probability per token.
    Metrics: ``pg_loss``, ``ratio/mean``, ``approx_kl``.
    """

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Importance-weighted surrogate over valid tokens."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, old_logprob, advantages)
        if tm is not None:
            # token-mean: a cheaper clamp backward, one mask count, -A folded into the mask. A NaN
            # loss (NaN inputs) takes the general path, whose clamp backward zeroes NaN tokens.
            log_ratio = clamp_flagged(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            ratio = torch.exp(log_ratio)
            loss = tm.weighted(advantages, ratio, negate=True)
            with torch.no_grad():
                mean_ratio = tm.mean(ratio.detach())
                approx_kl = tm.neg_mean(log_ratio.detach())
            value, mean_ratio, approx_kl = torch.stack((loss.detach(), mean_ratio, approx_kl)).tolist()
            if not math.isnan(value):
                return loss, {"pg_loss": value, "ratio/mean": mean_ratio, "approx_kl": approx_kl}
        log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        loss = aggregate_loss(-advantages * ratio, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            mean_ratio = masked_mean(ratio, action_mask)
            approx_kl = masked_mean(-log_ratio, action_mask)
        return loss, {
            "pg_loss": loss.item(),
            "ratio/mean": float(mean_ratio),
            "approx_kl": float(approx_kl),
        }


class GSPOPolicyLossFn(PolicyLossFn):
    """GSPO (arXiv:2507.18071), token form: every token of a row shares the sequence ratio
    ``s = exp(mean_t(logprob - old_logprob))`` in value, while the gradient flows through each
    token's ``logprob``; the usual clipped surrogate is applied to ``s``.

    The default clip ranges are tiny on purpose (3e-4 / 4e-4): a sequence-level ratio moves far
    less than token ratios do; as in Trinity-RFT, ``clip_range`` only fills a bound set to
    ``None``. Aggregation defaults to ``seq-mean-token-mean``.
    """

    def __init__(
        self,
        clip_range: float | None = None,
        clip_range_low: float | None = 3e-4,
        clip_range_high: float | None = 4e-4,
        loss_agg_mode: str = "seq-mean-token-mean",
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.clip_range_low, self.clip_range_high = resolve_clip_range(
            "gspo", clip_range, clip_range_low, clip_range_high
        )

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate on the sequence-level ratio."""
        log_ratio = logprob - old_logprob
        seq_log_ratio = masked_mean(log_ratio, action_mask, axis=-1)
        token_log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)
        ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))
        loss_unclipped = -advantages * ratio
        loss_clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_range_low, 1.0 + self.clip_range_high)
        pg_losses = torch.maximum(loss_unclipped, loss_clipped)
        pg_loss = aggregate_loss(pg_losses, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(logprob.dtype), action_mask)
            ppo_kl = masked_mean(-log_ratio, action_mask)
            has_tokens = action_mask.to(logprob.dtype).sum(-1) > 0
            ppo_kl_seq = masked_mean(-seq_log_ratio, has_tokens)
        return pg_loss, {
            "pg_loss": pg_loss.item(),
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(ppo_kl),
            "ppo_kl_seq": float(ppo_kl_seq),
        }


class CISPOPolicyLossFn(PolicyLossFn):
    """CISPO (arXiv:2506.13585): ``-sg(clip(r, 1 - low, 1 + high)) * A * logprob``.

    The clipped importance weight is a constant for the gradient, so clipped tokens still get a
    (bounded) gradient, unlike PPO. The paper puts no lower bound on the weight, hence
    ``clip_range_low = 1.0``. With ``enable_mask_clip`` tokens whose ratio leaves
    ``[1 - mask_clip_range_low, 1 + mask_clip_range_high]`` in the direction of their advantage
    are dropped instead (``masked_frac`` reports the share kept).
    """

    def __init__(
        self,
        clip_range_low: float = 1.0,
        clip_range_high: float = 0.28,
        enable_mask_clip: bool = False,
        mask_clip_range_low: float = 1.0,
        mask_clip_range_high: float = 0.28,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
        self.enable_mask_clip = enable_mask_clip
        self.mask_clip_range_low = mask_clip_range_low
        self.mask_clip_range_high = mask_clip_range_high

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss of the stop-gradient clipped-weight policy gradient."""
        log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        with torch.no_grad():
            ratio = torch.exp(log_ratio)
            weight = torch.clamp(ratio, 1.0 - self.clip_range_low, 1.0 + self.clip_range_high)
            keep = torch.ones_like(ratio)
            if self.enable_mask_clip:
                too_high = (ratio > 1.0 + self.mask_clip_range_high) & (advantages > 0)
                too_low = (ratio < 1.0 - self.mask_clip_range_low) & (advantages < 0)
                keep = (~(too_high | too_low)).to(ratio.dtype)
        pg_losses = -advantages * (weight * keep) * logprob
        loss = aggregate_loss(pg_losses, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            clipfrac = masked_mean((ratio != weight).to(logprob.dtype), action_mask)
            ppo_kl = masked_mean(-log_ratio, action_mask)
            masked_frac = masked_mean(keep, action_mask)
        return loss, {
            "cispo_loss": loss.item(),
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(ppo_kl),
            "masked_frac": float(masked_frac),
        }


__all__ = ["CISPOPolicyLossFn", "GSPOPolicyLossFn", "ImportanceSamplingPolicyLossFn"]
