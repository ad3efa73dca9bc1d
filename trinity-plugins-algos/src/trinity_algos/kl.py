"""KL estimators between the policy and the reference model (Schulman, "Approximating KL").

With ``x = logprob - ref_logprob`` per token: ``k1 = x``, ``k2 = x²/2``, ``k3 = e^{-x} - 1 + x``,
``low_var_kl`` = ``k3`` with ``x`` clamped to ±20 and the result to ±10 (veRL's stable form),
``abs = |x|``. The base class turns each into a loss and a reward penalty; ``none`` is the
core's :class:`~trinity.algorithm.NoKLFn`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm import KLFn

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


__all__ = ["AbsKLFn", "K1KLFn", "K2KLFn", "K3KLFn", "LowVarKLFn", "NoKLFn"]
