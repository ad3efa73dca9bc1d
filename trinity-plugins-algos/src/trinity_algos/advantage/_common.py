"""Helpers shared by the advantage functions: outcome scores, per-group statistics, broadcasting.

Group statistics are computed in float64 whatever the input dtype. Rewards are small vectors
(one value per row), so this costs nothing, and it matters: with float32, the mean of a group of
equal rewards can miss the rewards by ~1e-8, which GRPO then divides by ``std + 1e-6`` and turns
into advantages of ~1e-2 where the exact answer is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trinity.algorithm.advantage import Batch
from trinity.algorithm.kl import rewards_to_token_level
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def require(batch: Batch, name: str, who: str) -> torch.Tensor:
    """``batch[name]``, or a ``KeyError`` saying which advantage function needs it."""
    if name not in batch or batch[name] is None:
        raise KeyError(
            f"advantage_fn {who!r} needs batch[{name!r}], which is missing "
            f"(the batch has: {', '.join(sorted(batch))})"
        )
    return batch[name]


def output_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The floating dtype of the first floating tensor given, else float32."""
    for t in tensors:
        if t is not None and t.is_floating_point():
            return t.dtype
    return torch.float32


def scalar_rewards(batch: Batch, who: str) -> torch.Tensor:
    """The scalar ``rewards (B,)`` as float64, ignoring ``token_level_rewards``.

    The grouped forms (``grpo``, ``opmd``, ``asymre``, ``reinforce``, ``rec``, ``step_wise_grpo``)
    score a row by ``Experience.reward`` as upstream Trinity-RFT does: it computes them in the
    explorer, before (and without) any KL penalty on the reward.
    """
    return require(batch, "rewards", who).to(torch.float64).reshape(-1)


def outcome_scores(batch: Batch, who: str) -> torch.Tensor:
    """One scalar score per row, float64 (the veRL forms: ``*_verl``, ``rloo``, ``clipb``, ...).

    ``token_level_rewards`` (summed over the row, as veRL does) wins when present, because a KL
    penalty applied to the reward lives there; otherwise the scalar ``rewards``.
    """
    tlr = batch.get("token_level_rewards")
    if tlr is not None:
        return tlr.to(torch.float64).sum(dim=-1)
    return require(batch, "rewards", who).to(torch.float64).reshape(-1)


def token_level_rewards(batch: Batch, who: str) -> torch.Tensor:
    """``token_level_rewards``, or the scalar ``rewards`` placed on each row's last valid token."""
    tlr = batch.get("token_level_rewards")
    if tlr is not None:
        return tlr
    rewards = require(batch, "rewards", who)
    return rewards_to_token_level(rewards, require(batch, "action_mask", who)).to(output_dtype(rewards))


@dataclass
class GroupStats:
    """Per-group statistics of a score vector, indexed by ``inverse`` (row → group)."""

    inverse: torch.Tensor  # (B,) long, group index of each row
    count: torch.Tensor  # (G,) float64
    mean: torch.Tensor  # (G,) float64
    std: torch.Tensor  # (G,) float64, unbiased; 0 for groups of one

    @property
    def row_count(self) -> torch.Tensor:
        return self.count[self.inverse]


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """Mean and unbiased standard deviation of ``scores`` (float64) within each group id."""
    _, inverse = torch.unique(group_ids.reshape(-1), return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.bincount(inverse, minlength=n_groups).to(torch.float64)
    # On the scores' device: the trainer computes advantages where its batch lives (CUDA too).
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)
    total = zeros.index_add(0, inverse, scores)
    mean = total / count
    # Two-pass variance: exact zero for equal scores, unlike E[x^2] - E[x]^2.
    sq_dev = zeros.index_add(0, inverse, (scores - mean[inverse]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return GroupStats(inverse=inverse, count=count, mean=mean, std=std)


def group_logavgexp(scores: torch.Tensor, stats: GroupStats, tau: float) -> torch.Tensor:
    """Per group ``tau * (logsumexp(scores / tau) - log n)`` (float64), computed stably."""
    x = scores / tau
    n_groups = stats.count.shape[0]
    peak = torch.full((n_groups,), float("-inf"), dtype=torch.float64, device=scores.device)
    peak = peak.scatter_reduce(0, stats.inverse, x, reduce="amax", include_self=True)
    sum_exp = torch.zeros(n_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, stats.inverse, torch.exp(x - peak[stats.inverse])
    )
    return tau * (peak + torch.log(sum_exp) - torch.log(stats.count))


def copy_rows(batch: Batch, source: torch.Tensor) -> None:
    """Overwrite every row ``i`` of ``batch`` with row ``source[i]``, in place.

    Touches each tensor whose first dimension is the batch size and each per-row list (``info``,
    ``uids``); the batch keeps its size, so a back-end's micro-batch plan made before the
    advantage stays valid.
    """
    n = len(source)
    index = source.tolist()
    for key, value in list(batch.items()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            batch[key] = value[source.to(value.device)]
        elif isinstance(value, list) and len(value) == n:
            batch[key] = [dict(value[j]) if isinstance(value[j], dict) else value[j] for j in index]


def broadcast(per_row: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(B,)`` values spread over the valid tokens of each row: ``(B, T)``, zero elsewhere."""
    return per_row.to(dtype).unsqueeze(-1) * mask.to(dtype)


def set_outcome_advantages(batch: Batch, per_row: torch.Tensor, dtype: torch.dtype) -> Batch:
    """Write ``advantages`` = ``returns`` = ``per_row`` broadcast over the action mask."""
    advantages = broadcast(per_row, batch["action_mask"], dtype)
    batch["advantages"] = advantages
    batch["returns"] = advantages.clone()
    return batch
