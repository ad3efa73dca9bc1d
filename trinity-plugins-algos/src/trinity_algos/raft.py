"""RAFT's selection step (reward-ranked fine-tuning, Dong et al., arXiv:2304.06767).

RAFT trains with the SFT loss on the rollouts that succeeded. Upstream Trinity-RFT leaves the
selection to the workflow (its ALFWorld RAFT workflow returns only successful trajectories);
here it is an advantage-stage component, so every workflow works with ``algorithm_type: raft``:
rows whose reward is below ``reward_threshold`` (and, with ``top_k``, all but the ``top_k``
best rollouts of each task) get an all-zero ``action_mask``, so the SFT loss never sees them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import outcome_scores, require

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class RAFTFilterFn(AdvantageFn):
    """Keep rows with ``reward >= reward_threshold`` (at most ``top_k`` per task, best first).

    Kept rows get ``advantages = returns = action_mask`` (1 on their tokens), dropped rows an
    all-zero ``action_mask``. Metrics: ``kept_count``, ``dropped_count``, ``kept_fraction``.
    """

    def __init__(self, reward_threshold: float = 1.0, top_k: int | None = None) -> None:
        if top_k is not None and top_k < 1:
            raise ValueError(f"raft: top_k must be >= 1 or None, got {top_k}")
        self.reward_threshold = reward_threshold
        self.top_k = top_k

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask = require(batch, "action_mask", "raft")
        scores = outcome_scores(batch, "raft")
        keep = scores >= self.reward_threshold
        if self.top_k is not None:
            groups = require(batch, "group_ids", "raft").reshape(-1).tolist()
            order = sorted(range(len(groups)), key=lambda i: (-float(scores[i]), i))
            taken: dict[int, int] = {}
            ranked = torch.zeros_like(keep)
            for i in order:
                if bool(keep[i]) and taken.get(groups[i], 0) < self.top_k:
                    taken[groups[i]] = taken.get(groups[i], 0) + 1
                    ranked[i] = True
            keep = ranked
        new_mask = mask * keep.to(mask.device).unsqueeze(-1).to(mask.dtype)
        batch["action_mask"] = new_mask
        batch["advantages"] = new_mask.clone()
        batch["returns"] = new_mask.clone()
        kept = float(keep.sum())
        total = float(keep.numel())
        return batch, {
            "kept_count": kept,
            "dropped_count": total - kept,
            "kept_fraction": kept / total if total else 0.0,
        }


__all__ = ["RAFTFilterFn"]
