"""KL estimators between the policy and the reference model (Schulman, "Approximating KL").

With ``x = logprob - ref_logprob`` per token: ``k1 = x``, ``k2 = x²/2``, ``k3 = e^{-x} - 1 + x``,
``low_var_kl`` = ``k3`` with ``x`` clamped to ±20 and the result to ±10 (veRL's stable form),
``abs = |x|``. The base class turns each into a loss and a reward penalty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity._lazy import lazy_import
from trinity.algorithm import KLFn
from trinity.algorithm.advantage import Batch
from trinity.algorithm.kl import rewards_to_token_level

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class NoKLFn(KLFn):
    """No KL term: the loss is 0 and the reward is left unchanged (no reference model needed)."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor | None = None) -> torch.Tensor:
        """Zeros shaped like ``logprob``."""
        return torch.zeros_like(logprob)

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor | None,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """A zero loss on ``logprob``'s device and no metrics."""
        return torch.zeros((), dtype=logprob.dtype, device=logprob.device), {}

    def apply_kl_penalty_to_reward(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """``token_level_rewards = token_level_scores``: the rewards, unpenalised.

        Like the base class, scores default to ``token_level_rewards`` if present, else to the
        scalar ``rewards`` on each row's last valid token; no log-probs are needed.
        """
        scores = batch.get("token_level_scores")
        if scores is None:
            scores = batch.get("token_level_rewards")
        if scores is None:
            scores = rewards_to_token_level(batch["rewards"], batch["action_mask"])
        batch["token_level_scores"] = scores
        batch["token_level_rewards"] = scores
        return batch, {}


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
