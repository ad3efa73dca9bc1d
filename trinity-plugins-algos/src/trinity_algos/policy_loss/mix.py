"""MIX: PPO on the policy's own rollouts plus SFT on expert rows, in one loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import ppo_clipped_loss, resolve_clip_range
from trinity_algos.policy_loss.sft import SFTLossFn

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class MIXPolicyLossFn(PolicyLossFn):
    """``(1 - mu) * PPO(rows with expert_mask False) + mu * SFT(rows with expert_mask True)``.

    ``expert_mask (B,)`` is built by the trainer from ``info["is_expert"]``, which the ``mix``
    sample strategy sets. A part with no rows contributes 0. Each part is aggregated over its own
    rows (``loss_agg_mode`` for PPO, ``sft_loss_agg_mode`` for SFT); metrics are prefixed
    ``usual/`` and ``expert/``.
    """

    def __init__(
        self,
        mu: float = 0.1,
        clip_range: float | None = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        loss_agg_mode: str = "token-mean",
        sft_loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"policy_loss_fn 'mix': mu must be in [0, 1], got {mu}")
        self.mu = mu
        self.clip_range_low, self.clip_range_high = resolve_clip_range(
            "mix", clip_range, clip_range_low, clip_range_high
        )
        self.clip_ratio_c = clip_ratio_c
        self.sft_loss = SFTLossFn(loss_agg_mode=sft_loss_agg_mode)

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted sum of the PPO loss on usual rows and the SFT loss on expert rows."""
        if expert_mask is None:
            expert_mask = torch.zeros(logprob.shape[0], dtype=torch.bool, device=logprob.device)
        expert_mask = expert_mask.to(torch.bool).reshape(-1)
        if expert_mask.shape[0] != logprob.shape[0]:
            raise ValueError(
                f"policy_loss_fn 'mix': expert_mask has {expert_mask.shape[0]} rows, logprob has {logprob.shape[0]}"
            )
        usual = ~expert_mask
        zero = logprob.sum() * 0.0  # keeps the graph (and device) when a part is empty
        metrics: dict[str, float] = {}
        if bool(usual.any()):
            ppo_loss, ppo_metrics = ppo_clipped_loss(
                logprob[usual],
                old_logprob[usual],
                action_mask[usual],
                advantages[usual],
                self.clip_range_low,
                self.clip_range_high,
                self.clip_ratio_c,
                self.loss_agg_mode,
            )
            metrics.update({f"usual/{k}": v for k, v in ppo_metrics.items()})
        else:
            ppo_loss = zero
        if bool(expert_mask.any()):
            sft_loss, sft_metrics = self.sft_loss(logprob[expert_mask], action_mask[expert_mask])
            metrics.update({f"expert/{k}": v for k, v in sft_metrics.items()})
        else:
            sft_loss = zero
        loss = (1.0 - self.mu) * ppo_loss + self.mu * sft_loss
        metrics["loss"] = float(loss.detach())
        metrics["expert_fraction"] = (
            float(expert_mask.to(torch.float32).mean()) if expert_mask.numel() else 0.0
        )
        return loss, metrics


__all__ = ["MIXPolicyLossFn"]
