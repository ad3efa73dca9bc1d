"""Batch building: veRL's padding layout, masks, DPO interleaving."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trinity.experience import EID, Experience
from trinity.trainer.batch import TrainBatch, build_batch, select_rows


def _exp(prompt, response, **kw):
    return Experience(tokens=torch.tensor(prompt + response), prompt_length=len(prompt), **kw)


def test_left_padded_prompts_right_padded_responses():
    exps = [
        _exp([5, 6], [7, 8, 9], logprobs=[-1.0, -2.0, -3.0], reward=1.0, eid=EID(task=0), model_version=3),
        _exp([5, 6, 7], [8], reward=0.5, action_mask=[0], eid=EID(task=1), info={"is_expert": True}),
    ]
    b = build_batch(exps, pad_token_id=0)
    assert b["prompt_length"] == 3 and b["response_length"] == 3
    assert b["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9], [5, 6, 7, 8, 0, 0]]
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 3, 3]]
    assert b["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["action_mask"].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert b["rollout_logprobs"].tolist() == [[-1, -2, -3], [0, 0, 0]]
    assert b["rewards"].tolist() == [1.0, 0.5]
    assert b["group_ids"].tolist() == [0, 1]
    assert b["expert_mask"].tolist() == [False, True]
    assert b["model_versions"].tolist() == [3, 0]
    assert "token_level_rewards" not in b
    sub = select_rows(b, [1])
    assert sub["input_ids"].tolist() == [[5, 6, 7, 8, 0, 0]] and sub["info"] == [{"is_expert": True}]


def test_group_ids_follow_task_ids_and_token_rewards_are_kept():
    exps = [
        _exp([1], [2, 3], token_level_reward=[0.0, 1.0], eid=EID(batch=0, task=t, run=r))
        for t, r in [(0, 0), (1, 0), (0, 1)]
    ]
    b = build_batch(exps)
    assert b["group_ids"].tolist() == [0, 1, 0]
    assert b["token_level_rewards"].tolist() == [[0.0, 1.0]] * 3


def test_dpo_expands_to_interleaved_chosen_rejected_rows():
    exps = [
        Experience(
            tokens=torch.tensor([4, 5]),
            prompt_length=2,
            chosen=torch.tensor([6, 7]),
            rejected=torch.tensor([8]),
            eid=EID(task=0),
        ),
        Experience(
            tokens=torch.tensor([4]),
            prompt_length=1,
            chosen=torch.tensor([9]),
            rejected=torch.tensor([10, 11, 12]),
            eid=EID(task=1),
        ),
    ]
    b = build_batch(exps, pad_token_id=0)
    assert b["input_ids"].tolist() == [
        [4, 5, 6, 7, 0],
        [4, 5, 8, 0, 0],
        [0, 4, 9, 0, 0],
        [0, 4, 10, 11, 12],
    ]
    assert b["action_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 1]]
    assert b["group_ids"].tolist() == [0, 0, 1, 1]


def test_a_batch_is_typed_and_never_changed_in_place():
    b = build_batch([_exp([1], [2, 3], reward=1.0, eid=EID(task=0)), _exp([4, 5], [6], eid=EID(task=1))])
    with pytest.raises(TypeError):
        b["advantages"] = torch.zeros(2, 2)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.advantages = torch.zeros(2, 2)  # type: ignore[misc]
    # Optional fields are absent from the mapping until a stage sets them, in a new batch.
    assert b.advantages is None and "advantages" not in b and b.get("advantages") is None
    with_adv = b.with_(advantages=torch.ones(2, 2))
    assert "advantages" in with_adv and "advantages" not in b
    assert with_adv.input_ids is b.input_ids
    with pytest.raises(TypeError):
        b.with_(not_a_field=1)


def test_keys_a_plugin_adds_are_kept_and_follow_the_rows():
    b = build_batch([_exp([1], [2, 3], eid=EID(task=t)) for t in range(3)])
    data = b.to_dict()
    assert data is not b.to_dict() and set(data) == set(b)
    data["my_weights"] = torch.tensor([1.0, 2.0, 3.0])
    back = TrainBatch.from_mapping(data)
    assert back.extra.keys() == {"my_weights"} and torch.equal(back["my_weights"], data["my_weights"])
    assert select_rows(back, [2, 0])["my_weights"].tolist() == [3.0, 1.0]
    del data["action_mask"], data["info"]
    with pytest.raises(
        ValueError, match=r"^a training batch needs 'action_mask', 'info', which the mapping lacks$"
    ):
        TrainBatch.from_mapping(data)
