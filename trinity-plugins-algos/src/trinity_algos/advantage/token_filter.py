"""GRPO with entropy-aware token filtering: ``clipb`` and ``clipv``.

From "On the Entropy Dynamics in Reinforcement Fine-Tuning of Large Language Models"
(arXiv:2602.03392). A policy-gradient step of size ``eta`` on a sampled token with advantage ``A``
changes the entropy at that position by about ``eta * A * (N - S)``, with ``S = p (H + log p)``
(``p`` the token's probability, ``H`` the entropy there) and ``N = H sum_v p_v^2 +
sum_v p_v^2 log p_v`` its expectation under the policy. A negative-advantage token with
``N - S`` far above its usual spread therefore collapses the entropy; both functions take such
tokens out of the loss by zeroing their ``action_mask`` (upstream: ``response_mask``), after
computing the veRL form of the GRPO advantage (``grpo_verl``: ``token_level_rewards`` summed over
the row, else ``rewards``). Positive- and zero-advantage tokens are always kept. ``p``, ``H`` (and
``N``) come from the policy before the update: ``old_logprob``, ``old_entropy`` (and ``old_nec``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    broadcast,
    group_stats,
    outcome_scores,
    output_dtype,
    require,
)
from trinity_algos.advantage.group import grpo_normalize

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# Below this spread the signal is flat: nothing is clipped (upstream's threshold).
_FLAT_STD = 1e-12


def _grpo_tokens(batch: Batch, who: str, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per_row, valid)``: the ``grpo_verl`` advantage of each row (float64) and the boolean
    mask of valid tokens."""
    mask = require(batch, "action_mask", who)
    scores = outcome_scores(batch, who)
    stats = group_stats(scores, require(batch, "group_ids", who))
    return grpo_normalize(scores, stats, epsilon), mask != 0


def _entropy_signal(batch: Batch, who: str, valid: torch.Tensor) -> torch.Tensor:
    """``S = exp(old_logprob) * (old_entropy + old_logprob)`` (float64), 0 off the mask."""
    logprob = require(batch, "old_logprob", who).detach().to(torch.float64)
    entropy = require(batch, "old_entropy", who).detach().to(torch.float64)
    signal = torch.exp(logprob) * (entropy + logprob)
    return torch.where(valid, signal, torch.zeros_like(signal))


def _masked_moments(x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance of ``x`` over the valid tokens of the whole batch."""
    n = valid.sum().clamp(min=1)
    mean = x.sum() / n
    var = torch.where(valid, (x - mean) ** 2, torch.zeros_like(x)).sum() / n
    return mean, var


def _apply_clip(
    batch: Batch, per_row: torch.Tensor, valid: torch.Tensor, clipped: torch.Tensor
) -> dict[str, float]:
    """Zero ``action_mask`` on ``clipped`` tokens and write advantages = returns on the rest;
    returns the clipped fractions (of all, positive- and negative-advantage valid tokens)."""
    mask = batch["action_mask"]
    dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
    kept = (~clipped).to(mask.dtype)
    batch["action_mask"] = mask * kept
    advantages = broadcast(per_row, batch["action_mask"], dtype)
    batch["advantages"] = advantages
    batch["returns"] = advantages.clone()

    def fraction(tokens: torch.Tensor) -> float:
        return float((clipped & tokens).sum()) / max(float(tokens.sum()), 1.0)

    sign = per_row.unsqueeze(-1)
    return {
        "frac_clipped": fraction(valid),
        "frac_clipped_pos": fraction(valid & (sign > 0)),
        "frac_clipped_neg": fraction(valid & (sign < 0)),
    }


class ClipBAdvantageFn(AdvantageFn):
    """Clip_B (arXiv:2602.03392): the ``grpo_verl`` advantage, then a batch-normalised one-sided clip.

    With ``S = exp(old_logprob) (old_entropy + old_logprob)``, ``E_S`` and ``std_S`` its mean and
    population std over the batch's valid tokens (``E_S`` standing in for ``N``): a token of a
    negative-advantage row is dropped from ``action_mask`` when ``S - E_S < -mu * std_S``. Nothing is dropped when ``std_S < 1e-12``.
    Metrics: ``frac_clipped`` (``_pos``, ``_neg``), ``ES``, ``varS``.
    """

    required_inputs: ClassVar[tuple[str, ...]] = ("old_logprob", "old_entropy")

    def __init__(self, epsilon: float = 1e-6, mu: float = 2.5) -> None:
        self.epsilon = epsilon
        self.mu = mu

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "clipb"
        per_row, valid = _grpo_tokens(batch, who, self.epsilon)
        signal = _entropy_signal(batch, who, valid)
        mean, var = _masked_moments(signal, valid)
        std = var.sqrt()
        if float(std) < _FLAT_STD:
            clipped = torch.zeros_like(valid)
        else:
            negative = (per_row < 0).unsqueeze(-1)
            clipped = valid & negative & (signal - mean < -self.mu * std)
        metrics = _apply_clip(batch, per_row, valid, clipped)
        metrics.update({"ES": float(mean), "varS": float(var)})
        return batch, metrics


class ClipVAdvantageFn(AdvantageFn):
    """Clip_V (arXiv:2602.03392): the ``grpo_verl`` advantage, then a one-sided clip on the
    centred signal ``D = N - S`` with a cap on how many tokens go.

    ``S = p (H + log p)`` from ``old_logprob`` / ``old_entropy``; ``N = H sum_v p_v^2 +
    sum_v p_v^2 log p_v`` is ``S``'s expectation under the policy, which needs the full
    distribution: the back-end supplies it as ``old_nec (B, T)``. With ``std_D`` the population
    std of ``D`` over the valid tokens, the candidates are the valid tokens of negative-advantage
    rows with ``D > mu * std_D``. If they are at most a ``max_frac`` fraction of the valid tokens
    they are all dropped from ``action_mask``; otherwise only the ``max(int(max_frac * n_valid), 1)``
    with the largest ``D``. Nothing is dropped when ``std_D < 1e-12``. Metrics:
    ``frac_clipped`` (``_pos``, ``_neg``), ``stdD``.
    """

    required_inputs: ClassVar[tuple[str, ...]] = ("old_logprob", "old_entropy", "old_nec")

    def __init__(self, epsilon: float = 1e-6, mu: float = 8.5, max_frac: float = 1e-4) -> None:
        self.epsilon = epsilon
        self.mu = mu
        self.max_frac = max_frac

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "clipv"
        per_row, valid = _grpo_tokens(batch, who, self.epsilon)
        signal = _entropy_signal(batch, who, valid)
        nec = require(batch, "old_nec", who).detach().to(torch.float64)
        deviation = torch.where(valid, nec - signal, torch.zeros_like(signal))
        _, var = _masked_moments(deviation, valid)
        std = var.sqrt()
        clipped = torch.zeros_like(valid)
        if float(std) >= _FLAT_STD:
            negative = (per_row < 0).unsqueeze(-1)
            candidates = valid & negative & (deviation > self.mu * std)
            n_candidates = int(candidates.sum())
            n_valid = max(float(valid.sum()), 1.0)
            cap = max(int(self.max_frac * n_valid), 1)
            if n_candidates / n_valid <= self.max_frac or n_candidates <= cap:
                clipped = candidates
            else:
                # Only the `cap` most extreme candidates go.
                scores = deviation.masked_fill(~candidates, float("-inf")).flatten()
                top = torch.topk(scores, cap).indices
                clipped = torch.zeros_like(valid).flatten()
                clipped[top] = True
                clipped = clipped.view_as(valid)
        metrics = _apply_clip(batch, per_row, valid, clipped)
        metrics["stdD"] = float(std)
        return batch, metrics


__all__ = ["ClipBAdvantageFn", "ClipVAdvantageFn"]
