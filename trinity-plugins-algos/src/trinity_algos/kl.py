"""KL estimators between the policy and the reference model (Schulman, "Approximating KL").

With ``x = logprob - ref_logprob`` per token: ``k1 = x``, ``k2 = x²/2``, ``k3 = e^{-x} - 1 + x``,
``low_var_kl`` = ``k3`` with ``x`` clamped to ±20 and the result to ±10 (veRL's stable form),
``abs = |x|``, ``corrected_k3`` = ``k3`` times the importance ratio of the current to the
old policy (DeepSeek-V3.2). The base class turns each into a loss and a reward penalty; ``none``
is the core's :class:`~trinity.algorithm.NoKLFn`.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import KLFn, aggregate_loss

# ``none`` is the core's null component, registered here under that name (see trinity.algorithm).
from trinity.algorithm.kl import NoKLFn
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class K1KLFn(KLFn):
    """``k1 = logprob - ref_logprob``: unbiased, high variance, can be negative."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token ``x``."""
        return logprob - ref_logprob


class K2KLFn(KLFn):
    """``k2 = (logprob - ref_logprob)² / 2``: biased, low variance, its gradient is the KL's."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token ``x² / 2``."""
        return 0.5 * (logprob - ref_logprob).square()


class K3KLFn(KLFn):
    """``k3 = e^{-x} - 1 + x``: unbiased and always ≥ 0."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token ``exp(ref - logprob) - 1 - (ref - logprob)``."""
        log_r = ref_logprob - logprob
        return torch.exp(log_r) - 1.0 - log_r


class LowVarKLFn(KLFn):
    """``k3`` with the log-ratio clamped to ±20 and the estimate to ±10, as veRL's ``low_var_kl``."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Clamped per-token ``k3``."""
        log_r = torch.clamp(ref_logprob - logprob, -20.0, 20.0)
        return torch.clamp(torch.exp(log_r) - 1.0 - log_r, -10.0, 10.0)


class AbsKLFn(KLFn):
    """``|logprob - ref_logprob|``."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token ``|x|``."""
        return (logprob - ref_logprob).abs()


# Upper bound of corrected_k3's importance ratio (Trinity-RFT's), applied to the log-ratio so that
# a huge ratio cannot overflow to inf (whose gradient would be NaN).
CORRECTED_K3_MAX_LOG_RATIO = math.log(2.0)


class CorrectedK3KLFn(KLFn):
    """``r * k3`` with the importance ratio ``r = π/π_old = exp(logprob - old_logprob)``, clipped
    to ``[0, 2]`` (DeepSeek-V3.2, arXiv:2512.02556, "unbiased KL estimate").

    ``k3`` estimates ``KL(π || π_ref)`` only for tokens sampled from ``π``; the batch was sampled
    from ``π_old``, so once ``π ≠ π_old`` (later micro-steps, off-policy data) plain ``k3`` and its
    gradient are biased. Weighting by ``r`` (which carries gradient, as in the paper) gives
    ``E_old[r * k3] = KL(π || π_ref)`` exactly, so value and gradient are unbiased up to the clip. Without ``old_logprob`` it is ``k3``: that is the case for the reward
    penalty, computed with ``logprob = old_logprob``, and for a trainer that does not pass
    ``old_logprob`` to :meth:`calculate_kl_loss`.
    """

    def calculate_kl(
        self, logprob: torch.Tensor, ref_logprob: torch.Tensor, old_logprob: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-token ``clip(r, 0, 2) * k3``, or ``k3`` without ``old_logprob``."""
        log_r = ref_logprob - logprob
        k3 = torch.exp(log_r) - 1.0 - log_r
        if old_logprob is None:
            return k3
        ratio = torch.exp(torch.clamp(logprob - old_logprob, max=CORRECTED_K3_MAX_LOG_RATIO))
        return ratio * k3

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        old_logprob: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``kl_coef * agg(r * k3)``; metrics ``kl_loss`` (unweighted) and ``kl_coef``."""
        tm = None
        if old_logprob is not None:
            tm = token_mean_for(loss_agg_mode, action_mask, logprob, ref_logprob, old_logprob)
        if tm is not None:
            # token-mean: one fused node whose backward replays autograd's arithmetic for the
            # general path in a few buffers (value and gradient bit for bit the same).
            kl_loss = _corrected_k3_token_mean().apply(
                logprob, ref_logprob.detach(), old_logprob.detach(), tm.mask, tm.denominator
            )
        else:
            kl = self.calculate_kl(logprob, ref_logprob, old_logprob)
            kl_loss = aggregate_loss(kl, action_mask, loss_agg_mode)
        return kl_loss * self.kl_coef, {"kl_loss": kl_loss.item(), "kl_coef": self.kl_coef}


@functools.cache
def _corrected_k3_token_mean() -> Any:
    """``token-mean`` of :class:`CorrectedK3KLFn`'s per-token ``r * k3`` as one autograd node.

    Forward: ``sum(r * k3 * mask) / n`` with ``k3 = (exp(log_r) - 1) - log_r``, ``log_r = ref -
    logprob``, ``r = exp(min(logprob - old, log 2))``. Backward, in autograd's order for that
    expression: with ``g = mask * grad / n``, ``t = g * r``,
    ``d logprob = -((t * e) - t) + ((g * k3) * r) * [logprob - old <= log 2]``.
    """
    from torch.autograd.function import once_differentiable

    class CorrectedK3TokenMean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logprob, ref_logprob, old_logprob, mask, denominator):  # type: ignore[override]
            log_r = ref_logprob - logprob
            e = torch.exp(log_r)
            k3 = torch.sub(e, 1.0).sub_(log_r)
            x = torch.sub(logprob, old_logprob, out=log_r)
            passed = torch.le(x, CORRECTED_K3_MAX_LOG_RATIO, out=torch.empty_like(x))
            ratio = x.clamp_(max=CORRECTED_K3_MAX_LOG_RATIO).exp_()
            ctx.save_for_backward(e, k3, ratio, passed, mask, denominator)
            return torch.mul(ratio, k3).mul_(mask).sum() / denominator

        @staticmethod
        @once_differentiable
        def backward(ctx, grad):  # type: ignore[override]
            e, k3, ratio, passed, mask, denominator = ctx.saved_tensors
            g = torch.mul(mask, grad / denominator)
            t = g * ratio
            through_k3 = torch.mul(t, e).sub_(t).neg_()
            through_ratio = g.mul_(k3).mul_(ratio).mul_(passed)
            return through_k3.add_(through_ratio), None, None, None, None

    return CorrectedK3TokenMean


__all__ = ["AbsKLFn", "CorrectedK3KLFn", "K1KLFn", "K2KLFn", "K3KLFn", "LowVarKLFn", "NoKLFn"]
