"""Advantage functions: hand-computed values, and a float64 plain-loop reference on random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import SHAPES, random_groups, random_mask

from trinity_algos.advantage import (
    AsymREAdvantageFn,
    GRPOAdvantageFn,
    OPMDAdvantageFn,
    PPOAdvantageFn,
    REINFORCEAdvantageFn,
    REINFORCEPlusPlusAdvantageFn,
    REMAXAdvantageFn,
    RLOOAdvantageFn,
)

EPS = 1e-6

# -- plain-loop references (python floats, float64) -------------------------------------------


def _groups(ids: list[int], rewards: list[float]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for i, r in zip(ids, rewards):
        out.setdefault(i, []).append(r)
    return out


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ref_grpo(rewards, ids, std_cal_level="group"):
    groups = _groups(ids, rewards)
    batch_std = _std(rewards) if len(rewards) > 1 else 1.0
    out = []
    for r, i in zip(rewards, ids):
        g = groups[i]
        mean, std = (0.0, 1.0) if len(g) == 1 else (_mean(g), _std(g))
        if std_cal_level == "batch":
            std = batch_std
        out.append((r - mean) / (std + EPS))
    return out


def ref_opmd(rewards, ids, baseline="mean", tau=1.0):
    groups = _groups(ids, rewards)
    out = []
    for r, i in zip(rewards, ids):
        g = groups[i]
        if len(g) == 1:
            b = 0.0
        elif baseline == "mean":
            b = _mean(g)
        else:
            b = tau * math.log(sum(math.exp(x / tau) for x in g) / len(g))
        out.append(r - b)
    return out


def ref_rloo(rewards, ids):
    groups = _groups(ids, rewards)
    out = []
    for k, (r, i) in enumerate(zip(rewards, ids)):
        others = [rewards[j] for j in range(len(rewards)) if ids[j] == i and j != k]
        out.append(r - _mean(others) if others else r)
    del groups
    return out


def ref_asymre(rewards, ids, shift=-0.1):
    groups = _groups(ids, rewards)
    return [r - (0.0 if len(groups[i]) == 1 else _mean(groups[i]) + shift) for r, i in zip(rewards, ids)]


def ref_whiten(values, mask):
    flat = [v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m]
    n = len(flat)
    mean = sum(flat) / n
    var = sum((x - mean) ** 2 for x in flat) / n * (n / (n - 1)) if n > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + 1e-8) * m for v, m in zip(row, mrow)] for row, mrow in zip(values, mask)
    ]


def ref_gae(rewards, values, mask, gamma, lam):
    adv_all, ret_all = [], []
    for r, v, m in zip(rewards, values, mask):
        T = len(r)
        adv = [0.0] * T
        next_v, last = 0.0, 0.0
        for t in reversed(range(T)):
            if m[t]:
                last = r[t] + gamma * next_v - v[t] + gamma * lam * last
                next_v = v[t]
            adv[t] = last
        adv_all.append(adv)
        ret_all.append([(a + vv) * mm for a, vv, mm in zip(adv, v, m)])
    return ref_whiten(adv_all, mask), ret_all


def ref_discounted(rewards, gamma):
    out = []
    for row in rewards:
        g, ret = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            g = row[t] + gamma * g
            ret[t] = g
        out.append(ret)
    return out


def spread(per_row, mask):
    return torch.tensor(
        [[a * m for m in mrow] for a, mrow in zip(per_row, mask.tolist())], dtype=torch.float64
    )


def reward_cases(b: int, g: torch.Generator):
    """Continuous rewards, binary rewards (ties), all-equal rewards."""
    return {
        "continuous": torch.randn(b, generator=g, dtype=torch.float64),
        "binary": torch.randint(0, 2, (b,), generator=g).double(),
        "all_equal": torch.full((b,), 0.3, dtype=torch.float64),
    }


# -- hand-computed values --------------------------------------------------------------------


def outcome_batch(rewards, ids, t=3, mask=None):
    rewards = torch.tensor(rewards, dtype=torch.float64)
    if mask is None:
        mask = torch.ones(len(rewards), t, dtype=torch.float64)
    return {"rewards": rewards, "group_ids": torch.tensor(ids), "action_mask": mask}


def test_grpo_hand_values():
    # group 0: rewards 1, 2, 3 -> mean 2, unbiased std 1; group 1 (single): mean 0, std 1.
    batch, _ = GRPOAdvantageFn()(outcome_batch([1.0, 2.0, 3.0, 5.0], [0, 0, 0, 1]))
    per_row = batch["advantages"][:, 0]
    expected = torch.tensor([-1 / (1 + EPS), 0.0, 1 / (1 + EPS), 5 / (1 + EPS)], dtype=torch.float64)
    torch.testing.assert_close(per_row, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(batch["returns"], batch["advantages"])


def test_grpo_zero_on_masked_tokens_and_equal_rewards_give_zero():
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.float64)
    batch, _ = GRPOAdvantageFn()(outcome_batch([0.1, 0.1], [7, 7], mask=mask))
    # float32 group statistics would leave ~1e-2 here (1e-8 rounding / 1e-6 epsilon).
    assert batch["advantages"].abs().max() < 1e-9


def test_grpo_std_threshold_drops_flat_groups():
    batch = outcome_batch([1.0, 1.0, 0.0, 1.0, 4.0], [0, 0, 1, 1, 2])
    out, metrics = GRPOAdvantageFn(std_threshold=0.0)(batch)
    # group 0 is flat (std 0) and group 2 a singleton: 3 rows dropped, mask zeroed.
    assert metrics["filtered_count"] == 3.0
    assert out["action_mask"].sum(-1).tolist() == [0.0, 0.0, 3.0, 3.0, 0.0]
    a = 0.5 / (math.sqrt(0.5) + EPS)  # group 1: rewards 0, 1 -> mean 0.5, std sqrt(0.5)
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([0, 0, -a, a, 0], dtype=torch.float64))


def test_grpo_batch_level_std():
    rewards = [1.0, 2.0, 3.0, 11.0, 12.0, 13.0]
    out, _ = GRPOAdvantageFn(std_cal_level="batch")(outcome_batch(rewards, [0, 0, 0, 1, 1, 1]))
    batch_std = _std(rewards)
    expected = torch.tensor([-1, 0, 1, -1, 0, 1], dtype=torch.float64) / (batch_std + EPS)
    torch.testing.assert_close(out["advantages"][:, 0], expected)


def test_grouped_forms_read_scalar_rewards_not_token_level_rewards():
    # Upstream's grouped grpo/opmd/asymre/reinforce score Experience.reward (computed in the
    # explorer, before any KL penalty); token_level_rewards are for the *_verl forms.
    batch = outcome_batch([1.0, 3.0], [0, 0], t=2)
    batch["token_level_rewards"] = torch.tensor([[0.0, 7.0], [0.0, -5.0]], dtype=torch.float64)
    a = 1 / (math.sqrt(2) + EPS)
    out, _ = GRPOAdvantageFn()(dict(batch))
    torch.testing.assert_close(out["advantages"][:, 1], torch.tensor([-a, a], dtype=torch.float64))
    for cls, expected in [
        (OPMDAdvantageFn, [-1.0, 1.0]),
        (AsymREAdvantageFn, [-0.9, 1.1]),
        (REINFORCEAdvantageFn, [1.0, 3.0]),
    ]:
        out, _ = cls()(dict(batch))
        torch.testing.assert_close(out["advantages"][:, 1], torch.tensor(expected, dtype=torch.float64))


def test_opmd_hand_values():
    out, _ = OPMDAdvantageFn()(outcome_batch([1.0, 3.0, 7.0], [0, 0, 1]))
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([-1.0, 1.0, 7.0], dtype=torch.float64))
    # logavgexp of (0, ln 3) = ln((1 + 3) / 2) = ln 2.
    out, _ = OPMDAdvantageFn(opmd_baseline="logavgexp")(outcome_batch([0.0, math.log(3)], [0, 0]))
    expected = torch.tensor([-math.log(2), math.log(3) - math.log(2)], dtype=torch.float64)
    torch.testing.assert_close(out["advantages"][:, 0], expected)


def test_rloo_asymre_reinforce_hand_values():
    batch = outcome_batch([1.0, 2.0, 3.0, 5.0], [0, 0, 0, 1])
    rloo, _ = RLOOAdvantageFn()(dict(batch))
    torch.testing.assert_close(
        rloo["advantages"][:, 0], torch.tensor([-1.5, 0.0, 1.5, 5.0], dtype=torch.float64)
    )
    asym, _ = AsymREAdvantageFn()(dict(batch))
    torch.testing.assert_close(
        asym["advantages"][:, 0], torch.tensor([-0.9, 0.1, 1.1, 5.0], dtype=torch.float64)
    )
    rf, _ = REINFORCEAdvantageFn()(dict(batch))
    torch.testing.assert_close(
        rf["advantages"][:, 0], torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    )


def test_gae_hand_values():
    # values 0, gamma 0.5: advantages = discounted returns (0.25, 0.5, 1), then whitened.
    batch = {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
        "values": torch.zeros(1, 3, dtype=torch.float64),
        "action_mask": torch.ones(1, 3),
    }
    out, _ = PPOAdvantageFn(gamma=0.5, lam=1.0)(batch)
    torch.testing.assert_close(out["returns"], torch.tensor([[0.25, 0.5, 1.0]], dtype=torch.float64))
    std = math.sqrt(((0.25 - 7 / 12) ** 2 + (0.5 - 7 / 12) ** 2 + (1 - 7 / 12) ** 2) / 2)
    expected = (torch.tensor([[0.25, 0.5, 1.0]], dtype=torch.float64) - 7 / 12) / math.sqrt(std**2 + 1e-8)
    torch.testing.assert_close(out["advantages"], expected)


def test_gae_skips_masked_tokens():
    # mask hole at t=1: its value (9.0) must not enter the recursion.
    batch = {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
        "values": torch.tensor([[0.2, 9.0, 0.5]], dtype=torch.float64),
        "action_mask": torch.tensor([[1.0, 0.0, 1.0]]),
    }
    out, _ = PPOAdvantageFn()(batch)
    # t=2: 1 - 0.5 = 0.5; t=0: 0 + 0.5 - 0.2 + 0.5 = 0.8; returns = adv + values.
    torch.testing.assert_close(out["returns"], torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64))
    assert out["advantages"][0, 1] == 0


def test_reinforceplusplus_and_remax_hand_values():
    batch = {
        "rewards": torch.tensor([1.0, 0.0], dtype=torch.float64),
        "action_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
    }
    out, _ = REINFORCEPlusPlusAdvantageFn()(dict(batch))
    # returns-to-go: row 0 (1, 1, 0), row 1 (0, 0, 0); valid tokens 1,1,0,0,0 -> mean 0.4, var 0.3.
    torch.testing.assert_close(out["returns"], torch.tensor([[1.0, 1, 0], [0, 0, 0]], dtype=torch.float64))
    hi, lo = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(
        out["advantages"], torch.tensor([[hi, hi, 0], [lo, lo, lo]], dtype=torch.float64)
    )
    batch["info"] = [{"reward_baseline": 0.25}, {"reward_baseline": 0.5}]
    out, _ = REMAXAdvantageFn()(dict(batch))
    torch.testing.assert_close(
        out["advantages"], torch.tensor([[0.75, 0.75, 0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    )


def test_remax_missing_baseline_names_rows():
    batch = {
        "rewards": torch.ones(2),
        "action_mask": torch.ones(2, 2),
        "info": [{"reward_baseline": 0.0}, {}],
    }
    with pytest.raises(KeyError, match=r"rows \[1\]"):
        REMAXAdvantageFn()(batch)


def test_missing_key_message_names_the_fn():
    with pytest.raises(KeyError, match=r"grpo.*group_ids"):
        GRPOAdvantageFn()({"rewards": torch.ones(2), "action_mask": torch.ones(2, 2)})


# -- random inputs against the references ---------------------------------------------------------

OUTCOME = [
    (GRPOAdvantageFn, {}, lambda r, i: ref_grpo(r, i)),
    (GRPOAdvantageFn, {"std_cal_level": "batch"}, lambda r, i: ref_grpo(r, i, "batch")),
    (OPMDAdvantageFn, {}, lambda r, i: ref_opmd(r, i)),
    (
        OPMDAdvantageFn,
        {"opmd_baseline": "logavgexp", "tau": 0.5},
        lambda r, i: ref_opmd(r, i, "logavgexp", 0.5),
    ),
    (RLOOAdvantageFn, {}, ref_rloo),
    (AsymREAdvantageFn, {}, lambda r, i: ref_asymre(r, i)),
    (REINFORCEAdvantageFn, {}, lambda r, i: list(r)),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cls,args,ref", OUTCOME, ids=lambda x: getattr(x, "__name__", None))
def test_outcome_advantages_match_reference(cls, args, ref, shape):
    b, t = shape
    g = torch.Generator().manual_seed(b * 100 + t)
    mask = random_mask(b, t, g)
    ids = random_groups(b, g)
    for case, rewards in reward_cases(b, g).items():
        batch = {"rewards": rewards, "group_ids": ids, "action_mask": mask}
        out, _ = cls(**args)(batch)
        expected = spread(ref(rewards.tolist(), ids.tolist()), mask)
        # rtol covers batch-std GRPO on equal rewards: a singleton gets 0.3 / (~1e-17 + 1e-6) ~ 3e5,
        # where the last bits of the ~1e-17 std (summation order) show up above 1e-6 absolute.
        torch.testing.assert_close(out["advantages"], expected, atol=1e-6, rtol=1e-9, msg=case)
        torch.testing.assert_close(out["returns"], expected, atol=1e-6, rtol=1e-9, msg=case)


@pytest.mark.parametrize("shape", SHAPES[1:])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95)])
def test_gae_matches_reference(shape, gamma, lam):
    b, t = shape
    g = torch.Generator().manual_seed(7 * b + t)
    mask = random_mask(b, t, g, empty_row=False)
    rewards = torch.randn(b, t, generator=g, dtype=torch.float64) * mask
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    out, _ = PPOAdvantageFn(gamma=gamma, lam=lam)(
        {"token_level_rewards": rewards, "values": values, "action_mask": mask}
    )
    adv, ret = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(out["advantages"], torch.tensor(adv, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(out["returns"], torch.tensor(ret, dtype=torch.float64), atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", SHAPES[1:])
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_reinforceplusplus_matches_reference(shape, gamma):
    b, t = shape
    g = torch.Generator().manual_seed(3 * b + t)
    mask = random_mask(b, t, g)
    rewards = torch.randn(b, t, generator=g, dtype=torch.float64) * mask
    out, _ = REINFORCEPlusPlusAdvantageFn(gamma=gamma)({"token_level_rewards": rewards, "action_mask": mask})
    ret = [
        [x * m for x, m in zip(row, mrow)]
        for row, mrow in zip(ref_discounted(rewards.tolist(), gamma), mask.tolist())
    ]
    torch.testing.assert_close(out["returns"], torch.tensor(ret, dtype=torch.float64), atol=1e-6, rtol=0)
    adv = torch.tensor(ref_whiten(ret, mask.tolist()), dtype=torch.float64)
    torch.testing.assert_close(out["advantages"], adv, atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_remax_matches_reference(shape):
    b, t = shape
    g = torch.Generator().manual_seed(11 * b + t)
    mask = random_mask(b, t, g)
    rewards = torch.randn(b, generator=g, dtype=torch.float64)
    baselines = torch.randn(b, generator=g, dtype=torch.float64)
    info = [{"reward_baseline": float(x)} for x in baselines]
    out, _ = REMAXAdvantageFn()({"rewards": rewards, "action_mask": mask, "info": info})
    expected = []
    for r, bl, mrow in zip(rewards.tolist(), baselines.tolist(), mask.tolist()):
        # the reward sits on the last valid token, so every valid token's return-to-go is r
        expected.append([(r - bl) * m for m in mrow])
    torch.testing.assert_close(
        out["advantages"], torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_float32_inputs_give_float32_outputs():
    batch = {
        "rewards": torch.tensor([0.0, 1.0]),
        "group_ids": torch.tensor([0, 0]),
        "action_mask": torch.ones(2, 3),
    }
    out, _ = GRPOAdvantageFn()(batch)
    assert out["advantages"].dtype == torch.float32


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: advantages on the batch's device"
)
@pytest.mark.parametrize("cls,args,ref", OUTCOME, ids=lambda x: getattr(x, "__name__", None))
def test_outcome_advantages_run_on_the_device_of_the_batch(cls, args, ref):
    # The trainer computes advantages where its batch lives; group statistics once built their
    # accumulators on the CPU and failed on a GPU batch.
    g = torch.Generator().manual_seed(0)
    mask, ids = random_mask(8, 5, g), random_groups(8, g)
    rewards = torch.randn(8, generator=g, dtype=torch.float64)
    cpu, _ = cls(**args)({"rewards": rewards, "group_ids": ids, "action_mask": mask})
    batch = {"rewards": rewards.cuda(), "group_ids": ids.cuda(), "action_mask": mask.cuda()}
    gpu, _ = cls(**args)(batch)
    assert gpu["advantages"].device.type == "cuda"
    torch.testing.assert_close(gpu["advantages"].cpu(), cpu["advantages"])
