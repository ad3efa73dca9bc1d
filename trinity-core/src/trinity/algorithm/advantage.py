"""Base class of advantage estimators."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import MutableMapping
from typing import Any, ClassVar

from trinity.algorithm.component import Component

Batch = MutableMapping[str, Any]


class AdvantageFn(Component):
    """Computes ``advantages (B, T)`` and ``returns (B, T)`` for a training batch.

    ``batch`` maps names to tensors: at least ``rewards (B,)``, ``action_mask (B, T)`` and
    ``group_ids (B,)`` (long; equal ids are rollouts of one task), and where available
    ``token_level_rewards (B, T)``, ``values (B, T)``, ``old_logprob``, ``ref_logprob``; plus
    ``info``, a list with one dict per row. Advantages are zero on masked tokens.

    Step-wise (multi-step) batches also carry ``trajectory_ids (B,)`` (equal ids: the turns of
    one episode, i.e. one rollout of a task) and ``step_ids (B,)`` (the turn index, ``eid.step``);
    ``group_ids`` still groups by task. ``teacher_logprobs (B, T)`` is there when every
    experience recorded one.

    ``required_inputs`` names the tensors the back-end must compute *before* the advantage, beyond
    the ones above: ``old_logprob`` and ``old_entropy`` (the policy's log-probs / entropy before the
    update), ``ref_logprob``, ``values``, ``teacher_logprobs`` or ``rollout_logprobs``. A missing
    one is an error naming this function, not a silent zero.
    """

    required_inputs: ClassVar[tuple[str, ...]] = ()
    #: Whether the advantage reads ``token_level_rewards`` (where a KL reward penalty lands).
    #: Trinity-RFT's grouped forms (``grpo``, ``opmd``, ...) read the scalar reward instead; a
    #: ``kl_penalty_fn`` with one of them is refused rather than silently having no effect.
    reads_token_level_rewards: ClassVar[bool] = True

    @abstractmethod
    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Return ``batch`` with ``advantages`` and ``returns`` set, and metrics."""
