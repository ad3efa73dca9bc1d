"""KL estimators between the policy and the reference model (Schulman, "Approximating KL").

With ``x = logprob - ref_logprob`` per token: ``k1 = x``, ``k2 = x²/2``, ``k3 = e^{-x} - 1 + x``,
``low_var_kl`` = ``k3`` with ``x`` clamped to ±20 and the result to ±10 (veRL's stable form),
``abs = |x|``, ``corrected_k3`` = ``k3`` times the importance ratio of the current to the
old policy (DeepSeek-V3.2). The base class turns each into a loss and a reward penalty; ``none``
is the core's :class:`~trinity.algorithm.NoKLFn`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trinity.algorithm import KLFn, aggregate_loss

# ``none`` is the core's null component, registered here under that name (see trinity.algorithm).
from trinity.algorithm.kl import NoKLFn
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
        kl = self.calculate_kl(logprob, ref_logprob, old_logprob)
        kl_loss = aggregate_loss(kl, action_mask, loss_agg_mode)
        return kl_loss * self.kl_coef, {"kl_loss": float(kl_loss.detach()), "kl_coef": self.kl_coef}


__all__ = ["AbsKLFn", "CorrectedK3KLFn", "K1KLFn", "K2KLFn", "K3KLFn", "LowVarKLFn", "NoKLFn"]
