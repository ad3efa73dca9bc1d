"""M2PO: second-moment trust policy optimisation (Zheng et al., ICLR 2026,
https://openreview.net/forum?id=IIgl5MWelz), for training on stale rollouts.

The loss is the plain importance-sampled policy gradient ``-A * r`` with ``r = π_θ / π_behaviour``,
but instead of PPO's clip M2PO masks tokens: among the tokens where PPO's clip could act (``A > 0``
and ``r > 1``, or ``A < 0`` and ``r < 1``: the *trust-region* tokens), it drops those with the
largest second moment ``M2 = (log r)²`` until the mean M2 of the trust-region tokens left is at
most ``m2_threshold`` (the paper's Algorithm 1). Every other token keeps its full update.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, masked_mean
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def m2po_select(
    log_ratio: torch.Tensor, action_mask: torch.Tensor, advantages: torch.Tensor, m2_threshold: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Algorithm 1 of the M2PO paper over every token given: the boolean ``(B, T)`` mask of the
    tokens that keep their update, and the selection's statistics.

    The tokens it may drop are the trust-region tokens (valid, and ``A > 0, log r > 0`` or
    ``A < 0, log r < 0``). Dropping the largest ``(log r)²`` one at a time until the mean of the
    rest is ``<= m2_threshold`` keeps exactly the longest prefix of the ascending sort whose mean is
    within the threshold (prefix means of an ascending sequence never decrease), so one sort and a
    cumulative sum give the same mask; ties keep the earlier token (row-major order).

    Statistics (all 0 when there are no valid tokens): ``m2_before`` / ``m2_after``, the trust-region
    tokens' mean M2 before and after the selection; ``masked_fraction`` and
    ``trust_region_fraction``, the dropped and the trust-region tokens as fractions of the valid
    ones.
    """
    valid = action_mask.bool()
    with torch.no_grad():
        lr = log_ratio.detach()
        adv = advantages.detach()
        # At least float32 (bf16 squares lose the ordering); float64 inputs stay float64.
        m2 = lr.to(torch.promote_types(lr.dtype, torch.float32)).square()
        trust = valid & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
        trust_idx = trust.reshape(-1).nonzero().squeeze(-1)
        values = m2.reshape(-1)[trust_idx]
        n_trust = int(values.numel())
        before = float(values.double().mean()) if n_trust else 0.0
        keep = valid.clone()
        after = before
        if n_trust and before > m2_threshold:
            ordered, order = torch.sort(values, stable=True)
            counts = torch.arange(1, n_trust + 1, device=values.device, dtype=torch.float64)
            prefix_means = torch.cumsum(ordered.double(), 0) / counts
            n_keep = int((prefix_means <= m2_threshold).sum())
            keep.reshape(-1)[trust_idx[order[n_keep:]]] = False
            after = float(prefix_means[n_keep - 1]) if n_keep else 0.0
        n_valid = int(valid.sum())
        n_dropped = n_trust - int((keep & trust).sum())
    stats = {
        "m2_before": before,
        "m2_after": after,
        "masked_fraction": n_dropped / n_valid if n_valid else 0.0,
        "trust_region_fraction": n_trust / n_valid if n_valid else 0.0,
    }
    return keep, stats


def _selection_stats(
    log_ratio: torch.Tensor, action_mask: torch.Tensor, advantages: torch.Tensor, keep: torch.Tensor
) -> dict[str, float]:
    """:func:`m2po_select`'s statistics for a mask chosen elsewhere (``m2po_mask``)."""
    valid = action_mask.bool()
    with torch.no_grad():
        lr, adv = log_ratio.detach(), advantages.detach()
        m2 = lr.to(torch.promote_types(lr.dtype, torch.float32)).square().double()
        trust = valid & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
        kept = trust & keep
        n_valid, n_trust, n_kept = int(valid.sum()), int(trust.sum()), int(kept.sum())
        n_dropped = int((valid & ~keep).sum())
        return {
            "m2_before": float(m2[trust].mean()) if n_trust else 0.0,
            "m2_after": float(m2[kept].mean()) if n_kept else 0.0,
            "masked_fraction": n_dropped / n_valid if n_valid else 0.0,
            "trust_region_fraction": n_trust / n_valid if n_valid else 0.0,
        }


class M2POPolicyLossFn(PolicyLossFn):
    """M2PO: ``-A * r`` on the tokens :func:`m2po_select` keeps, averaged over *all* valid tokens
    (the paper's footnote 2: dropped tokens still count in the denominator), with
    ``r = exp(clamp(logprob - old_logprob, ±log_ratio_clip))``.

    ``old_logprob`` must be the behaviour policy's (the rollout's log-probs:
    ``trainer.use_rollout_logprobs: true``, which the ``m2po`` algorithm type requires); against
    the recomputed pre-update policy the ratio measures nothing stale.

    The clamp only keeps ``exp`` finite: its gradient passes straight through (a token at
    ``log r = 25`` still gets ``-A * e^20``, not 0), as in Trinity-RFT 0.6. The selection is made
    over the tensors of each call; a back-end (or a plugin adding a batch key) that selected over
    a larger batch passes the boolean ``m2po_mask`` (Trinity-RFT's name), which is then used as
    given. Only ``token-mean`` aggregation (the paper's denominator).

    Metrics: ``pg_loss``, ``ppo_kl`` (mean ``-log r`` after the clamp), ``ratio/mean``, and the
    selection's ``m2po/m2_before``, ``m2po/m2_after``, ``m2po/masked_fraction``,
    ``m2po/trust_region_fraction``.
    """

    def __init__(
        self, m2_threshold: float = 0.04, loss_agg_mode: str = "token-mean", log_ratio_clip: float = 20.0
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if not math.isfinite(m2_threshold) or m2_threshold < 0:
            raise ValueError(
                f"policy_loss_fn 'm2po': m2_threshold must be finite and >= 0, got {m2_threshold}"
            )
        if not math.isfinite(log_ratio_clip) or log_ratio_clip <= 0:
            raise ValueError(
                f"policy_loss_fn 'm2po': log_ratio_clip must be finite and > 0, got {log_ratio_clip}"
            )
        if loss_agg_mode != "token-mean":
            raise ValueError(
                f"policy_loss_fn 'm2po' averages over all valid tokens (token-mean), got loss_agg_mode "
                f"{loss_agg_mode!r}; set algorithm.loss_agg_mode: token-mean"
            )
        self.m2_threshold = float(m2_threshold)
        self.log_ratio_clip = float(log_ratio_clip)

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        m2po_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The masked surrogate and its metrics (see the class docstring)."""
        valid = action_mask.bool()
        # Padding may hold -inf log-probs: keep it out of the ratio so no NaN reaches the gradient.
        log_ratio = torch.where(valid, logprob - old_logprob, torch.zeros_like(logprob))
        bad = int((~torch.isfinite(log_ratio.detach())).sum())
        if bad:
            raise ValueError(
                f"policy_loss_fn 'm2po': {bad} trained token(s) have a non-finite log-ratio "
                "(logprob - old_logprob); check the rollout's log-probs"
            )
        if m2po_mask is None:
            keep, stats = m2po_select(log_ratio, action_mask, advantages, self.m2_threshold)
        else:
            if m2po_mask.shape != logprob.shape:
                raise ValueError(
                    f"policy_loss_fn 'm2po': m2po_mask has shape {tuple(m2po_mask.shape)}, "
                    f"expected {tuple(logprob.shape)}"
                )
            keep = m2po_mask.bool()
            if bool((keep & ~valid).any()):
                raise ValueError("policy_loss_fn 'm2po': m2po_mask selects tokens outside action_mask")
            stats = _selection_stats(log_ratio, action_mask, advantages, keep)
        clamped = torch.clamp(log_ratio, -self.log_ratio_clip, self.log_ratio_clip)
        # Forward value of the clamp, gradient of the identity (a straight-through clamp).
        stable = log_ratio + (clamped - log_ratio).detach()
        ratio = torch.exp(stable)
        token_loss = torch.where(keep, -advantages * ratio, torch.zeros_like(ratio))
        loss = masked_mean(token_loss, action_mask)
        with torch.no_grad():
            ppo_kl = masked_mean(-clamped.detach(), action_mask)
            ratio_mean = masked_mean(ratio.detach(), action_mask)
        metrics = {"pg_loss": float(loss.detach()), "ppo_kl": float(ppo_kl), "ratio/mean": float(ratio_mean)}
        metrics.update({f"m2po/{k}": v for k, v in stats.items()})
        return loss, metrics


__all__ = ["M2POPolicyLossFn", "m2po_select"]
