"""RAFT's selection stage: successful rollouts stay in the SFT loss, the rest are masked out."""

from __future__ import annotations

import pytest
import torch

from trinity_algos.policy_loss import SFTLossFn
from trinity_algos.raft import RAFTFilterFn


def _batch(rewards, groups):
    n = len(rewards)
    return {
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "group_ids": torch.tensor(groups),
        "action_mask": torch.tensor([[1.0, 1.0, 0.0]] * n),
    }


def test_rows_below_the_threshold_are_masked_out():
    batch, metrics = RAFTFilterFn()(_batch([1.0, 0.0, 1.5, 0.99], [0, 0, 1, 1]))
    assert batch["action_mask"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert torch.equal(batch["advantages"], batch["action_mask"])
    assert metrics == {"kept_count": 2.0, "dropped_count": 2.0, "kept_fraction": 0.5}


def test_top_k_keeps_the_best_successful_rollouts_of_each_task():
    rewards = [0.5, 0.9, 0.7, 0.2, 0.6, 0.1]
    batch, metrics = RAFTFilterFn(reward_threshold=0.5, top_k=1)(_batch(rewards, [0, 0, 0, 1, 1, 1]))
    # Task 0: the 0.9 rollout; task 1: 0.6 is the only one above the threshold.
    assert batch["action_mask"][:, 0].tolist() == [0, 1, 0, 0, 1, 0]
    assert metrics["kept_count"] == 2.0


def test_the_sft_loss_then_sees_only_the_kept_rows():
    logprob = torch.tensor([[-1.0, -2.0, -9.0], [-5.0, -5.0, -5.0]], requires_grad=True)
    batch, _ = RAFTFilterFn()(_batch([1.0, 0.0], [0, 0]))
    loss, _ = SFTLossFn()(logprob, action_mask=batch["action_mask"])
    assert loss.item() == pytest.approx(1.5)  # mean of 1 and 2; the failed row contributes nothing
    loss.backward()
    assert logprob.grad[1].abs().sum() == 0


def test_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        RAFTFilterFn(top_k=0)
