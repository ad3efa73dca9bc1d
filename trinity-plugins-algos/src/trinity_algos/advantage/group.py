"""Group-baseline advantages: each task's rollouts (equal ``group_ids``) are compared with each other.

All of them work on outcome rewards (one score per row) and write the per-row advantage on every
valid token; ``returns`` equal ``advantages``. ``grpo``, ``opmd`` and ``asymre`` are upstream's
grouped forms and score a row by its scalar ``rewards`` (see ``scalar_rewards``); their ``*_verl``
twins (``verl.py``) and ``rloo`` sum ``token_level_rewards`` when present (``outcome_scores``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    GroupStats,
    copy_rows,
    group_logavgexp,
    group_stats,
    outcome_scores,
    output_dtype,
    require,
    scalar_rewards,
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


def grpo_normalize(
    scores: torch.Tensor, stats: GroupStats, epsilon: float, batch_std: torch.Tensor | None = None
) -> torch.Tensor:
    """``(r - mean_group) / (std + epsilon)`` per row (float64); a group of one gets mean 0 and
    std 1. With ``batch_std`` (a scalar) it replaces every group's std, singletons included."""
    single = stats.count == 1
    mean = torch.where(single, torch.zeros_like(stats.mean), stats.mean)
    std = torch.where(single, torch.ones_like(stats.std), stats.std)
    denom = std if batch_std is None else batch_std.expand(std.shape)
    return (scores - mean[stats.inverse]) / (denom[stats.inverse] + epsilon)


def unbiased_std_or_one(values: torch.Tensor) -> torch.Tensor:
    """The unbiased std of ``values`` (float64 scalar), or 1 when there are fewer than two."""
    if values.numel() > 1:
        return values.to(torch.float64).std()
    return torch.tensor(1.0, dtype=torch.float64, device=values.device)


class GRPOAdvantageFn(AdvantageFn):
    """GRPO (Shao et al., arXiv:2402.03300): ``A = (r - mean_group) / (std_group + epsilon)``.

    ``r`` is the scalar ``rewards`` (``Experience.reward``; ``grpo_verl`` is the form that reads
    ``token_level_rewards``). Std is unbiased, statistics float64. A group of one gets mean 0 and
    std 1.

    - ``std_cal_level="batch"``: the mean stays per group, the std is taken over the whole batch's
      rewards (arXiv:2508.08221).
    - ``std_threshold``: groups whose std is ``<= std_threshold`` (groups of one included) carry
      no signal and are dropped: their rows get an all-zero ``action_mask`` (so no loss term sees
      them, whatever the aggregation mode), counted in ``filtered_count``.
    - ``duplicate_experiences`` (with ``std_threshold``; POLARIS, hkunlp.github.io/blog/2025/Polaris):
      each dropped group is overwritten, row for row, with a copy of a valid group drawn at random
      (every per-row tensor and ``info``; a smaller source group is cycled), so the batch keeps
      its size and its count of informative samples.
    - ``rank_penalty`` (unlikeliness reward, He et al., arXiv:2506.02355): within a group of
      ``n``, with ``k`` the rank of a row's mean rollout log-prob (0 = least likely),
      ``r <- r * (1 - rank_penalty * k / n)``; the penalised rewards are then normalised as above.
      Needs real ``rollout_logprobs``.
    """

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    _name: ClassVar[str] = "grpo"

    def __init__(
        self,
        epsilon: float = 1e-6,
        std_threshold: float | None = None,
        duplicate_experiences: bool = False,
        rank_penalty: float | None = None,
        std_cal_level: str = "group",
    ) -> None:
        if std_cal_level not in ("group", "batch"):
            raise ValueError(f"{self._name}: std_cal_level must be 'group' or 'batch', got {std_cal_level!r}")
        self.epsilon = epsilon
        self.std_threshold = std_threshold
        self.duplicate_experiences = duplicate_experiences
        self.rank_penalty = rank_penalty
        self.std_cal_level = std_cal_level

    def _scores(self, batch: Batch) -> torch.Tensor:
        return scalar_rewards(batch, self._name)

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask = require(batch, "action_mask", self._name)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        raw = self._scores(batch)
        stats = group_stats(raw, require(batch, "group_ids", self._name))
        scores = raw
        if self.rank_penalty is not None:
            scores = raw * (1 - self.rank_penalty * self._likelihood_rank(batch, stats))
            stats = group_stats(scores, stats.inverse)
        batch_std = unbiased_std_or_one(raw) if self.std_cal_level == "batch" else None
        advantage = grpo_normalize(scores, stats, self.epsilon, batch_std)
        metrics = _group_metrics(raw, stats.count.shape[0])
        dropped_group = None
        if self.std_threshold is not None:
            # A group of one has no spread at all: it is dropped like a group of equal rewards.
            dropped_group = (stats.count == 1) | (stats.std <= self.std_threshold)
            keep = ~dropped_group[stats.inverse]
            batch["action_mask"] = mask * keep.unsqueeze(-1).to(mask.dtype)
            advantage = advantage * keep
            metrics["filtered_count"] = float((~keep).sum())
        set_outcome_advantages(batch, advantage, dtype)
        if self.duplicate_experiences and dropped_group is not None:
            metrics["duplicated_count"] = float(_duplicate_valid_groups(batch, stats, dropped_group))
        return batch, metrics

    def _likelihood_rank(self, batch: Batch, stats: GroupStats) -> torch.Tensor:
        """``k / n`` per row: the rank of the row's mean rollout log-prob within its group (0 =
        least likely; ties by row order) over the group size. Float64."""
        if batch.get("has_rollout_logprobs") is False:
            raise ValueError(
                f"advantage_fn {self._name!r} with rank_penalty ranks rows by their rollout log-probs, "
                "but some experiences carry none (the explorer must return log-probs)"
            )
        logprobs = require(batch, "rollout_logprobs", self._name).to(torch.float64)
        # Upstream averages Experience.logprobs: every response token (response_mask).
        tokens = batch.get("response_mask")
        if tokens is None:
            tokens = require(batch, "action_mask", self._name)
        tokens = tokens.to(torch.float64)
        mean_logprob = (logprobs * tokens).sum(-1) / tokens.sum(-1).clamp(min=1)
        # Sort by log-prob, then (stably) by group: each group's rows end up contiguous, ascending.
        order = torch.argsort(mean_logprob, stable=True)
        order = order[torch.argsort(stats.inverse[order], stable=True)]
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        group_start = torch.cumsum(stats.count, 0) - stats.count
        rank = position.to(torch.float64) - group_start[stats.inverse]
        return rank / stats.row_count


def _duplicate_valid_groups(batch: Batch, stats: GroupStats, dropped_group: torch.Tensor) -> int:
    """Overwrite the rows of each dropped group with those of a valid group drawn uniformly (with
    replacement, as upstream); returns the number of rows overwritten (0 when no group is valid)."""
    valid = torch.nonzero(~dropped_group).flatten().tolist()
    dropped = torch.nonzero(dropped_group).flatten().tolist()
    if not valid or not dropped:
        return 0
    inverse = stats.inverse.cpu()
    rows_of = {g: torch.nonzero(inverse == g).flatten() for g in valid + dropped}
    source = torch.arange(inverse.numel())
    picks = torch.randint(0, len(valid), (len(dropped),)).tolist()
    for group, pick in zip(dropped, picks):
        target, donor = rows_of[group], rows_of[valid[pick]]
        source[target] = donor[torch.arange(len(target)) % len(donor)]
    copy_rows(batch, source)
    return int(sum(len(rows_of[g]) for g in dropped))


class OPMDAdvantageFn(AdvantageFn):
    """OPMD (Trinity-RFT, arXiv:2505.17826; analysed in arXiv:2509.24203): ``A = r - b`` per group
    of the scalar ``rewards``, with ``b`` the group mean (``opmd_baseline="mean"``) or
    ``tau * (logsumexp(r / tau) - log n)`` (``"logavgexp"``). A group of one gets ``b = 0``."""

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    _name: ClassVar[str] = "opmd"

    def __init__(self, opmd_baseline: str = "mean", tau: float = 1.0) -> None:
        if opmd_baseline not in ("mean", "logavgexp"):
            raise ValueError(
                f"{self._name}: opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}"
            )
        self.opmd_baseline = opmd_baseline
        self.tau = tau

    def _scores(self, batch: Batch) -> torch.Tensor:
        return scalar_rewards(batch, self._name)

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", self._name)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = self._scores(batch)
        stats = group_stats(scores, require(batch, "group_ids", self._name))
        if self.opmd_baseline == "mean":
            baseline = stats.mean
        else:
            baseline = group_logavgexp(scores, stats, self.tau)
        baseline = torch.where(stats.count == 1, torch.zeros_like(baseline), baseline)
        advantage = scores - baseline[stats.inverse]
        metrics = _group_metrics(scores, stats.count.shape[0])
        metrics["group_baseline_mean"] = float(baseline.mean()) if baseline.numel() else 0.0
        return set_outcome_advantages(batch, advantage, dtype), metrics


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
    """AsymRE (asymmetric REINFORCE, Arnal et al., arXiv:2506.20520):
    ``A = r - (mean_group + baseline_shift)`` on the scalar ``rewards``; a group of one gets
    baseline 0. A negative shift favours positive examples."""

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    _name: ClassVar[str] = "asymre"

    def __init__(self, baseline_shift: float = -0.1) -> None:
        self.baseline_shift = baseline_shift

    def _scores(self, batch: Batch) -> torch.Tensor:
        return scalar_rewards(batch, self._name)

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", self._name)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = self._scores(batch)
        stats = group_stats(scores, require(batch, "group_ids", self._name))
        baseline = torch.where(
            stats.count == 1, torch.zeros_like(stats.mean), stats.mean + self.baseline_shift
        )
        advantage = scores - baseline[stats.inverse]
        metrics = _group_metrics(scores, stats.count.shape[0])
        metrics["group_baseline_mean"] = float(baseline.mean()) if baseline.numel() else 0.0
        return set_outcome_advantages(batch, advantage, dtype), metrics


__all__ = [
    "AsymREAdvantageFn",
    "GRPOAdvantageFn",
    "OPMDAdvantageFn",
    "RLOOAdvantageFn",
    "grpo_normalize",
    "unbiased_std_or_one",
]
