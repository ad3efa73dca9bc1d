"""The back-end-independent part of a training step: reward shaping and advantages."""

from __future__ import annotations

from typing import Any


def shape_rewards_and_advantages(
    batch: dict[str, Any], kl_penalty_fn: Any, advantage_fn: Any, use_advantage: bool
) -> tuple[dict[str, Any], dict[str, float]]:
    """Apply the KL reward penalty (if any), then the advantage function (if the algorithm uses
    one), as every back-end does before its updates; returns the batch and their metrics."""
    metrics: dict[str, float] = {}
    if kl_penalty_fn is not None:
        batch, kl_metrics = kl_penalty_fn.apply_kl_penalty_to_reward(batch)
        metrics["actor/reward_kl_penalty"] = kl_metrics.get("kl", 0.0)
        metrics["actor/reward_kl_penalty_coeff"] = kl_metrics.get("kl_coef", 0.0)
    if use_advantage:
        batch, adv_metrics = advantage_fn(batch)
        metrics.update({f"advantage/{k}": v for k, v in adv_metrics.items()})
    return batch, metrics
