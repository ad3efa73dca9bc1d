"""Base class of advantage estimators."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import MutableMapping
from typing import Any

from trinity.algorithm.component import Component

Batch = MutableMapping[str, Any]


class AdvantageFn(Component):
    """Computes ``advantages (B, T)`` and ``returns (B, T)`` for a training batch.

    ``batch`` maps names to tensors: at least ``rewards (B,)``, ``action_mask (B, T)`` and
    ``group_ids (B,)`` (long; equal ids are rollouts of one task), and where available
    ``token_level_rewards (B, T)``, ``values (B, T)``, ``old_logprob``, ``ref_logprob``; plus
    ``info``, a list with one dict per row. Advantages are zero on masked tokens.
    """

    @abstractmethod
    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Return ``batch`` with ``advantages`` and ``returns`` set, and metrics."""
