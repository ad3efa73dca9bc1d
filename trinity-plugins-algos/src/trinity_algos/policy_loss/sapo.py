"""SAPO: Soft Adaptive Policy Optimization (Gao et al., arXiv:2511.20347)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import LOG_RATIO_CLAMP, clamp_flagged

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class SAPOPolicyLossFn(PolicyLossFn):
    """SAPO: ``-A * f(r)`` with the soft gate ``f(r) = σ(τ (r - 1)) * 4 / τ``, ``τ = tau_pos`` where
    ``A > 0`` else ``tau_neg``, ``r = exp(clamp(logprob - old_logprob, ±20))``.

    The gradient flows through ``r``: ``∇ = -A * w(r) * r * ∇logprob`` with
    ``w = 4 σ (1 - σ)``, which is 1 on-policy (``r = 1``, the plain policy gradient) and fades
    smoothly as ``r`` leaves 1, faster for negative advantages (``tau_neg > tau_pos``): a soft
    trust region instead of PPO's hard clip. The paper averages per sequence
    (``seq-mean-token-mean``); the default here is Trinity-RFT's ``token-mean``. Metrics:
    ``sapo_loss``, ``ppo_kl``, ``avg_soft_gate``, ``avg_ratio``, ``pos_adv_frac``.
    """

    def __init__(
        self, tau_pos: float = 1.0, tau_neg: float = 1.05, loss_agg_mode: str = "token-mean"
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if tau_pos <= 0.0 or tau_neg <= 0.0:
            raise ValueError(
                f"policy_loss_fn 'sapo': tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}"
            )
        if tau_neg < tau_pos:
            raise ValueError(
                f"policy_loss_fn 'sapo': tau_neg ({tau_neg}) must be >= tau_pos ({tau_pos}); the paper "
                "damps negative-advantage updates more, for stability"
            )
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Soft-gated surrogate over valid tokens."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, old_logprob, advantages)
        if tm is None:
            return self._general(logprob, old_logprob, action_mask, advantages)
        # token-mean: the general path's arithmetic with a cheaper clamp backward, tau picked by a
        # float flag instead of ``where``, one mask count, and -A folded into the mask.
        log_ratio = clamp_flagged(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        with torch.no_grad():
            positive = torch.gt(advantages, 0.0, out=torch.empty_like(advantages))
            pos_frac = tm.mean(positive)
            # lerp with a 0/1 weight returns exactly one end: tau_neg where A <= 0, tau_pos where A > 0.
            tau = torch.lerp(ratio.new_tensor(self.tau_neg), ratio.new_tensor(self.tau_pos), positive)
            scale = torch.reciprocal(tau).mul_(4.0)  # 4.0 / tau, as Tensor.__rtruediv__ computes it
        gate = torch.sigmoid(tau * (ratio - 1.0)) * scale
        loss = tm.weighted(advantages, gate, negate=True)
        with torch.no_grad():
            ppo_kl = tm.neg_mean(log_ratio.detach())
            avg_gate = tm.mean(gate.detach())
            avg_ratio = tm.mean(ratio.detach())
        values = torch.stack((loss.detach(), ppo_kl, avg_gate, avg_ratio, pos_frac)).tolist()
        if math.isnan(values[0]):  # NaN inputs: the general path's clamp backward zeroes NaN tokens
            return self._general(logprob, old_logprob, action_mask, advantages)
        names = ("sapo_loss", "ppo_kl", "avg_soft_gate", "avg_ratio", "pos_adv_frac")
        return loss, dict(zip(names, values))

    def _general(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        tau = torch.where(
            advantages > 0, ratio.new_tensor(self.tau_pos), ratio.new_tensor(self.tau_neg)
        ).detach()
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        loss = aggregate_loss(-advantages * gate, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            ppo_kl = masked_mean(-log_ratio, action_mask)
            avg_gate = masked_mean(gate, action_mask)
            avg_ratio = masked_mean(ratio, action_mask)
            pos_frac = masked_mean((advantages > 0).to(logprob.dtype), action_mask)
        return loss, {
            "sapo_loss": loss.item(),
            "ppo_kl": float(ppo_kl),
            "avg_soft_gate": float(avg_gate),
            "avg_ratio": float(avg_ratio),
            "pos_adv_frac": float(pos_frac),
        }


__all__ = ["SAPOPolicyLossFn"]
