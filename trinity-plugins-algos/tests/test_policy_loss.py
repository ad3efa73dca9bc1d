"""Policy losses: hand-computed values, gradients, and float64 plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import MODES, SHAPES, random_mask, ref_agg

from trinity_algos.policy_loss import (
    CISPOPolicyLossFn,
    DPOLossFn,
    GSPOPolicyLossFn,
    MIXPolicyLossFn,
    OPMDPolicyLossFn,
    PPOPolicyLossFn,
    SFTLossFn,
)

# -- plain-loop references -----------------------------------------------------------------


def ref_ppo_tokens(lp, old, adv, low, high, c):
    out = []
    for lr, orow, ar in zip(lp, old, adv):
        row = []
        for x, o, a in zip(lr, orow, ar):
            ratio = math.exp(max(-20.0, min(20.0, x - o)))
            clipped = min(max(ratio, 1 - low), 1 + high)
            loss = max(-a * ratio, -a * clipped)
            if a < 0:
                loss = min(loss, -a * c)
            row.append(loss)
        out.append(row)
    return out


def as_lists(*tensors):
    return [t.tolist() for t in tensors]


def random_inputs(shape, seed, scale=0.5):
    b, t = shape
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(b, t, g)
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logprob + scale * torch.randn(b, t, generator=g, dtype=torch.float64)
    ref = logprob + scale * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    return logprob, old, ref, adv, mask


# -- PPO --------------------------------------------------------------------------------------


def test_ppo_hand_values():
    # rows: A=+1 ratio 1.5 (clipped to 1.2); A=-1 ratio 4 (dual clip caps 4 at 3); A=-1 ratio 0.5 (clipped 0.8)
    old = torch.zeros(3, 1, dtype=torch.float64)
    logprob = torch.tensor([[math.log(1.5)], [math.log(4.0)], [math.log(0.5)]], dtype=torch.float64)
    adv = torch.tensor([[1.0], [-1.0], [-1.0]], dtype=torch.float64)
    loss, m = PPOPolicyLossFn()(logprob, old_logprob=old, action_mask=torch.ones(3, 1), advantages=adv)
    assert loss.item() == pytest.approx((-1.2 + 3.0 + 0.8) / 3, abs=1e-12)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    assert m["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(4) + math.log(0.5)) / 3)
    assert m["pg_loss"] == pytest.approx(loss.item())


def test_ppo_asymmetric_clip_and_gradient():
    # ratio 1.25 with A > 0: inside clip_range_high 0.28 -> unclipped, d loss / d logprob = -A * ratio.
    logprob = torch.tensor([[math.log(1.25)]], dtype=torch.float64, requires_grad=True)
    fn = PPOPolicyLossFn(clip_range_low=0.2, clip_range_high=0.28)
    loss, m = fn(
        logprob, old_logprob=torch.zeros(1, 1), action_mask=torch.ones(1, 1), advantages=torch.tensor([[2.0]])
    )
    loss.backward()
    assert loss.item() == pytest.approx(-2.5)
    assert logprob.grad.item() == pytest.approx(-2.5)
    assert m["pg_clipfrac"] == 0.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_ppo_matches_reference(shape, mode):
    logprob, old, _, adv, mask = random_inputs(shape, seed=shape[0] * 31 + shape[1], scale=0.4)
    fn = PPOPolicyLossFn(clip_range_low=0.2, clip_range_high=0.3, loss_agg_mode=mode)
    loss, _ = fn(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    lp, o, a, m = as_lists(logprob, old, adv, mask)
    assert loss.item() == pytest.approx(ref_agg(ref_ppo_tokens(lp, o, a, 0.2, 0.3, 3.0), m, mode), abs=1e-6)


def test_ppo_rejects_bad_clip_ratio_c():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PPOPolicyLossFn(clip_ratio_c=1.0)


# -- SFT / OPMD -------------------------------------------------------------------------------


def test_sft_and_opmd_hand_values():
    logprob = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = SFTLossFn()(logprob, action_mask=mask)
    assert loss.item() == pytest.approx(2.0) and m["sft_loss"] == pytest.approx(2.0)
    adv = torch.tensor([[1.0, 1.0], [-1.0, 5.0]], dtype=torch.float64)
    loss, _ = OPMDPolicyLossFn(tau=1.0)(logprob, action_mask=mask, advantages=adv)
    assert loss.item() == pytest.approx(((1 + 2 - 3) / 3) / 2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_sft_opmd_match_reference(shape, mode):
    logprob, _, _, adv, mask = random_inputs(shape, seed=shape[0] + 5 * shape[1])
    lp, a, m = as_lists(logprob, adv, mask)
    loss, _ = SFTLossFn(loss_agg_mode=mode)(logprob, action_mask=mask)
    assert loss.item() == pytest.approx(ref_agg([[-x for x in r] for r in lp], m, mode), abs=1e-6)
    loss, _ = OPMDPolicyLossFn(tau=0.5, loss_agg_mode=mode)(logprob, action_mask=mask, advantages=adv)
    tokens = [[-ai * x for x, ai in zip(r, ar)] for r, ar in zip(lp, a)]
    assert loss.item() == pytest.approx(ref_agg(tokens, m, mode) / 1.5, abs=1e-6)


# -- DPO --------------------------------------------------------------------------------------


def test_dpo_hand_values():
    # chosen: policy - ref = +1 over the pair's tokens; rejected: -1 -> z = 2, beta z = 0.2.
    logprob = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.5], [-1.5, -1.5]], dtype=torch.float64)
    mask = torch.ones(2, 2)
    loss, m = DPOLossFn()(logprob, ref_logprob=ref, action_mask=mask)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-12)
    assert m["chosen_reward"] == pytest.approx(0.1) and m["rejected_reward"] == pytest.approx(-0.1)
    assert m["accuracy"] == 1.0 and m["margin"] == pytest.approx(0.2)
    smoothed, _ = DPOLossFn(label_smoothing=0.1)(logprob, ref_logprob=ref, action_mask=mask)
    expected = 0.9 * math.log1p(math.exp(-0.2)) + 0.1 * math.log1p(math.exp(0.2))
    assert smoothed.item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("pairs,t", [(1, 1), (2, 5), (4, 9)])
def test_dpo_matches_reference(pairs, t):
    logprob, _, ref, _, mask = random_inputs((2 * pairs, t), seed=pairs * 13 + t)
    mask[:, 0] = 1.0
    beta, ls = 0.3, 0.05
    loss, _ = DPOLossFn(beta=beta, label_smoothing=ls)(logprob, ref_logprob=ref, action_mask=mask)
    lp, rf, m = as_lists(logprob, ref, mask)

    def ratio(i):
        return sum((x - y) * mm for x, y, mm in zip(lp[i], rf[i], m[i]))

    def logsig(x):
        return -math.log1p(math.exp(-x))

    losses = []
    for k in range(pairs):
        z = beta * (ratio(2 * k) - ratio(2 * k + 1))
        losses.append(-(1 - ls) * logsig(z) - ls * logsig(-z))
    assert loss.item() == pytest.approx(sum(losses) / pairs, abs=1e-6)


def test_dpo_odd_rows_is_an_error():
    with pytest.raises(ValueError, match="pairs"):
        DPOLossFn()(torch.zeros(3, 2), ref_logprob=torch.zeros(3, 2), action_mask=torch.ones(3, 2))


# -- GSPO / CISPO -----------------------------------------------------------------------------


def ref_gspo(lp, old, adv, mask, low, high, mode):
    tokens = []
    for lr, orow, ar, mr in zip(lp, old, adv, mask):
        valid = [x - o for x, o, m in zip(lr, orow, mr) if m]
        s = math.exp(min(10.0, sum(valid) / len(valid))) if valid else 1.0
        clipped = min(max(s, 1 - low), 1 + high)
        tokens.append([max(-a * s, -a * clipped) for a in ar])
    return ref_agg(tokens, mask, mode)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_matches_reference(shape, mode):
    # small log-ratio noise so some sequences land inside the narrow clip band and some outside
    logprob, old, _, adv, mask = random_inputs(shape, seed=shape[0] * 3 + shape[1], scale=3e-4)
    loss, _ = GSPOPolicyLossFn(loss_agg_mode=mode)(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    expected = ref_gspo(*as_lists(logprob, old, adv, mask), 3e-4, 4e-4, mode)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_gspo_gradient_flows_per_token_with_sequence_ratio():
    # logprob == old_logprob: s = 1, unclipped; d/d logprob_t = -A_t * s / n_valid (seq-mean-token-mean).
    logprob = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = GSPOPolicyLossFn()(
        logprob, old_logprob=logprob.detach().clone(), action_mask=mask, advantages=adv
    )
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.5, -1.0, 0.0]], dtype=torch.float64))
    assert loss.item() == pytest.approx(-1.5)


@pytest.mark.parametrize("shape", SHAPES)
def test_cispo_matches_reference_and_stops_gradient_through_weight(shape):
    logprob, old, _, adv, mask = random_inputs(shape, seed=shape[0] * 17 + shape[1], scale=0.4)
    logprob.requires_grad_(True)
    loss, _ = CISPOPolicyLossFn(clip_range_low=0.2, clip_range_high=0.28)(
        logprob, old_logprob=old, action_mask=mask, advantages=adv
    )
    lp, o, a, m = as_lists(logprob.detach(), old, adv, mask)
    weights = [[min(max(math.exp(x - y), 0.8), 1.28) for x, y in zip(r1, r2)] for r1, r2 in zip(lp, o)]
    tokens = [[-ai * w * x for x, w, ai in zip(r, wr, ar)] for r, wr, ar in zip(lp, weights, a)]
    assert loss.item() == pytest.approx(ref_agg(tokens, m, "token-mean"), abs=1e-6)
    loss.backward()
    n = sum(x for r in m for x in r)
    grad = [[-ai * w * mm / n for w, ai, mm in zip(wr, ar, mr)] for wr, ar, mr in zip(weights, a, m)]
    torch.testing.assert_close(logprob.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-9, rtol=0)


def test_cispo_mask_clip_hand_values():
    # ratio 2 with A > 0 exceeds 1 + 0.28: that token is dropped with enable_mask_clip.
    logprob = torch.tensor([[math.log(2.0), 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    loss, m = CISPOPolicyLossFn(enable_mask_clip=True)(
        logprob, old_logprob=old, action_mask=torch.ones(1, 2), advantages=adv
    )
    assert m["masked_frac"] == 0.5
    assert loss.item() == pytest.approx(0.0)  # kept token has logprob 0


# -- MIX --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES[2:])
def test_mix_matches_reference(shape):
    logprob, old, _, adv, mask = random_inputs(shape, seed=shape[0] * 19 + shape[1], scale=0.3)
    expert = torch.arange(shape[0]) % 3 == 0
    mu = 0.25
    loss, metrics = MIXPolicyLossFn(mu=mu)(
        logprob, old_logprob=old, action_mask=mask, advantages=adv, expert_mask=expert
    )
    lp, o, a, m = as_lists(logprob, old, adv, mask)
    e = expert.tolist()
    usual_rows = [i for i in range(shape[0]) if not e[i]]
    expert_rows = [i for i in range(shape[0]) if e[i]]
    ppo = ref_agg(
        ref_ppo_tokens(
            [lp[i] for i in usual_rows], [o[i] for i in usual_rows], [a[i] for i in usual_rows], 0.2, 0.2, 3.0
        ),
        [m[i] for i in usual_rows],
        "token-mean",
    )
    sft = ref_agg([[-x for x in lp[i]] for i in expert_rows], [m[i] for i in expert_rows], "token-mean")
    assert loss.item() == pytest.approx((1 - mu) * ppo + mu * sft, abs=1e-6)
    assert metrics["expert/sft_loss"] == pytest.approx(sft, abs=1e-6)
    assert metrics["usual/pg_loss"] == pytest.approx(ppo, abs=1e-6)


def test_mix_all_usual_equals_scaled_ppo():
    logprob, old, _, adv, mask = random_inputs((4, 5), seed=1)
    loss, _ = MIXPolicyLossFn(mu=0.1)(
        logprob,
        old_logprob=old,
        action_mask=mask,
        advantages=adv,
        expert_mask=torch.zeros(4, dtype=torch.bool),
    )
    ppo, _ = PPOPolicyLossFn()(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    assert loss.item() == pytest.approx(0.9 * ppo.item(), abs=1e-12)
