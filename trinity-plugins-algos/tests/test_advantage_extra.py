"""The advantage functions ported from Trinity-RFT beyond the classic set: the ``*_verl`` forms,
GRPO's rank penalty and duplication, step-wise GRPO, GiGPO, REC, on-policy distillation, JSD,
Clip_B and Clip_V. Hand-computed values, and float64 plain-loop references on random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import SHAPES, random_groups, random_mask

from trinity.testing import check_advantage_fn, make_training_tensors
from trinity_algos.advantage import (
    AsymREAdvantageFn,
    AsymREVerlAdvantageFn,
    ClipBAdvantageFn,
    ClipVAdvantageFn,
    GiGPOAdvantageFn,
    GRPOAdvantageFn,
    GRPOVerlAdvantageFn,
    JSDAdvantageFn,
    OnPolicyDistillAdvantageFn,
    OPMDAdvantageFn,
    OPMDVerlAdvantageFn,
    RECAdvantageFn,
    REINFORCEAdvantageFn,
    StepWiseGRPOAdvantageFn,
)

EPS = 1e-6
F64 = torch.float64

# -- plain-python helpers -----------------------------------------------------------------------


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    """Unbiased."""
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _pstd(xs):
    """Population."""
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _members(ids):
    out: dict = {}
    for row, i in enumerate(ids):
        out.setdefault(i, []).append(row)
    return out


def spread(per_row, mask):
    return torch.tensor([[a * m for m in mrow] for a, mrow in zip(per_row, mask.tolist())], dtype=F64)


def ref_grpo(scores, ids, eps=EPS, batch_std=None):
    out = []
    groups = _members(ids)
    for r, i in zip(scores, ids):
        g = [scores[j] for j in groups[i]]
        mean, std = (0.0, 1.0) if len(g) == 1 else (_mean(g), _std(g))
        if batch_std is not None:
            std = batch_std
        out.append((r - mean) / (std + eps))
    return out


def row_sums(x, mask):
    return [sum(v * m for v, m in zip(row, mrow)) for row, mrow in zip(x.tolist(), mask.tolist())]


# -- default arguments: the same as upstream's default_args() ---------------------------------------

UPSTREAM_DEFAULTS = [
    (
        GRPOAdvantageFn,
        {
            "epsilon": 1e-6,
            "std_threshold": None,
            "duplicate_experiences": False,
            "rank_penalty": None,
            "std_cal_level": "group",
        },
    ),
    (GRPOVerlAdvantageFn, {"epsilon": 1e-6}),
    (OPMDAdvantageFn, {"opmd_baseline": "mean", "tau": 1.0}),
    (OPMDVerlAdvantageFn, {"opmd_baseline": "mean", "tau": 1.0}),
    (AsymREAdvantageFn, {"baseline_shift": -0.1}),
    (AsymREVerlAdvantageFn, {"baseline_shift": -0.1}),
    (REINFORCEAdvantageFn, {}),
    (
        StepWiseGRPOAdvantageFn,
        {"epsilon": 1e-6, "enable_step_norm": False, "std_threshold": None, "std_cal_level": "group"},
    ),
    (
        GiGPOAdvantageFn,
        {
            "omega": 1.0,
            "gamma": 1.0,
            "fnorm": "none",
            "epsilon": 1e-6,
            "step_reward_key": "step_reward",
            "env_state_hash_key": "env_state_hash",
        },
    ),
    (RECAdvantageFn, {"epsilon": 1e-6, "std_normalize": False, "drop": None}),
    (OnPolicyDistillAdvantageFn, {"kl_coef": 1.0}),
    (JSDAdvantageFn, {"lambda_coef": 0.5, "kl_coef": 1.0, "temperature": 1.0, "chunk_size": None}),
    (ClipBAdvantageFn, {"epsilon": 1e-6, "mu": 2.5}),
    # upstream's __init__ says mu=2.0 but its default_args (what configs get) say 8.5
    (ClipVAdvantageFn, {"epsilon": 1e-6, "mu": 8.5, "max_frac": 1e-4}),
]


@pytest.mark.parametrize("cls,expected", UPSTREAM_DEFAULTS, ids=lambda x: getattr(x, "__name__", ""))
def test_default_args_match_upstream(cls, expected):
    assert cls.default_args() == expected
    cls(**expected)  # and they build


REQUIRED = [
    (OnPolicyDistillAdvantageFn, ("old_logprob", "teacher_logprobs")),
    (JSDAdvantageFn, ("old_logprob", "teacher_logprobs")),
    (ClipBAdvantageFn, ("old_logprob", "old_entropy")),
    (ClipVAdvantageFn, ("old_logprob", "old_entropy", "old_nec")),
    (StepWiseGRPOAdvantageFn, ("trajectory_ids",)),
    (GiGPOAdvantageFn, ("trajectory_ids",)),
    (GRPOVerlAdvantageFn, ()),
    (OPMDVerlAdvantageFn, ()),
    (AsymREVerlAdvantageFn, ()),
    (RECAdvantageFn, ()),
    (GRPOAdvantageFn, ()),
]


@pytest.mark.parametrize("cls,names", REQUIRED, ids=lambda x: getattr(x, "__name__", ""))
def test_required_inputs(cls, names):
    assert cls.required_inputs == names


# -- conformance (trinity.testing) with the extra inputs each needs -------------------------------


def conformance_batch():
    data = make_training_tensors(batch_size=6, length=5)
    g = torch.Generator().manual_seed(1)
    b, t = data["action_mask"].shape
    data["teacher_logprobs"] = data["logprob"] + 0.2 * torch.randn(b, t, generator=g)
    data["old_entropy"] = torch.rand(b, t, generator=g) * 2
    data["old_nec"] = torch.rand(b, t, generator=g) * 0.1
    data["rollout_logprobs"] = data["old_logprob"].clone()
    data["has_rollout_logprobs"] = True
    data["trajectory_ids"] = torch.tensor([0, 0, 1, 2, 2, 3])
    data["group_ids"] = torch.tensor([0, 0, 0, 1, 1, 1])
    data["step_ids"] = torch.tensor([0, 1, 0, 0, 1, 0])
    data["info"] = [{"env_state_hash": h} for h in ("a", "b", "a", "c", "d", "c")]
    return data


CONFORMANCE = [
    (GRPOVerlAdvantageFn, {}),
    (OPMDVerlAdvantageFn, {"opmd_baseline": "logavgexp"}),
    (AsymREVerlAdvantageFn, {}),
    (GRPOAdvantageFn, {"rank_penalty": 0.2, "std_threshold": 0.0, "duplicate_experiences": True}),
    (StepWiseGRPOAdvantageFn, {"std_threshold": 0.0, "enable_step_norm": True}),
    (GiGPOAdvantageFn, {"fnorm": "std", "gamma": 0.9}),
    (RECAdvantageFn, {"std_normalize": True, "drop": "balance"}),
    (OnPolicyDistillAdvantageFn, {}),
    (JSDAdvantageFn, {}),
    (JSDAdvantageFn, {"lambda_coef": 1.0}),
    (ClipBAdvantageFn, {"mu": 0.5}),
    (ClipVAdvantageFn, {"mu": 0.5, "max_frac": 0.1}),
]


@pytest.mark.parametrize("cls,args", CONFORMANCE, ids=lambda x: getattr(x, "__name__", ""))
def test_conformance_with_extra_inputs(cls, args):
    check_advantage_fn(cls, args, batch=conformance_batch())


MISSING = [
    (StepWiseGRPOAdvantageFn, "trajectory_ids", "step_wise_grpo"),
    (GiGPOAdvantageFn, "trajectory_ids", "gigpo"),
    (OnPolicyDistillAdvantageFn, "teacher_logprobs", "on_policy_distill"),
    (OnPolicyDistillAdvantageFn, "old_logprob", "on_policy_distill"),
    (JSDAdvantageFn, "teacher_logprobs", "jsd"),
    (ClipBAdvantageFn, "old_entropy", "clipb"),
    (ClipVAdvantageFn, "old_nec", "clipv"),
    (ClipVAdvantageFn, "old_logprob", "clipv"),
    (GRPOVerlAdvantageFn, "group_ids", "grpo_verl"),
    (RECAdvantageFn, "group_ids", "rec"),
]


@pytest.mark.parametrize("cls,key,name", MISSING, ids=lambda x: getattr(x, "__name__", x))
def test_missing_input_is_a_key_error_naming_fn_and_key(cls, key, name):
    batch = conformance_batch()
    del batch[key]
    with pytest.raises(KeyError, match=rf"{name}.*{key}"):
        cls()(batch)


# -- *_verl forms ---------------------------------------------------------------------------------


def tlr_batch(tlr, ids, rewards=None):
    tlr = torch.tensor(tlr, dtype=F64)
    rewards = torch.zeros(tlr.shape[0], dtype=F64) if rewards is None else torch.tensor(rewards, dtype=F64)
    return {
        "rewards": rewards,
        "token_level_rewards": tlr,
        "group_ids": torch.tensor(ids),
        "action_mask": torch.ones_like(tlr),
    }


def test_verl_forms_hand_values_from_token_level_rewards():
    batch = tlr_batch([[0.0, 1.0], [0.5, 2.5], [0.0, 4.0]], [0, 0, 1], rewards=[9.0, 9.0, 9.0])
    out, _ = GRPOVerlAdvantageFn()(dict(batch))
    a = 1 / (math.sqrt(2) + EPS)  # sums 1, 3: mean 2, std sqrt(2); singleton 4: mean 0, std 1
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([-a, a, 4 / (1 + EPS)], dtype=F64))
    out, _ = OPMDVerlAdvantageFn()(dict(batch))
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([-1.0, 1.0, 4.0], dtype=F64))
    out, _ = AsymREVerlAdvantageFn(baseline_shift=-0.5)(dict(batch))
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([-0.5, 1.5, 4.0], dtype=F64))
    # the grouped form reads the scalar rewards: all 9 in group 0 -> 0
    out, _ = GRPOAdvantageFn()(dict(batch))
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([0.0, 0.0, 9 / (1 + EPS)], dtype=F64))


def test_verl_forms_fall_back_to_scalar_rewards():
    batch = {"rewards": torch.tensor([1.0, 3.0], dtype=F64), "group_ids": torch.tensor([0, 0])}
    batch["action_mask"] = torch.ones(2, 3)
    out, _ = GRPOVerlAdvantageFn()(dict(batch))
    a = 1 / (math.sqrt(2) + EPS)
    torch.testing.assert_close(out["advantages"][:, 2], torch.tensor([-a, a], dtype=F64))


def ref_opmd(scores, ids, baseline="mean", tau=1.0):
    groups = _members(ids)
    out = []
    for r, i in zip(scores, ids):
        g = [scores[j] for j in groups[i]]
        if len(g) == 1:
            b = 0.0
        elif baseline == "mean":
            b = _mean(g)
        else:
            b = tau * math.log(sum(math.exp(x / tau) for x in g) / len(g))
        out.append(r - b)
    return out


def ref_asymre(scores, ids, shift):
    groups = _members(ids)
    return [
        r - (0.0 if len(groups[i]) == 1 else _mean([scores[j] for j in groups[i]]) + shift)
        for r, i in zip(scores, ids)
    ]


VERL = [
    (GRPOVerlAdvantageFn, {"epsilon": 1e-4}, lambda s, i: ref_grpo(s, i, eps=1e-4)),
    (OPMDVerlAdvantageFn, {}, ref_opmd),
    (
        OPMDVerlAdvantageFn,
        {"opmd_baseline": "logavgexp", "tau": 0.7},
        lambda s, i: ref_opmd(s, i, "logavgexp", 0.7),
    ),
    (AsymREVerlAdvantageFn, {"baseline_shift": 0.3}, lambda s, i: ref_asymre(s, i, 0.3)),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cls,args,ref", VERL, ids=lambda x: getattr(x, "__name__", None))
def test_verl_forms_match_reference(cls, args, ref, shape):
    b, t = shape
    g = torch.Generator().manual_seed(b * 31 + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    tlr = torch.randn(b, t, generator=g, dtype=F64) * mask
    rewards = torch.randn(b, generator=g, dtype=F64)
    batch = {"rewards": rewards, "token_level_rewards": tlr, "group_ids": ids, "action_mask": mask}
    out, metrics = cls(**args)(batch)
    expected = spread(ref(row_sums(tlr, mask), ids.tolist()), mask)
    torch.testing.assert_close(out["advantages"], expected, atol=1e-6, rtol=1e-9)
    torch.testing.assert_close(out["returns"], expected, atol=1e-6, rtol=1e-9)
    assert all(isinstance(v, float) for v in metrics.values())
    # without token-level rewards: the scalar rewards
    batch = {"rewards": rewards, "group_ids": ids, "action_mask": mask}
    out, _ = cls(**args)(batch)
    torch.testing.assert_close(
        out["advantages"], spread(ref(rewards.tolist(), ids.tolist()), mask), atol=1e-6, rtol=1e-9
    )


# -- grpo (grouped): rank penalty, duplication ----------------------------------------------------


def rank_batch(rewards, ids, mean_logprobs, t=3):
    b = len(rewards)
    return {
        "rewards": torch.tensor(rewards, dtype=F64),
        "group_ids": torch.tensor(ids),
        "action_mask": torch.ones(b, t, dtype=F64),
        "response_mask": torch.ones(b, t, dtype=F64),
        "rollout_logprobs": torch.tensor(mean_logprobs, dtype=F64).unsqueeze(-1).expand(b, t).clone(),
        "has_rollout_logprobs": True,
    }


def test_grpo_rank_penalty_hand_values():
    # upstream's own case: rewards 0..3, mean log-probs 0, 0.1, 0.2, 0.3 -> ranks 0..3 of 4,
    # penalised rewards r * (1 - 0.2 * k / 4) = 0, 0.95, 1.8, 2.55; then normalised (not the raw r).
    out, metrics = GRPOAdvantageFn(epsilon=1e-7, rank_penalty=0.2)(
        rank_batch([0.0, 1.0, 2.0, 3.0], [0] * 4, [0.0, 0.1, 0.2, 0.3])
    )
    pen = [0.0, 0.95, 1.8, 2.55]
    expected = [(p - _mean(pen)) / (_std(pen) + 1e-7) for p in pen]
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor(expected, dtype=F64))
    # the likeliest correct rollout gains less than under plain GRPO
    plain, _ = GRPOAdvantageFn(epsilon=1e-7)(rank_batch([0.0, 1.0, 2.0, 3.0], [0] * 4, [0.0] * 4))
    assert out["advantages"][3, 0] < plain["advantages"][3, 0]
    assert metrics["reward_mean"] == 1.5


def test_grpo_rank_penalty_ranks_over_response_tokens_within_each_group():
    batch = rank_batch([1.0, 1.0, 1.0, 1.0], [0, 1, 0, 1], [0.0, 0.0, 0.0, 0.0], t=2)
    # row 0: response tokens (-1, pad) -> mean -1 (the pad's 5.0 must not count), below row 2's
    # -0.5: ranks 0 and 1 of group 0
    batch["rollout_logprobs"] = torch.tensor(
        [[-1.0, 5.0], [-3.0, -3.0], [-0.5, -0.5], [-2.0, -2.0]], dtype=F64
    )
    batch["response_mask"] = torch.tensor([[1.0, 0.0], [1, 1], [1, 1], [1, 1]], dtype=F64)
    out, _ = GRPOAdvantageFn(rank_penalty=0.5)(batch)
    # each group: penalised (1, 0.75): mean 0.875, std sqrt(2)/8
    a = 0.125 / (math.sqrt(2) / 8 + EPS)
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([a, a, -a, -a], dtype=F64))


def test_grpo_rank_penalty_needs_rollout_logprobs():
    batch = rank_batch([0.0, 1.0], [0, 0], [0.0, 0.0])
    batch["has_rollout_logprobs"] = False
    with pytest.raises(ValueError, match="rank_penalty"):
        GRPOAdvantageFn(rank_penalty=0.1)(dict(batch))
    del batch["rollout_logprobs"], batch["has_rollout_logprobs"]
    with pytest.raises(KeyError, match=r"grpo.*rollout_logprobs"):
        GRPOAdvantageFn(rank_penalty=0.1)(batch)


def ref_rank_penalised(rewards, ids, mean_lp, penalty):
    out = list(rewards)
    for rows in _members(ids).values():
        ordered = sorted(rows, key=lambda r: (mean_lp[r], r))
        for k, row in enumerate(ordered):
            out[row] = rewards[row] * (1 - penalty * k / len(rows))
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("std_cal_level", ["group", "batch"])
def test_grpo_rank_penalty_matches_reference(shape, std_cal_level):
    b, t = shape
    g = torch.Generator().manual_seed(5 * b + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    rewards = torch.randn(b, generator=g, dtype=F64)
    logprobs = -torch.rand(b, t, generator=g, dtype=F64) * 3
    batch = {
        "rewards": rewards,
        "group_ids": ids,
        "action_mask": mask,
        "rollout_logprobs": logprobs,
        "has_rollout_logprobs": True,
    }  # no response_mask: the action mask's tokens are averaged
    out, _ = GRPOAdvantageFn(rank_penalty=0.3, std_cal_level=std_cal_level)(batch)
    mean_lp = [
        sum(lp * m for lp, m in zip(row, mrow)) / max(sum(mrow), 1)
        for row, mrow in zip(logprobs.tolist(), mask.tolist())
    ]
    pen = ref_rank_penalised(rewards.tolist(), ids.tolist(), mean_lp, 0.3)
    batch_std = (_std(rewards.tolist()) if b > 1 else 1.0) if std_cal_level == "batch" else None
    expected = spread(ref_grpo(pen, ids.tolist(), batch_std=batch_std), mask)
    torch.testing.assert_close(out["advantages"], expected, atol=1e-6, rtol=1e-9)


def duplicate_batch(rewards, ids, t=2):
    b = len(rewards)
    return {
        "rewards": torch.tensor(rewards, dtype=F64),
        "group_ids": torch.tensor(ids),
        "action_mask": torch.ones(b, t, dtype=F64),
        "input_ids": torch.arange(b).unsqueeze(-1).expand(b, t + 3).clone(),
        "info": [{"row": i} for i in range(b)],
        "prompt_length": 3,
    }


def test_grpo_duplicate_experiences_refills_dropped_groups_with_valid_ones():
    torch.manual_seed(0)
    # groups 0 and 2 valid, 1 flat, 3 a singleton: rows of 1 and 3 become copies of 0 or 2
    batch = duplicate_batch([0.0, 1.0, 0.5, 0.5, 2.0, 5.0, 3.0], [0, 0, 1, 1, 2, 2, 3])
    out, metrics = GRPOAdvantageFn(std_threshold=0.0, duplicate_experiences=True)(batch)
    assert metrics["filtered_count"] == 3.0 and metrics["duplicated_count"] == 3.0
    source = out["input_ids"][:, 0].tolist()
    assert source[:2] == [0, 1] and source[4:6] == [4, 5]  # valid rows untouched
    assert tuple(source[2:4]) in {(0, 1), (4, 5)}  # a whole valid group
    assert source[6] in (0, 4)  # a smaller group takes the donor's first rows
    assert [row["row"] for row in out["info"]] == source
    for key in ("advantages", "returns", "action_mask", "rewards", "group_ids"):
        torch.testing.assert_close(out[key], out[key][torch.tensor(source)])
    assert out["action_mask"].sum(-1).min() == 2  # every row trains
    assert out["input_ids"].shape[0] == 7 and out["prompt_length"] == 3  # same batch size


def test_grpo_duplicate_experiences_with_nothing_valid_keeps_rows_masked():
    batch = duplicate_batch([0.5, 0.5, 1.0], [0, 0, 1])
    out, metrics = GRPOAdvantageFn(std_threshold=0.0, duplicate_experiences=True)(batch)
    assert metrics["duplicated_count"] == 0.0
    assert out["action_mask"].abs().sum() == 0 and out["advantages"].abs().sum() == 0
    # duplicate_experiences alone (no std_threshold) does nothing, as upstream
    out, metrics = GRPOAdvantageFn(duplicate_experiences=True)(duplicate_batch([0.5, 0.5, 1.0], [0, 0, 1]))
    assert "duplicated_count" not in metrics and out["action_mask"].sum() == 6


@pytest.mark.parametrize("shape", SHAPES)
def test_grpo_std_threshold_matches_reference(shape):
    b, t = shape
    g = torch.Generator().manual_seed(17 * b + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    rewards = torch.randint(0, 2, (b,), generator=g).double()
    out, metrics = GRPOAdvantageFn(std_threshold=0.1)(
        {"rewards": rewards, "group_ids": ids, "action_mask": mask}
    )
    groups = _members(ids.tolist())
    r = rewards.tolist()
    keep = [len(groups[i]) > 1 and _std([r[j] for j in groups[i]]) > 0.1 for i in ids.tolist()]
    expected_mask = torch.tensor([[m * k for m in mrow] for mrow, k in zip(mask.tolist(), keep)], dtype=F64)
    adv = [a * k for a, k in zip(ref_grpo(r, ids.tolist()), keep)]
    torch.testing.assert_close(out["action_mask"], expected_mask)
    torch.testing.assert_close(out["advantages"], spread(adv, expected_mask), atol=1e-6, rtol=0)
    assert metrics["filtered_count"] == float(keep.count(False))


# -- step_wise_grpo -------------------------------------------------------------------------------


def episode_batch(rows, t=2):
    """``rows``: (group, trajectory, step, reward) per row."""
    group, traj, step, reward = zip(*rows)
    return {
        "rewards": torch.tensor(reward, dtype=F64),
        "group_ids": torch.tensor(group),
        "trajectory_ids": torch.tensor(traj),
        "step_ids": torch.tensor(step),
        "action_mask": torch.ones(len(rows), t, dtype=F64),
    }


# task 0: episode 10 (3 steps, last-step reward 1), episode 11 (2 steps, last-step reward 0);
# task 1: episode 20 alone (2 steps, last-step reward 0.5). Rows shuffled; earlier steps carry
# other rewards, which must not count.
STEP_ROWS = [
    (0, 11, 1, 0.0),
    (0, 10, 2, 1.0),
    (1, 20, 0, 9.0),
    (0, 10, 0, 7.0),
    (0, 11, 0, 7.0),
    (1, 20, 1, 0.5),
    (0, 10, 1, -3.0),
]


def test_step_wise_grpo_hand_values():
    out, metrics = StepWiseGRPOAdvantageFn()(episode_batch(STEP_ROWS))
    a = 0.5 / (math.sqrt(0.5) + EPS)  # task 0: R = 1, 0 -> mean 0.5, std sqrt(0.5)
    single = 0.5 / (1 + EPS)  # task 1 has one episode: mean 0, std 1
    expected = [-a, a, single, a, -a, single, a]
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor(expected, dtype=F64))
    torch.testing.assert_close(out["returns"], out["advantages"])
    assert metrics["episode_count"] == 3.0 and metrics["filtered_count"] == 0.0
    assert metrics["experience_count"] == 7.0

    out, _ = StepWiseGRPOAdvantageFn(enable_step_norm=True)(episode_batch(STEP_ROWS))
    lengths = [2, 3, 2, 3, 2, 2, 3]
    torch.testing.assert_close(
        out["advantages"][:, 0], torch.tensor([e / n for e, n in zip(expected, lengths)], dtype=F64)
    )


def test_step_wise_grpo_batch_std_and_threshold():
    out, _ = StepWiseGRPOAdvantageFn(std_cal_level="batch")(episode_batch(STEP_ROWS))
    bstd = _std([1.0, 0.0, 0.5])  # last-step rewards of all episodes
    a, single = 0.5 / (bstd + EPS), 0.5 / (bstd + EPS)
    torch.testing.assert_close(
        out["advantages"][:, 0], torch.tensor([-a, a, single, a, -a, single, a], dtype=F64)
    )
    out, metrics = StepWiseGRPOAdvantageFn(std_threshold=0.0)(episode_batch(STEP_ROWS))
    # task 1 (one episode) is dropped, rows 2 and 5
    assert out["action_mask"].sum(-1).tolist() == [2.0, 2.0, 0.0, 2.0, 2.0, 0.0, 2.0]
    assert out["advantages"][[2, 5]].abs().sum() == 0
    assert metrics["filtered_count"] == 2.0 and metrics["experience_count"] == 5.0
    assert metrics["skipped_group_ratio"] == 0.5


def test_step_wise_grpo_without_step_ids_takes_the_last_row_of_each_episode():
    batch = episode_batch([(0, 1, 0, 5.0), (0, 2, 0, 1.0), (0, 1, 0, 0.0), (0, 2, 0, 3.0)])
    del batch["step_ids"]
    out, _ = StepWiseGRPOAdvantageFn()(batch)
    a = 1.5 / (_std([0.0, 3.0]) + EPS)  # episode 1 ends with 0, episode 2 with 3
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([-a, a, -a, a], dtype=F64))


def random_episodes(b, g):
    """Per row: group, trajectory (nested in the group), step (ties allowed), reward."""
    n_traj = max(1, b // 2)
    traj = torch.randint(0, n_traj, (b,), generator=g)
    n_groups = max(1, n_traj // 2)
    group = traj % n_groups
    step = torch.randint(0, 3, (b,), generator=g)
    reward = torch.randint(0, 3, (b,), generator=g).double() / 2
    return group, traj, step, reward


def ref_step_wise(group, traj, step, reward, eps=EPS, step_norm=False, batch_level=False, thr=None):
    episodes = _members(traj)
    last = {e: max(rows, key=lambda r: (step[r], r)) for e, rows in episodes.items()}
    score = {e: reward[last[e]] for e in episodes}
    task = {e: group[last[e]] for e in episodes}
    by_task: dict = {}
    for e in episodes:
        by_task.setdefault(task[e], []).append(score[e])
    batch_std = (_std(list(score.values())) if len(score) > 1 else 1.0) if batch_level else None
    adv, keep = [], []
    for row in range(len(traj)):
        e = traj[row]
        g = by_task[task[e]]
        mean, std = (0.0, 1.0) if len(g) == 1 else (_mean(g), _std(g))
        a = (score[e] - mean) / ((std if batch_std is None else batch_std) + eps)
        if step_norm:
            a /= len(episodes[e])
        k = thr is None or (len(g) > 1 and _std(g) > thr)
        adv.append(a if k else 0.0)
        keep.append(k)
    return adv, keep


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "args",
    [{}, {"enable_step_norm": True}, {"std_cal_level": "batch"}, {"std_threshold": 0.2, "epsilon": 1e-3}],
    ids=str,
)
def test_step_wise_grpo_matches_reference(shape, args):
    b, t = shape
    g = torch.Generator().manual_seed(13 * b + t)
    mask = random_mask(b, t, g)
    group, traj, step, reward = random_episodes(b, g)
    batch = {
        "rewards": reward,
        "group_ids": group,
        "trajectory_ids": traj,
        "step_ids": step,
        "action_mask": mask,
    }
    out, metrics = StepWiseGRPOAdvantageFn(**args)(batch)
    adv, keep = ref_step_wise(
        group.tolist(),
        traj.tolist(),
        step.tolist(),
        reward.tolist(),
        eps=args.get("epsilon", EPS),
        step_norm=args.get("enable_step_norm", False),
        batch_level=args.get("std_cal_level") == "batch",
        thr=args.get("std_threshold"),
    )
    kept_mask = mask * torch.tensor(keep, dtype=F64).unsqueeze(-1)
    torch.testing.assert_close(out["action_mask"], kept_mask)
    torch.testing.assert_close(out["advantages"], spread(adv, kept_mask), atol=1e-6, rtol=1e-9)
    assert metrics["filtered_count"] == float(keep.count(False))


# -- gigpo ----------------------------------------------------------------------------------------


def gigpo_batch(rows, t=2):
    """``rows``: (group, trajectory, step, reward, info) per row."""
    batch = episode_batch([r[:4] for r in rows], t)
    batch["info"] = [r[4] for r in rows]
    return batch


def test_gigpo_hand_values_sparse_reward():
    # task 0, two episodes from the same initial state "s0"; episode 1 reaches "s1" then succeeds
    # (reward 1 on its last step), episode 2 also visits "s1" and fails (0).
    rows = [
        (0, 1, 0, 0.0, {"env_state_hash": "s0"}),
        (0, 1, 1, 0.0, {"env_state_hash": "s1"}),
        (0, 1, 2, 1.0, {"env_state_hash": "s2"}),
        (0, 2, 0, 0.0, {"env_state_hash": "s0"}),
        (0, 2, 1, 0.0, {"env_state_hash": "s1"}),
        (0, 2, 2, 0.0, {}),
    ]
    out, metrics = GiGPOAdvantageFn(gamma=0.5)(gigpo_batch(rows))
    # A_E: returns 1, 0 -> mean 0.5, F = 1: +-0.5 / (1 + eps)
    ae = 0.5 / (1 + EPS)
    # R_t of episode 1: 0.25, 0.5, 1; of episode 2: 0, 0, 0. Anchor s0: (0.25, 0) -> +-0.125;
    # s1: (0.5, 0) -> +-0.25; s2 alone -> 0; the hashless step -> 0.
    a_s = [0.125, 0.25, 0.0, -0.125, -0.25, 0.0]
    expected = [ae + x / (1 + EPS) for x in a_s[:3]] + [-ae + x / (1 + EPS) for x in a_s[3:]]
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor(expected, dtype=F64))
    assert metrics["anchor_groups_total"] == 3.0 and metrics["anchor_groups_size_gt1"] == 2.0
    assert metrics["anchor_group_hit_ratio"] == pytest.approx(2 / 3)


def test_gigpo_step_rewards_fnorm_std_omega_and_anchor_scope():
    rows = [
        # task 0: episode 1 has per-step rewards (a step without one counts 0)
        (0, 1, 0, 9.0, {"step_reward": 1.0, "env_state_hash": 7}),
        (0, 1, 1, 9.0, {"env_state_hash": "x"}),
        (0, 1, 2, 9.0, {"step_reward": 2.0}),
        # episode 2: no step rewards -> its scalar reward on the last step
        (0, 2, 0, 5.0, {"env_state_hash": "7"}),  # same anchor as "7" (hashes compare as str)
        (0, 2, 1, 4.0, {"env_state_hash": "x"}),
        # task 1 shares hash "x" but is another task: not the same anchor group
        (1, 3, 0, 1.0, {"env_state_hash": "x"}),
    ]
    out, _ = GiGPOAdvantageFn(omega=0.5, fnorm="std")(gigpo_batch(rows))
    # episode returns: 3 and 4 (task 0) -> mean 3.5, std sqrt(0.5); task 1 alone: 1 / (1 + eps)
    s = math.sqrt(0.5)
    ae = [-0.5 / (s + EPS)] * 3 + [0.5 / (s + EPS)] * 2 + [1 / (1 + EPS)]
    # returns-to-go (gamma 1): episode 1: 3, 2, 2; episode 2: 4, 4.
    # anchor "7": (3, 4) -> +-0.5 / (std sqrt(0.5)); anchor (task 0, "x"): (2, 4) -> +-1 / sqrt(2)
    a7, ax = 0.5 / (s + EPS), 1 / (math.sqrt(2) + EPS)
    a_s = [-a7, -ax, 0.0, a7, ax, 0.0]
    expected = [e + 0.5 * x for e, x in zip(ae, a_s)]
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor(expected, dtype=F64))


def ref_gigpo(group, traj, step, reward, info, omega=1.0, gamma=1.0, fnorm="none", eps=EPS):
    def normalize(values):
        if len(values) == 1:
            return [(values[0] - 0.0) / (1.0 + eps)]
        mean = _mean(values)
        denom = _std(values) if fnorm == "std" else 1.0
        return [(v - mean) / (denom + eps) for v in values]

    n = len(traj)
    episodes = {e: sorted(rows, key=lambda r: (step[r], r)) for e, rows in _members(traj).items()}
    ret_to_go, ep_return, ep_task = [0.0] * n, {}, {}
    for e, rows in episodes.items():
        if any("step_reward" in info[r] for r in rows):
            rs = [info[r].get("step_reward", 0.0) for r in rows]
        else:
            rs = [0.0] * (len(rows) - 1) + [reward[rows[-1]]]
        acc = 0.0
        for r, x in zip(reversed(rows), reversed(rs)):
            acc = x + gamma * acc
            ret_to_go[r] = acc
        ep_return[e], ep_task[e] = sum(rs), group[rows[-1]]
    a_e_of = {}
    for task in set(ep_task.values()):
        eps_ = [e for e in episodes if ep_task[e] == task]
        for e, a in zip(eps_, normalize([ep_return[e] for e in eps_])):
            a_e_of[e] = a
    a_s = [0.0] * n
    buckets: dict = {}
    for r in range(n):
        h = info[r].get("env_state_hash")
        if h is not None:
            buckets.setdefault((group[r], str(h)), []).append(r)
    for rows in buckets.values():
        if len(rows) > 1:
            for r, a in zip(rows, normalize([ret_to_go[x] for x in rows])):
                a_s[r] = a
    return [a_e_of[traj[r]] + omega * a_s[r] for r in range(n)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "args", [{}, {"gamma": 0.9, "fnorm": "std"}, {"omega": 0.3, "epsilon": 1e-3}], ids=str
)
def test_gigpo_matches_reference(shape, args):
    b, t = shape
    g = torch.Generator().manual_seed(19 * b + t)
    mask = random_mask(b, t, g)
    group, traj, step, reward = random_episodes(b, g)
    dense = torch.rand(int(traj.max()) + 1, generator=g) < 0.4  # these episodes have step rewards
    info = []
    for row in range(b):
        d: dict = {}
        if dense[traj[row]] and torch.rand(1, generator=g) < 0.8:
            d["step_reward"] = float(torch.randn(1, generator=g))
        h = int(torch.randint(0, 4, (1,), generator=g))
        if h < 3:
            d["env_state_hash"] = f"s{h}"
        info.append(d)
    batch = {
        "rewards": reward,
        "group_ids": group,
        "trajectory_ids": traj,
        "step_ids": step,
        "action_mask": mask,
        "info": info,
    }
    out, metrics = GiGPOAdvantageFn(**args)(batch)
    ref_args = {("eps" if k == "epsilon" else k): v for k, v in args.items()}
    expected = ref_gigpo(group.tolist(), traj.tolist(), step.tolist(), reward.tolist(), info, **ref_args)
    torch.testing.assert_close(out["advantages"], spread(expected, mask), atol=1e-6, rtol=1e-9)
    torch.testing.assert_close(out["returns"], out["advantages"])
    assert all(isinstance(v, float) for v in metrics.values())


# -- rec ------------------------------------------------------------------------------------------


class FirstNegatives(RECAdvantageFn):
    """REC with a deterministic choice: the first negatives in row order."""

    def _pick_drops(self, negatives, n):
        return negatives[:n]


def test_rec_hand_values():
    batch = {
        "rewards": torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, -1.0], dtype=F64),
        "group_ids": torch.tensor([0, 0, 0, 0, 1, 2]),
        "action_mask": torch.ones(6, 2, dtype=F64),
    }
    out, metrics = RECAdvantageFn()(dict(batch))
    # group 0: mean 0.25; singletons: mean 0
    torch.testing.assert_close(
        out["advantages"][:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25, 2.0, -1.0], dtype=F64)
    )
    assert metrics["dropped_count"] == 0.0
    # balance: group 0 has 1 positive, 3 negatives -> 2 negatives dropped (rows 1, 2 here);
    # kept (1, 0): mean 0.5, population std 0.5. The negative singleton is dropped too.
    out, metrics = FirstNegatives(drop="balance", std_normalize=True)(dict(batch))
    a = 0.5 / (0.5 + EPS)
    torch.testing.assert_close(
        out["advantages"][:, 0], torch.tensor([a, 0.0, 0.0, -a, 2 / (1 + EPS), 0.0], dtype=F64)
    )
    assert metrics["dropped_count"] == 3.0
    assert metrics["drop_balance"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert out["action_mask"].sum() == 12  # dropped rows stay in the mask (advantage 0), as upstream


def test_rec_random_drop_removes_the_surplus_of_negatives():
    torch.manual_seed(3)
    rewards = torch.tensor([1.0] * 3 + [0.0] * 7, dtype=F64)
    batch = {
        "rewards": rewards,
        "group_ids": torch.zeros(10, dtype=torch.long),
        "action_mask": torch.ones(10, 1),
    }
    out, metrics = RECAdvantageFn(drop="balance")(batch)
    adv = out["advantages"][:, 0]
    assert metrics["dropped_count"] == 4.0
    assert (adv[3:] == 0).sum() == 4  # 4 of the 7 negatives dropped, chosen at random
    torch.testing.assert_close(adv[:3], torch.full((3,), 0.5, dtype=F64))  # kept: 3 ones, 3 zeros


def ref_rec(rewards, ids, eps, std_normalize, balance):
    out = [0.0] * len(rewards)
    for rows in _members(ids).values():
        vals = [rewards[r] for r in rows]
        mean = 0.0 if len(rows) == 1 else _mean(vals)
        pos = [r for r in rows if rewards[r] >= mean]
        neg = [r for r in rows if rewards[r] < mean]
        dropped = set(neg[: len(neg) - len(pos)]) if balance and len(neg) > len(pos) else set()
        kept = [r for r in rows if r not in dropped]
        kv = [rewards[r] for r in kept]
        m, s = (0.0, 1.0) if len(kept) <= 1 else (_mean(kv), _pstd(kv))
        for r in kept:
            out[r] = (rewards[r] - m) / (s + eps) if std_normalize else rewards[r] - m
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("std_normalize", [False, True])
@pytest.mark.parametrize("drop", [None, "balance"])
def test_rec_matches_reference(shape, std_normalize, drop):
    b, t = shape
    g = torch.Generator().manual_seed(23 * b + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    for rewards in (torch.randn(b, generator=g, dtype=F64), torch.randint(0, 2, (b,), generator=g).double()):
        batch = {"rewards": rewards, "group_ids": ids, "action_mask": mask}
        out, _ = FirstNegatives(std_normalize=std_normalize, drop=drop)(batch)
        expected = ref_rec(rewards.tolist(), ids.tolist(), EPS, std_normalize, drop == "balance")
        torch.testing.assert_close(out["advantages"], spread(expected, mask), atol=1e-6, rtol=1e-9)


# -- on_policy_distill, jsd -----------------------------------------------------------------------


def distill_batch(student, teacher, mask=None):
    student = torch.tensor(student, dtype=F64)
    return {
        "old_logprob": student,
        "teacher_logprobs": torch.tensor(teacher, dtype=F64),
        "action_mask": torch.ones_like(student) if mask is None else torch.tensor(mask, dtype=F64),
    }


def test_on_policy_distill_hand_values():
    batch = distill_batch([[-1.0, -2.0, -0.5], [-0.1, -3.0, 5.0]], [[-0.5, -2.5, -0.5], [-1.1, -1.0, 0.0]])
    batch["action_mask"] = torch.tensor([[1.0, 1, 1], [1, 1, 0]], dtype=F64)
    out, metrics = OnPolicyDistillAdvantageFn(kl_coef=2.0)(batch)
    torch.testing.assert_close(
        out["advantages"], torch.tensor([[1.0, -1.0, 0.0], [-2.0, 4.0, 0.0]], dtype=F64)
    )
    torch.testing.assert_close(out["returns"], out["advantages"])
    # per-row summed s - t: 0, -1
    assert metrics["kl/mean"] == pytest.approx(-0.5)
    assert metrics["kl/std"] == pytest.approx(math.sqrt(0.5))
    assert metrics["advantages/mean"] == pytest.approx(1.0)


def jsd_ref_token(s, t, b):
    """(advantage, divergence estimate) of one token, plain math."""
    if b == 0:
        return t - s, s - t
    if b == 1:
        return math.exp(t - s) - 1, math.exp(t - s) * (t - s)
    m = math.log(b * math.exp(t) + (1 - b) * math.exp(s))
    return (1 - b) * (m - s), b * math.exp(t - s) * (t - m) + (1 - b) * (s - m)


def test_jsd_hand_values():
    s, t = math.log(0.9), math.log(0.1)  # the student likes the token, the teacher does not
    out, metrics = JSDAdvantageFn()(distill_batch([[s, t]], [[t, s]]))
    m = math.log(0.5)  # the mixture gives either token 0.5
    a0, a1 = 0.5 * (m - s), 0.5 * (m - t)
    torch.testing.assert_close(out["advantages"], torch.tensor([[a0, a1]], dtype=F64))
    assert a0 < 0 < a1  # pushed down where the teacher disagrees, up where it agrees more
    d0 = 0.5 * (0.1 / 0.9) * (t - m) + 0.5 * (s - m)
    d1 = 0.5 * (0.9 / 0.1) * (s - m) + 0.5 * (t - m)
    assert metrics["jsd/mean"] == pytest.approx(d0 + d1)
    # the endpoints
    out, _ = JSDAdvantageFn(lambda_coef=0.0, kl_coef=2.0)(distill_batch([[s]], [[t]]))
    torch.testing.assert_close(out["advantages"], torch.tensor([[2 * (t - s)]], dtype=F64))
    out, _ = JSDAdvantageFn(lambda_coef=1.0)(distill_batch([[s]], [[t]]))
    torch.testing.assert_close(out["advantages"], torch.tensor([[0.1 / 0.9 - 1]], dtype=F64))
    # temperature divides both log-probs
    out, _ = JSDAdvantageFn(lambda_coef=0.0, temperature=2.0)(distill_batch([[s]], [[t]]))
    torch.testing.assert_close(out["advantages"], torch.tensor([[(t - s) / 2]], dtype=F64))


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_jsd_advantage_is_the_policy_gradient_of_the_divergence(beta):
    # Over a whole (small) vocabulary, E_{y ~ student}[A(y) grad log student(y)] must equal
    # -grad JSD_beta(student, teacher) with respect to the student's logits.
    g = torch.Generator().manual_seed(int(beta * 10))
    logits = torch.randn(6, generator=g, dtype=F64).requires_grad_()
    teacher = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    student = torch.log_softmax(logits, -1)
    ps, pt = student.exp(), teacher.exp()

    def kl(p_log, q_log):
        return (p_log.exp() * (p_log - q_log)).sum()

    if beta == 0.0:
        divergence = kl(student, teacher)
    elif beta == 1.0:
        divergence = kl(teacher, student)
    else:
        mix = torch.log(beta * pt + (1 - beta) * ps)
        divergence = beta * kl(teacher, mix) + (1 - beta) * kl(student, mix)
    (grad,) = torch.autograd.grad(divergence, logits)

    batch = distill_batch([student.detach().tolist()], [teacher.tolist()])
    advantage = JSDAdvantageFn(lambda_coef=beta)(batch)[0]["advantages"][0]
    # grad_logits log p(y) = e_y - p
    jac = torch.eye(6, dtype=F64) - ps.detach().unsqueeze(0)
    surrogate = (ps.detach() * advantage) @ jac
    torch.testing.assert_close(surrogate, -grad, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta,temperature", [(0.0, 1.0), (0.25, 1.0), (0.5, 0.7), (1.0, 1.3)])
def test_distill_matches_reference(shape, beta, temperature):
    b, t = shape
    g = torch.Generator().manual_seed(29 * b + t)
    mask = random_mask(b, t, g)
    student = -torch.rand(b, t, generator=g, dtype=F64) * 4
    teacher = student + torch.randn(b, t, generator=g, dtype=F64)
    # padding may hold anything: it must not leak (or overflow) into the result
    student = torch.where(mask > 0, student, torch.full_like(student, -1e4))
    batch = {"old_logprob": student, "teacher_logprobs": teacher, "action_mask": mask}
    out, metrics = JSDAdvantageFn(lambda_coef=beta, kl_coef=0.5, temperature=temperature)(dict(batch))
    adv, div = [], []
    for srow, trow, mrow in zip(student.tolist(), teacher.tolist(), mask.tolist()):
        pairs = [
            jsd_ref_token(s / temperature, x / temperature, beta) if m else (0.0, 0.0)
            for s, x, m in zip(srow, trow, mrow)
        ]
        adv.append([0.5 * a for a, _ in pairs])
        div.append(sum(d for _, d in pairs))
    torch.testing.assert_close(out["advantages"], torch.tensor(adv, dtype=F64), atol=1e-6, rtol=1e-9)
    assert metrics["jsd/mean"] == pytest.approx(_mean(div), abs=1e-6)

    out, metrics = OnPolicyDistillAdvantageFn(kl_coef=0.5)(dict(batch))
    adv = [
        [0.5 * (x - s) * m for s, x, m in zip(*rows)]
        for rows in zip(student.tolist(), teacher.tolist(), mask.tolist())
    ]
    torch.testing.assert_close(out["advantages"], torch.tensor(adv, dtype=F64), atol=1e-6, rtol=1e-9)
    kl_rows = [
        sum((s - x) * m for s, x, m in zip(*rows))
        for rows in zip(student.tolist(), teacher.tolist(), mask.tolist())
    ]
    assert metrics["kl/mean"] == pytest.approx(_mean(kl_rows), abs=1e-6)


def test_jsd_rejects_bad_arguments():
    for kwargs in ({"lambda_coef": 1.5}, {"temperature": 0.0}, {"chunk_size": 0}):
        with pytest.raises(ValueError, match="jsd"):
            JSDAdvantageFn(**kwargs)


# -- clipb, clipv ---------------------------------------------------------------------------------


def clip_batch(rewards, ids, logprob, entropy, nec=None, mask=None):
    logprob = torch.tensor(logprob, dtype=F64)
    batch = {
        "rewards": torch.tensor(rewards, dtype=F64),
        "group_ids": torch.tensor(ids),
        "action_mask": torch.ones_like(logprob) if mask is None else torch.tensor(mask, dtype=F64),
        "old_logprob": logprob,
        "old_entropy": torch.tensor(entropy, dtype=F64),
    }
    if nec is not None:
        batch["old_nec"] = torch.tensor(nec, dtype=F64)
    return batch


def test_clipb_hand_values():
    # rows: A > 0, A < 0, A < 0, A = 0 (a singleton group with reward 0). log p = 0 -> p = 1, so
    # S = H: the entropies are the signal. S over the 8 tokens: mean 1, population std 1.5.
    ent = [[1.0, 1.0], [-3.0, 1.0], [1.0, 5.0], [-3.0, 5.0]]
    batch = clip_batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 1], [[0.0, 0.0]] * 4, ent)
    s = [x for row in ent for x in row]
    assert _mean(s) == 1.0 and _pstd(s) == pytest.approx(math.sqrt(8))
    out, metrics = ClipBAdvantageFn(mu=1.2)(batch)
    # negative rows with S - 1 < -1.2 sqrt(8) = -3.39: only (1, 0) (S = -3); (3, 0) has S = -3
    # but A = 0: kept
    assert out["action_mask"].tolist() == [[1, 1], [0, 1], [1, 1], [1, 1]]
    a = 2 / 3 / (_std([1.0, 0.0, 0.0]) + EPS)
    assert out["advantages"][0, 0] == pytest.approx(a)
    assert out["advantages"][1].tolist() == [0.0, pytest.approx(-a / 2)]
    assert metrics["frac_clipped"] == pytest.approx(1 / 8)
    assert metrics["frac_clipped_neg"] == pytest.approx(1 / 4) and metrics["frac_clipped_pos"] == 0.0
    assert metrics["ES"] == pytest.approx(1.0) and metrics["varS"] == pytest.approx(8.0)


def test_clipb_flat_signal_clips_nothing():
    batch = clip_batch([1.0, 0.0], [0, 0], [[-0.5, -0.5]] * 2, [[0.3, 0.3]] * 2)
    out, metrics = ClipBAdvantageFn(mu=0.0)(batch)
    assert out["action_mask"].sum() == 4 and metrics["frac_clipped"] == 0.0


def test_clipv_hand_values_and_cap():
    # log p = 0 and H = 0 -> S = 0, so D = N. Rows: A > 0, A < 0, A < 0, A = 0 (singleton).
    nec = [[9.0, 0.0], [8.0, 0.5], [0.0, 7.0], [9.5, 0.0]]
    batch = clip_batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 1], [[0.0, 0.0]] * 4, [[0.0, 0.0]] * 4, nec=nec)
    std = _pstd([x for row in nec for x in row])
    out, metrics = ClipVAdvantageFn(mu=1.5 / std, max_frac=0.5)(dict(batch))
    # candidates: negative rows with D > 1.5: (1, 0) and (2, 1); 2/8 <= 0.5: both go.
    # The positive row's 9.0 and the zero-advantage row's 9.5 stay.
    assert out["action_mask"].tolist() == [[1, 1], [0, 1], [1, 0], [1, 1]]
    assert metrics["stdD"] == pytest.approx(std)
    assert metrics["frac_clipped_neg"] == pytest.approx(0.5)
    # cap: max_frac 0.2 -> at most max(int(0.2 * 8), 1) = 1 token: the larger D (8.0) goes
    out, metrics = ClipVAdvantageFn(mu=1.5 / std, max_frac=0.2)(dict(batch))
    assert out["action_mask"].tolist() == [[1, 1], [0, 1], [1, 1], [1, 1]]
    assert metrics["frac_clipped"] == pytest.approx(1 / 8)
    assert out["advantages"][1, 0] == 0.0


def ref_clip(rewards, ids, logprob, entropy, mask, mu, nec=None, max_frac=None, eps=EPS):
    """Plain-loop Clip_B (nec None) / Clip_V: returns the kept mask."""
    per_row = ref_grpo(rewards, ids, eps)
    valid = [(i, j) for i, mrow in enumerate(mask) for j, m in enumerate(mrow) if m]
    s = {(i, j): math.exp(logprob[i][j]) * (entropy[i][j] + logprob[i][j]) for i, j in valid}
    keep = [[m for m in mrow] for mrow in mask]
    if nec is None:
        mean = _mean(list(s.values()))
        std = _pstd(list(s.values()))
        if std < 1e-12:
            return keep
        for i, j in valid:
            if per_row[i] < 0 and s[i, j] - mean < -mu * std:
                keep[i][j] = 0.0
        return keep
    d = {k: nec[k[0]][k[1]] - v for k, v in s.items()}
    std = _pstd(list(d.values()))
    if std < 1e-12:
        return keep
    cand = sorted((k for k in valid if per_row[k[0]] < 0 and d[k] > mu * std), key=lambda k: -d[k])
    cap = max(int(max_frac * len(valid)), 1)
    if len(cand) / len(valid) > max_frac:
        cand = cand[:cap]
    for i, j in cand:
        keep[i][j] = 0.0
    return keep


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mu", [0.5, 1.5])
def test_clipb_matches_reference(shape, mu):
    b, t = shape
    g = torch.Generator().manual_seed(37 * b + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    rewards = torch.randn(b, generator=g, dtype=F64)
    logprob = -torch.rand(b, t, generator=g, dtype=F64) * 3
    entropy = torch.rand(b, t, generator=g, dtype=F64) * 2
    batch = {
        "rewards": rewards,
        "group_ids": ids,
        "action_mask": mask,
        "old_logprob": logprob,
        "old_entropy": entropy,
    }
    out, metrics = ClipBAdvantageFn(mu=mu)(batch)
    keep = torch.tensor(
        ref_clip(rewards.tolist(), ids.tolist(), logprob.tolist(), entropy.tolist(), mask.tolist(), mu),
        dtype=F64,
    )
    torch.testing.assert_close(out["action_mask"], keep)
    torch.testing.assert_close(
        out["advantages"], spread(ref_grpo(rewards.tolist(), ids.tolist()), keep), atol=1e-6, rtol=1e-9
    )
    assert metrics["frac_clipped"] == pytest.approx(1 - float(keep.sum()) / float(mask.sum()))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mu,max_frac", [(0.3, 1.0), (0.3, 0.05), (1.0, 1e-4)])
def test_clipv_matches_reference(shape, mu, max_frac):
    b, t = shape
    g = torch.Generator().manual_seed(41 * b + t)
    mask, ids = random_mask(b, t, g), random_groups(b, g)
    rewards = torch.randn(b, generator=g, dtype=F64)
    logprob = -torch.rand(b, t, generator=g, dtype=F64) * 3
    entropy = torch.rand(b, t, generator=g, dtype=F64) * 2
    nec = torch.rand(b, t, generator=g, dtype=F64) * 0.5
    batch = {
        "rewards": rewards,
        "group_ids": ids,
        "action_mask": mask,
        "old_logprob": logprob,
        "old_entropy": entropy,
        "old_nec": nec,
    }
    out, _ = ClipVAdvantageFn(mu=mu, max_frac=max_frac)(batch)
    keep = ref_clip(
        rewards.tolist(),
        ids.tolist(),
        logprob.tolist(),
        entropy.tolist(),
        mask.tolist(),
        mu,
        nec.tolist(),
        max_frac,
    )
    keep = torch.tensor(keep, dtype=F64)
    torch.testing.assert_close(out["action_mask"], keep)
    torch.testing.assert_close(
        out["advantages"], spread(ref_grpo(rewards.tolist(), ids.tolist()), keep), atol=1e-6, rtol=1e-9
    )


# -- dtype, device ----------------------------------------------------------------------------------


def test_float32_inputs_give_float32_outputs():
    batch = {
        k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in conformance_batch().items()
    }
    for cls, args in CONFORMANCE:
        out, _ = cls(**args)(dict(batch))
        assert out["advantages"].dtype == torch.float32, cls.__name__


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: advantages on the batch's device"
)
@pytest.mark.parametrize("cls,args", CONFORMANCE, ids=lambda x: getattr(x, "__name__", ""))
def test_runs_on_the_device_of_the_batch(cls, args):
    if args.get("duplicate_experiences") or args.get("drop"):
        args = {k: v for k, v in args.items() if k not in ("duplicate_experiences", "drop")}  # random
    batch = conformance_batch()
    cpu, _ = cls(**args)(dict(batch))
    gpu_batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    gpu, _ = cls(**args)(gpu_batch)
    assert gpu["advantages"].device.type == "cuda"
    torch.testing.assert_close(gpu["advantages"].cpu(), cpu["advantages"])
    torch.testing.assert_close(gpu["action_mask"].cpu(), cpu["action_mask"])
