"""Group-baseline advantages: each task's rollouts (equal ``group_ids``) are compared with each other.

All of them work on outcome rewards (one score per row, see ``outcome_scores``) and write the
per-row advantage on every valid token; ``returns`` equal ``advantages``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    group_logavgexp,
    group_stats,
    outcome_scores,
    output_dtype,
    require,
    set_outcome_advantages,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def _group_metrics(scores: torch.Tensor, n_groups: int) -> dict[str, float]:
    return {
        "reward_mean": float(scores.mean()) if scores.numel() else 0.0,
        "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "group_count": float(n_groups),
    }


class GRPOAdvantageFn(AdvantageFn):
    """GRPO: ``A = (r - mean_group) / (std + epsilon)``, std unbiased.

    A group of one gets mean 0 and std 1 (as veRL). ``std_cal_level="batch"`` keeps the mean per
    group but takes the std over the whole batch (arXiv:2508.08221). With ``std_threshold`` set,
    groups whose std is ``<= std_threshold`` (groups of one included) carry no signal and are
    dropped: their rows get an all-zero ``action_mask`` (so no loss term sees them, whatever the
    aggregation mode) and are counted in ``filtered_count``.
    """

    def __init__(
        self,
        epsilon: float = 1e-6,
        std_cal_level: str = "group",
        std_threshold: float | None = None,
    ) -> None:
        if std_cal_level not in ("group", "batch"):
            raise ValueError(f"grpo: std_cal_level must be 'group' or 'batch', got {std_cal_level!r}")
        self.epsilon = epsilon
        self.std_cal_level = std_cal_level
        self.std_threshold = std_threshold

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask = require(batch, "action_mask", "grpo")
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = outcome_scores(batch, "grpo")
        stats = group_stats(scores, require(batch, "group_ids", "grpo"))
        single = stats.count == 1
        mean = torch.where(single, torch.zeros_like(stats.mean), stats.mean)
        std = torch.where(single, torch.ones_like(stats.std), stats.std)
        if self.std_cal_level == "batch":
            batch_std = (
                scores.std()
                if scores.numel() > 1
                else torch.tensor(1.0, dtype=torch.float64, device=scores.device)
            )
            denom = batch_std.expand(std.shape)
        else:
            denom = std
        advantage = (scores - mean[stats.inverse]) / (denom[stats.inverse] + self.epsilon)
        metrics = _group_metrics(scores, stats.count.shape[0])
        if self.std_threshold is not None:
            # A group of one has no spread at all: it is dropped like a group of equal rewards.
            dropped_group = single | (stats.std <= self.std_threshold)
            keep = ~dropped_group[stats.inverse]
            batch["action_mask"] = mask * keep.unsqueeze(-1).to(mask.dtype)
            advantage = advantage * keep
            metrics["filtered_count"] = float((~keep).sum())
        return set_outcome_advantages(batch, advantage, dtype), metrics


class OPMDAdvantageFn(AdvantageFn):
    """OPMD: ``A = r - b`` per group, with ``b`` the group mean (``opmd_baseline="mean"``) or
    ``tau * (logsumexp(r / tau) - log n)`` (``"logavgexp"``). A group of one gets ``b = 0``."""

    def __init__(self, opmd_baseline: str = "mean", tau: float = 1.0) -> None:
        if opmd_baseline not in ("mean", "logavgexp"):
            raise ValueError(f"opmd: opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}")
        self.opmd_baseline = opmd_baseline
        self.tau = tau

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", "opmd")
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = outcome_scores(batch, "opmd")
        stats = group_stats(scores, require(batch, "group_ids", "opmd"))
        if self.opmd_baseline == "mean":
            baseline = stats.mean
        else:
            baseline = group_logavgexp(scores, stats, self.tau)
        baseline = torch.where(stats.count == 1, torch.zeros_like(baseline), baseline)
        advantage = scores - baseline[stats.inverse]
        return set_outcome_advantages(batch, advantage, dtype), _group_metrics(scores, stats.count.shape[0])


class RLOOAdvantageFn(AdvantageFn):
    """RLOO: ``A_i = r_i - mean_{j != i} r_j`` within the group; a group of one keeps ``A = r``
    (no other rollout to compare with, as veRL)."""

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", "rloo")
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = outcome_scores(batch, "rloo")
        stats = group_stats(scores, require(batch, "group_ids", "rloo"))
        n = stats.row_count
        # mean over the others = (n * mean - r_i) / (n - 1), so A_i = n / (n - 1) * (r_i - mean).
        loo = n / (n - 1).clamp(min=1) * (scores - stats.mean[stats.inverse])
        advantage = torch.where(n > 1, loo, scores)
        return set_outcome_advantages(batch, advantage, dtype), _group_metrics(scores, stats.count.shape[0])


class AsymREAdvantageFn(AdvantageFn):
    """AsymRE: ``A = r - (mean_group + baseline_shift)``; a group of one gets baseline 0.
    A negative shift favours positive examples (asymmetric REINFORCE)."""

    def __init__(self, baseline_shift: float = -0.1) -> None:
        self.baseline_shift = baseline_shift

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", "asymre")
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = outcome_scores(batch, "asymre")
        stats = group_stats(scores, require(batch, "group_ids", "asymre"))
        baseline = torch.where(
            stats.count == 1, torch.zeros_like(stats.mean), stats.mean + self.baseline_shift
        )
        advantage = scores - baseline[stats.inverse]
        return set_outcome_advantages(batch, advantage, dtype), _group_metrics(scores, stats.count.shape[0])


__all__ = ["AsymREAdvantageFn", "GRPOAdvantageFn", "OPMDAdvantageFn", "RLOOAdvantageFn"]
