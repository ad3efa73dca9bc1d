"""REC: group-relative REINFORCE with optional std normalisation and negative-sample balancing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    group_stats,
    output_dtype,
    require,
    scalar_rewards,
    set_outcome_advantages,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class RECAdvantageFn(AdvantageFn):
    """REC (Yao et al., "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm",
    arXiv:2509.24203): ``A = r - mean`` per group of the scalar ``rewards``, or
    ``(r - mean) / (std + epsilon)`` with ``std_normalize``.

    A row is positive when ``r >= mean_group`` (mean 0 for a group of one). With
    ``drop="balance"``, a group with more negative than positive rows loses the surplus: that many
    negative rows, drawn at random, get advantage 0 (they stay in the batch and the mask, as
    upstream). ``mean`` and ``std`` (population) are then taken over the rows kept; a group with
    at most one row kept uses mean 0 and std 1.
    """

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    def __init__(
        self, epsilon: float = 1e-6, std_normalize: bool | None = False, drop: str | None = None
    ) -> None:
        if drop not in (None, "balance"):
            raise ValueError(f"rec: drop must be None or 'balance', got {drop!r}")
        self.epsilon = epsilon
        self.std_normalize = std_normalize
        self.drop = drop

    def _pick_drops(self, negatives: torch.Tensor, n: int) -> torch.Tensor:
        """``n`` of the row indices ``negatives``, uniformly at random (torch's global RNG)."""
        return negatives[torch.randperm(negatives.numel())[:n].to(negatives.device)]

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "rec"
        require(batch, "action_mask", who)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = scalar_rewards(batch, who)
        stats = group_stats(scores, require(batch, "group_ids", who))
        inverse, n_groups = stats.inverse, stats.count.shape[0]
        mean = torch.where(stats.count == 1, torch.zeros_like(stats.mean), stats.mean)
        positive = scores >= mean[inverse]
        keep = torch.ones_like(positive)
        drop_fraction = torch.zeros(n_groups, dtype=torch.float64)
        if self.drop == "balance":
            n_pos = torch.zeros(n_groups, dtype=torch.long, device=inverse.device).index_add_(
                0, inverse, positive.long()
            )
            surplus = (stats.count.long() - n_pos) - n_pos
            for group in torch.nonzero(surplus > 0).flatten().tolist():
                negatives = torch.nonzero((inverse == group) & ~positive).flatten()
                n_drop = int(surplus[group])
                keep[self._pick_drops(negatives, n_drop)] = False
                drop_fraction[group] = n_drop / float(stats.count[group])

        # Mean and population std over the kept rows of each group.
        weight = keep.to(torch.float64)
        zeros = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)
        kept = zeros.index_add(0, inverse, weight)
        kept_mean = zeros.index_add(0, inverse, scores * weight) / kept.clamp(min=1)
        sq_dev = zeros.index_add(0, inverse, (scores - kept_mean[inverse]) ** 2 * weight)
        kept_std = torch.sqrt(sq_dev / kept.clamp(min=1))
        few = kept <= 1
        kept_mean = torch.where(few, torch.zeros_like(kept_mean), kept_mean)
        kept_std = torch.where(few, torch.ones_like(kept_std), kept_std)

        advantage = scores - kept_mean[inverse]
        if self.std_normalize:
            advantage = advantage / (kept_std[inverse] + self.epsilon)
        advantage = advantage * weight
        metrics = {
            "reward_mean": float(scores.mean()) if scores.numel() else 0.0,
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "group_count": float(n_groups),
            "drop_balance": float(drop_fraction.mean()) if n_groups else 0.0,
            "dropped_count": float((~keep).sum()),
        }
        return set_outcome_advantages(batch, advantage, dtype), metrics


__all__ = ["RECAdvantageFn"]
