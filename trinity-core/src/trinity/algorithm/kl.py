"""Base class of KL estimators, usable as a loss term and as a reward penalty."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.algorithm.advantage import Batch
from trinity.algorithm.component import Component
from trinity.algorithm.masked import aggregate_loss, masked_mean
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class KLFn(Component):
    """A KL estimator between the policy and the reference model.

    Subclasses implement :meth:`calculate_kl` (per token, ``(B, T)``); the base class turns it
    into a loss (:meth:`calculate_kl_loss`) and a reward penalty
    (:meth:`apply_kl_penalty_to_reward`), and runs the adaptive coefficient controller of
    Ziegler et al. (as in veRL's ``AdaptiveKLController``) when ``adaptive`` is set.
    """

    def __init__(
        self,
        kl_coef: float = 0.001,
        adaptive: bool = False,
        target_kl: float | None = None,
        horizon: float | None = None,
    ) -> None:
        if adaptive and (target_kl is None or horizon is None):
            raise ValueError("an adaptive KL controller needs both target_kl and horizon")
        self.kl_coef = kl_coef
        self.adaptive = adaptive
        self.target_kl = target_kl
        self.horizon = horizon

    @abstractmethod
    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token KL estimate ``(B, T)`` from ``logprob`` and ``ref_logprob``."""

    def update_kl_coef(self, current_kl: float, n_steps: int) -> None:
        """Adapt ``kl_coef`` towards ``target_kl`` (no-op unless ``adaptive``)."""
        if not self.adaptive:
            return
        proportional_error = max(min(current_kl / self.target_kl - 1.0, 0.2), -0.2)
        self.kl_coef *= 1.0 + proportional_error * n_steps / self.horizon

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        old_logprob: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``kl_coef * agg(kl)``; metrics ``kl_loss`` (unweighted) and ``kl_coef``.

        ``old_logprob`` (the rollout policy's, always passed by the trainer) is for estimators
        that reweight by the policy ratio (``corrected_k3``); this one ignores it."""
        kl = self.calculate_kl(logprob, ref_logprob)
        kl_loss = aggregate_loss(kl, action_mask, loss_agg_mode)
        return kl_loss * self.kl_coef, {"kl_loss": float(kl_loss.detach()), "kl_coef": self.kl_coef}

    def apply_kl_penalty_to_reward(self, batch: Mapping[str, Any]) -> tuple[Batch, dict[str, float]]:
        """A new ``dict`` of ``batch`` with ``token_level_rewards = token_level_scores - kl_coef
        * kl`` on valid tokens (``batch`` itself is not changed).

        ``token_level_scores`` defaults to ``token_level_rewards`` if present, else to the
        scalar ``rewards`` placed on each row's last valid token. The mean KL per sequence
        drives the adaptive controller.
        """
        mask = batch["action_mask"].to(torch.float32)
        scores = _scores(batch, mask)
        kl = self.calculate_kl(batch["old_logprob"], batch["ref_logprob"]) * mask
        out = {**batch, "token_level_scores": scores, "token_level_rewards": scores - self.kl_coef * kl}
        current_kl = float(masked_mean(masked_mean(kl, mask, axis=-1), mask.any(dim=-1)))
        coef = self.kl_coef
        self.update_kl_coef(current_kl, n_steps=mask.shape[0])
        return out, {"kl": current_kl, "kl_coef": coef}


class NoKLFn(KLFn):
    """What ``kl_loss_fn`` / ``kl_penalty_fn`` ``none`` (or unset) means: no KL term.

    The loss is 0 and the reward is left unchanged; no reference model is needed. The trainer
    skips it (``isinstance(fn, NoKLFn)``) rather than adding zeros. It lives in the core so that
    ``none`` means the same with or without ``trinity-plugins-algos`` (which registers this class
    under that name).
    """

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor | None = None) -> torch.Tensor:
        """Zeros shaped like ``logprob``."""
        return torch.zeros_like(logprob)

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor | None,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        old_logprob: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """A zero loss on ``logprob``'s device and no metrics."""
        return torch.zeros((), dtype=logprob.dtype, device=logprob.device), {}

    def apply_kl_penalty_to_reward(self, batch: Mapping[str, Any]) -> tuple[Batch, dict[str, float]]:
        """A new ``dict`` of ``batch`` with ``token_level_rewards = token_level_scores``: the
        rewards, unpenalised.

        Like the base class, scores default to ``token_level_rewards`` if present, else to the
        scalar ``rewards`` on each row's last valid token; no log-probs are needed.
        """
        scores = _scores(batch, batch["action_mask"])
        return {**batch, "token_level_scores": scores, "token_level_rewards": scores}, {}


def _scores(batch: Mapping[str, Any], mask: torch.Tensor) -> torch.Tensor:
    """``token_level_scores``, else ``token_level_rewards``, else the scalar rewards on each row's
    last valid token of ``mask``: the rewards before any KL penalty."""
    scores = batch.get("token_level_scores")
    if scores is None:
        scores = batch.get("token_level_rewards")
    if scores is None:
        scores = rewards_to_token_level(batch["rewards"], mask)
    return scores


def rewards_to_token_level(rewards: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Place each row's scalar reward on its last valid token; zeros elsewhere."""
    mask = action_mask.to(torch.float32)
    length = mask.shape[-1]
    positions = torch.arange(length, device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=-1).values
    out = torch.zeros_like(mask, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards.to(torch.float32)[rows]
    return out


__all__ = ["KLFn", "NoKLFn", "rewards_to_token_level"]
