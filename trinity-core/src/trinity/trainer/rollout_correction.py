"""Rollout correction: importance weights and rejection between the rollout's and the trainer's log-probs.

The engine samples with its own kernels (and dtype); the trainer scores the same tokens with
its own. :func:`rollout_correction` compares the two per trained token,
``log r_t = old_logprob_t - rollout_logprob_t``, as veRL 0.9's ``rollout_corr_helper`` does
(``algorithm.rollout_correction``, :class:`~trinity.config.sections.algorithm.RolloutCorrectionConfig`):

* ``rollout_is``: importance weights, per token (``r_t``) or per sequence (the product of its
  ``r_t``, on every token of the row), truncated at the threshold or zeroed outside
  ``lower_upper``; optionally normalised to a batch mean of 1;
* ``rollout_rs``: rejection, dropping tokens or whole rows whose statistic of ``log r`` is out of
  bounds (from the loss mask);
* metrics under ``rollout_corr/`` with veRL's names.

:func:`apply_rollout_correction` turns the result into a new batch for the one training step
(:mod:`trinity.trainer.step`), so both back-ends train on it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import masked_mean, masked_sum
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from trinity.config.sections.algorithm import RolloutCorrectionConfig
    from trinity.trainer.batch import TrainBatch
    from trinity.trainer.components import AlgorithmComponents
else:
    torch = lazy_import("torch")

logger = logging.getLogger("trinity.trainer")

#: exp() of a log-ratio beyond this overflows; veRL bounds it the same way.
SAFETY_BOUND = 20.0
_PREFIX = "rollout_corr/"
_warned: set[tuple[int, str]] = set()


def _seq_stat(values: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """``(B,)`` sum, mean or max of ``values`` over each row's masked tokens (0 for an empty row)."""
    if how == "sum":
        return masked_sum(values, mask, axis=-1)
    if how == "mean":
        return masked_mean(values, mask, axis=-1)
    filled = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(filled), torch.zeros_like(filled), filled)


def importance_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, settings: RolloutCorrectionConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(B, T)`` detached weights (0 on padding) and their metrics, for ``settings.rollout_is``."""
    from trinity.config.sections.algorithm import parse_is_threshold

    upper, lower = parse_is_threshold(settings.rollout_is_threshold)
    if settings.rollout_is == "token":
        log_for_metrics = log_ratio[mask.bool()]
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        seq = masked_sum(log_ratio, mask, axis=-1)
        log_for_metrics = seq[mask.sum(-1) > 0]
        raw = torch.exp(seq.clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        keep = (raw >= lower) & (raw <= upper)
        weights = torch.where(keep, raw, torch.zeros_like(raw))
    low = lower if lower is not None else 1.0 / upper
    valid = mask.bool()
    kept = weights[valid]
    metrics = {
        "rollout_is_mean": float(kept.mean()),
        "rollout_is_max": float(kept.max()),
        "rollout_is_min": float(kept.min()),
        # Of the raw ratios (tokens, or rows for sequence weights): what the threshold changed.
        "rollout_is_ratio_fraction_high": float((log_for_metrics > math.log(upper)).float().mean()),
        "rollout_is_ratio_fraction_low": float((log_for_metrics < math.log(low)).float().mean()),
    }
    bounded = weights.clamp(min=low, max=upper)
    normalised = bounded / (masked_mean(bounded, mask) + 1e-8)
    metrics["rollout_is_eff_sample_size"] = float(1.0 / masked_mean(normalised.square(), mask))
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).float(), mask))
    if settings.rollout_is_batch_normalize:
        if settings.rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = mask.sum(-1) > 0
            mean = masked_mean(weights, mask, axis=-1)[rows].mean()
        factor = float(mean)
        if factor > 1e-8:
            weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
    return weights.detach(), metrics


def rejection_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, settings: RolloutCorrectionConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(B, T)`` float mask: 1 where every ``settings.rollout_rs`` option keeps the token, and
    the rejection metrics (over ``mask``)."""
    from trinity.config.sections.algorithm import parse_rs_thresholds

    options = settings.rs_options
    bounds = parse_rs_thresholds(options, settings.rollout_rs_threshold)
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    valid = mask.bool()
    rows = valid.any(-1)
    keep_all = torch.ones_like(mask, dtype=torch.bool)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in zip(options, bounds):
        level, _, kind = option.rpartition("_")
        stat = per_token[kind]
        if level != "token":
            stat = _seq_stat(stat, mask, level.split("_")[1]).unsqueeze(-1).expand_as(lr)
        if kind == "k1":
            # Bounds on the ratio r (or the row's product / geometric mean of r). veRL 0.9.1's code
            # applies them to 1/r instead; the two agree for symmetric bounds (u and 1/u, the default).
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            keep = stat <= upper
        keep_all &= keep
        dropped = (~keep) & valid
        metrics[f"rollout_rs_{option}_masked_fraction"] = float(masked_mean(dropped.float(), mask))
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = float(dropped.any(-1)[rows].float().mean())
    dropped = (~keep_all) & valid
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(dropped.float(), mask))
    metrics["rollout_rs_seq_masked_fraction"] = float(dropped.any(-1)[rows].float().mean())
    return keep_all.to(mask.dtype), metrics


def offpolicy_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """veRL's diagnostics of the gap: ``kl`` (KL(rollout || trainer), direct estimator),
    ``k3_kl``, ``training_ppl`` / ``rollout_ppl`` (mean per-row perplexity), ``log_ppl_diff``,
    ``chi2_token`` (E[r^2] - 1) and ``chi2_seq`` (E[(prod r)^2] - 1)."""
    lr = old - rollout
    rows = mask.sum(-1) > 0
    train_lp = masked_mean(old, mask, axis=-1)[rows]
    roll_lp = masked_mean(rollout, mask, axis=-1)[rows]
    safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq = masked_sum(lr, mask, axis=-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "kl": float(masked_mean(-lr, mask)),
        "k3_kl": float(masked_mean(torch.exp(lr) - lr - 1, mask)),
        "training_ppl": float(torch.exp(-train_lp).mean()),
        "rollout_ppl": float(torch.exp(-roll_lp).mean()),
        "log_ppl_diff": float((roll_lp - train_lp).mean()),
        "chi2_token": float(masked_mean(torch.exp(safe).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq).mean() - 1.0),
    }


def rollout_correction(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    mask: torch.Tensor,
    settings: RolloutCorrectionConfig,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights (``None`` when ``rollout_is`` is null), the loss mask with the
    rejected tokens removed, and the metrics (``rollout_corr/...``), for ``(B, T)`` log-probs of
    the trainer (``old_logprob``) and the engine over the loss mask ``mask``."""
    old = old_logprob.detach().float()
    rollout = rollout_logprob.detach().float().to(old.device)
    mask = mask.to(old.device).float()
    if not mask.any():
        return None, mask, {}
    log_ratio = (old - rollout) * mask
    metrics: dict[str, float] = {}
    weights = None
    if settings.rollout_is is not None:
        weights, is_metrics = importance_weights(log_ratio, mask, settings)
        metrics.update(is_metrics)
    new_mask = mask
    if settings.rollout_rs is not None:
        keep, rs_metrics = rejection_mask(log_ratio, mask, settings)
        new_mask = mask * keep
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(old, rollout, mask))
    return weights, new_mask, {_PREFIX + k: v for k, v in metrics.items()}


def _warn_once(owner: Any, key: str, message: str) -> None:
    if (id(owner), key) not in _warned:
        _warned.add((id(owner), key))
        logger.warning(message)


def apply_rollout_correction(
    batch: TrainBatch, settings: RolloutCorrectionConfig, components: AlgorithmComponents
) -> tuple[TrainBatch, dict[str, float]]:
    """A new batch trained with the correction, and its metrics.

    ``batch`` needs the trainer's ``old_logprob`` (recomputed, not the rollout's) and its
    advantages. Rejected tokens leave ``action_mask``. The weights reach the policy loss as
    ``rollout_is_weights`` when it declares that argument (veRL's convention: it multiplies
    each token's loss); for any other loss they scale ``advantages``, which multiplies each
    token's loss the same way for every loss linear in the token's advantage (PPO with dual
    clip, GSPO, CISPO, REINFORCE: the sign of ``A`` is unchanged by a positive weight). Where
    the experiences carry no rollout log-probs, or the loss reads no advantage (SFT, DPO), it
    warns once and changes nothing of what it cannot apply.
    """
    if not batch.has_rollout_logprobs:
        _warn_once(
            settings,
            "no_logprobs",
            "algorithm.rollout_correction is on, but some experiences of the batch carry no rollout "
            "log-probs (Experience.logprobs), so there is nothing to correct against; those batches "
            "train uncorrected",
        )
        return batch, {}
    if batch.old_logprob is None:
        raise ValueError("rollout correction needs the trainer's old_logprob computed before the update")
    # Expert rows (mix: SFT data in the batch) were never sampled by an engine: neither weighted
    # nor rejected, and not in the metrics.
    expert = batch.expert_mask.bool().to(batch.action_mask.device).unsqueeze(-1)
    rollout_mask = batch.action_mask * ~expert
    weights, new_mask, metrics = rollout_correction(
        batch.old_logprob, batch.rollout_logprobs, rollout_mask, settings
    )
    changes: dict[str, Any] = {}
    if settings.rollout_rs is not None:
        new_mask = torch.where(expert, batch.action_mask.to(new_mask.device).float(), new_mask)
        changes["action_mask"] = new_mask.to(batch.action_mask.dtype)
    if weights is not None:
        weights = torch.where(expert, torch.ones_like(weights), weights.to(batch.action_mask.device))
        if "rollout_is_weights" in components.policy_loss_fn.required_tensors():
            changes["rollout_is_weights"] = weights
        elif batch.advantages is not None:
            changes["advantages"] = batch.advantages * weights.to(batch.advantages.dtype)
        else:
            _warn_once(
                settings,
                "no_advantages",
                f"algorithm.rollout_correction.rollout_is: {components.describe('policy_loss_fn')} reads "
                "no advantages and does not declare rollout_is_weights, so the importance weights are "
                "not applied (rejection, rollout_rs, still is)",
            )
    return (batch.with_(**changes) if changes else batch), metrics


__all__ = [
    "SAFETY_BOUND",
    "apply_rollout_correction",
    "importance_weights",
    "offpolicy_metrics",
    "rejection_mask",
    "rollout_correction",
]
