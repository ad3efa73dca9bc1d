"""TOPR, sPPO, REC, SAPO, importance sampling, CHORD (sft_is, sft_phi, mix_chord) and MIX's
batch-size-aware weighting: hand-computed values and gradients, and float64 plain-loop references
(values and gradients) on seeded random inputs for every ``loss_agg_mode``."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import MODES, SHAPES, random_mask, ref_agg, ref_agg_grad

from trinity.testing import check_component
from trinity.trainer.micro_batch import micro_batch_weights, split_by_rows, split_by_tokens
from trinity_algos.policy_loss import (
    ImportanceSamplingPolicyLossFn,
    MIXCHORDPolicyLossFn,
    MIXPolicyLossFn,
    RECPolicyLossFn,
    SAPOPolicyLossFn,
    SFTISLossFn,
    SFTPhiLossFn,
    SPPOPolicyLossFn,
    TOPRPolicyLossFn,
)
from trinity_algos.policy_loss.chord import mu_schedule

# -- plain-loop references -----------------------------------------------------------------


def ref_grad(token_grads, mask, mode):
    """Gradient wrt logprob of agg(per-token loss), from d(token loss)/d(logprob) per token."""
    weights = ref_agg_grad(mask, mode)
    return torch.tensor(
        [[g * w for g, w in zip(gr, wr)] for gr, wr in zip(token_grads, weights)], dtype=torch.float64
    )


def ref_ppo_token(x, o, a, low=0.2, high=0.2, c=3.0):
    ratio = math.exp(max(-20.0, min(20.0, x - o)))
    loss = max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high))
    return min(loss, -a * c) if a < 0 else loss


def as_lists(*tensors):
    return [t.detach().tolist() for t in tensors]


def random_inputs(shape, seed, scale=0.5):
    b, t = shape
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(b, t, g)
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logprob + scale * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    return logprob.requires_grad_(True), old, adv, mask


def token_map(fn, *lists):
    """Apply ``fn`` elementwise over equally shaped nested lists."""
    return [[fn(*vals) for vals in zip(*rows)] for rows in zip(*lists)]


def check_against_reference(loss_fn, mode, seed, token_loss, token_grad, scale=0.5, shape=(8, 7)):
    logprob, old, adv, mask = random_inputs(shape, seed, scale)
    loss, metrics = loss_fn(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    lp, o, a, m = as_lists(logprob, old, adv, mask)
    assert loss.item() == pytest.approx(ref_agg(token_map(token_loss, lp, o, a), m, mode), abs=1e-6)
    loss.backward()
    expected = ref_grad(token_map(token_grad, lp, o, a), m, mode)
    torch.testing.assert_close(logprob.grad, expected, atol=1e-9, rtol=1e-7)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    return metrics


# -- TOPR -------------------------------------------------------------------------------------


def test_topr_hand_values_and_gradient():
    # A=+1 ratio 2 -> alpha 1; A=-1 ratio 0.5 -> alpha 0.5; A=-1 ratio 2 -> alpha clipped to 1.
    old = torch.zeros(1, 3, dtype=torch.float64)
    logprob = torch.tensor([[math.log(2.0), math.log(0.5), math.log(2.0)]], dtype=torch.float64)
    logprob.requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, m = TOPRPolicyLossFn()(logprob, old_logprob=old, action_mask=torch.ones(1, 3), advantages=adv)
    lp = logprob.detach()[0]
    assert loss.item() == pytest.approx((-lp[0] + 0.5 * lp[1] + lp[2]).item() / 3, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-1 / 3, 0.5 / 3, 1 / 3]], dtype=torch.float64))
    assert m["avg_alpha"] == pytest.approx(2.5 / 3)
    assert m["avg_ratio"] == pytest.approx(4.5 / 3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_topr_matches_reference(mode, threshold):
    def alpha(x, o, a):
        return min(math.exp(x - o), 1.0) if a <= threshold else 1.0

    fn = TOPRPolicyLossFn(advantage_threshold=threshold, loss_agg_mode=mode)
    check_against_reference(
        fn, mode, 3, lambda x, o, a: -alpha(x, o, a) * a * x, lambda x, o, a: -alpha(x, o, a) * a
    )


# -- sPPO -------------------------------------------------------------------------------------


def test_sppo_hand_values_and_gradient():
    # ratios 1.2 (inside [1/1.3, 1.3]), 1.5 (above), 0.7 (below 1/1.3 = 0.769)
    old = torch.zeros(1, 3, dtype=torch.float64)
    logprob = torch.tensor([[math.log(1.2), math.log(1.5), math.log(0.7)]], dtype=torch.float64)
    logprob.requires_grad_(True)
    adv = torch.tensor([[2.0, 1.0, -1.0]], dtype=torch.float64)
    loss, m = SPPOPolicyLossFn(epsilon=0.3)(
        logprob, old_logprob=old, action_mask=torch.ones(1, 3), advantages=adv
    )
    assert loss.item() == pytest.approx(-2.0 * math.log(1.2) / 3, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-2 / 3, 0.0, 0.0]], dtype=torch.float64))
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("mode", MODES)
def test_sppo_matches_reference(mode):
    eps = 0.3

    def inside(x, o):
        return 1.0 / (1 + eps) <= math.exp(x - o) <= 1 + eps

    check_against_reference(
        SPPOPolicyLossFn(epsilon=eps, loss_agg_mode=mode),
        mode,
        5,
        lambda x, o, a: -a * (x - o) if inside(x, o) else 0.0,
        lambda x, o, a: -a if inside(x, o) else 0.0,
        scale=0.3,
    )


# -- importance sampling ----------------------------------------------------------------------


def test_importance_sampling_hand_values():
    logprob = torch.tensor([[math.log(1.5), 0.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    loss, m = ImportanceSamplingPolicyLossFn()(
        logprob, old_logprob=torch.zeros(1, 2), action_mask=torch.ones(1, 2), advantages=adv
    )
    assert loss.item() == pytest.approx((-3.0 + 1.0) / 2)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-1.5, 0.5]], dtype=torch.float64))
    assert m["ratio/mean"] == pytest.approx(1.25)
    assert m["approx_kl"] == pytest.approx(-math.log(1.5) / 2)


@pytest.mark.parametrize("mode", MODES)
def test_importance_sampling_matches_reference(mode):
    def ratio(x, o):
        return math.exp(max(-20.0, min(20.0, x - o)))

    check_against_reference(
        ImportanceSamplingPolicyLossFn(loss_agg_mode=mode),
        mode,
        7,
        lambda x, o, a: -a * ratio(x, o),
        lambda x, o, a: -a * ratio(x, o),
    )


# -- SAPO -------------------------------------------------------------------------------------


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_hand_values_and_gradient():
    # r = 1: gate = sigma(0) * 4 / tau = 2 / tau; gradient weight 4 sigma (1 - sigma) r = 1
    logprob = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    loss, m = SAPOPolicyLossFn(tau_pos=1.0, tau_neg=2.0)(
        logprob, old_logprob=torch.zeros(1, 2), action_mask=torch.ones(1, 2), advantages=adv
    )
    assert loss.item() == pytest.approx((-1.0 * 2.0 + 2.0 * 1.0) / 2)
    loss.backward()
    # on-policy, SAPO's gradient is the plain policy gradient -A / n
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.5, 1.0]], dtype=torch.float64))
    assert m["avg_soft_gate"] == pytest.approx(1.5)
    assert m["pos_adv_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_sapo_gate_fades_off_policy(adv):
    # Relative to the unclipped importance-sampled gradient (-A r), SAPO's weight w = 4 sigma (1 - sigma)
    # is 1 on-policy and decays as the ratio leaves 1 in either direction; faster for A < 0.
    weights = []
    for ratio in (0.25, 1.0, 3.0):
        logprob = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
        loss, _ = SAPOPolicyLossFn(tau_pos=1.0, tau_neg=3.0)(
            logprob,
            old_logprob=torch.zeros(1, 1),
            action_mask=torch.ones(1, 1),
            advantages=torch.full((1, 1), adv, dtype=torch.float64),
        )
        loss.backward()
        weights.append(logprob.grad.item() / (-adv * ratio))
    tau = 1.0 if adv > 0 else 3.0
    expected = [4 * sigmoid(tau * (r - 1)) * (1 - sigmoid(tau * (r - 1))) for r in (0.25, 1.0, 3.0)]
    assert weights == pytest.approx(expected, abs=1e-12)
    assert weights[1] == pytest.approx(1.0)
    assert weights[0] < weights[1] and weights[2] < weights[1]


@pytest.mark.parametrize("mode", MODES)
def test_sapo_matches_reference(mode):
    tp, tn = 1.0, 1.05

    def tau(a):
        return tp if a > 0 else tn

    def loss(x, o, a):
        r = math.exp(x - o)
        return -a * sigmoid(tau(a) * (r - 1)) * 4 / tau(a)

    def grad(x, o, a):
        r = math.exp(x - o)
        s = sigmoid(tau(a) * (r - 1))
        return -a * 4 * s * (1 - s) * r

    check_against_reference(SAPOPolicyLossFn(tp, tn, loss_agg_mode=mode), mode, 9, loss, grad)


def test_sapo_rejects_tau_neg_below_tau_pos():
    with pytest.raises(ValueError, match="tau_neg"):
        SAPOPolicyLossFn(tau_pos=2.0, tau_neg=1.0)


# -- REC --------------------------------------------------------------------------------------


def ref_rec(lp, old, adv, mask, fn):
    """Per-token REC loss and its derivative wrt logprob (plain loops)."""
    el, eh, elp, ehp = fn.epsilon_low, fn.epsilon_high, fn.epsilon_low_prime, fn.epsilon_high_prime
    losses, grads = [], []
    for xr, orow, ar, mr in zip(lp, old, adv, mask):
        valid = [x - o for x, o, m in zip(xr, orow, mr) if m]
        s = math.exp(sum(valid) / len(valid)) if valid else 1.0
        lrow, grow = [], []
        for x, o, a in zip(xr, orow, ar):
            r = math.exp(x - o)
            if fn.clip_mode == "two-side":
                keep = 1 - el <= r <= 1 + eh
            elif fn.clip_mode == "one-side":
                keep = (a >= 0 and r <= 1 + eh) or (a <= 0 and r >= 1 - el)
            elif fn.clip_mode == "gspo-one-side":
                keep = (a >= 0 and s <= 1 + eh) or (a <= 0 and s >= 1 - el)
            elif fn.clip_mode == "ring":
                keep = (1 - el <= r <= 1 + eh) or (a >= 0 and r <= 1 - elp) or (a <= 0 and r >= 1 + ehp)
            else:
                keep = True
            w = {
                "none": a,
                "importance_sampling": a * r,
                "truncated_importance_sampling": a * min(max(r, 1 - elp), 1 + ehp),
                "gspo_importance_sampling": a * s,
                "advantage": a * math.exp(a / fn.temp),
            }[fn.weight]
            if fn.fix_opd_advantage:
                w += o - x
            loss, grad = (-w * x, -w) if keep else (0.0, 0.0)
            if fn.regularizer == "forward-kl":
                loss, grad = loss - fn.regularizer_coef * x, grad - fn.regularizer_coef
            elif fn.regularizer == "k2":
                loss += fn.regularizer_coef * (x - o) ** 2
                grad += 2 * fn.regularizer_coef * (x - o)
            lrow.append(loss)
            grow.append(grad)
        losses.append(lrow)
        grads.append(grow)
    return losses, grads


REC_CASES = [
    {"clip_mode": c, "weight": w}
    for c in ("none", "one-side", "two-side", "ring", "gspo-one-side")
    for w in ("none", "importance_sampling", "truncated_importance_sampling", "gspo_importance_sampling")
] + [
    {"weight": "advantage", "temp": 2.0},
    {"regularizer": "k2", "regularizer_coef": 0.3, "clip_mode": "one-side"},
    {"regularizer": "forward-kl", "regularizer_coef": 0.1, "clip_mode": "two-side"},
    {"fix_opd_advantage": True, "weight": "importance_sampling"},
    {"clip_mode": "ring", "epsilon_low_prime": 0.3, "epsilon_high_prime": 0.5},
]


@pytest.mark.parametrize("args", REC_CASES, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_rec_matches_reference(args, mode):
    fn = RECPolicyLossFn(**args, loss_agg_mode=mode)
    logprob, old, adv, mask = random_inputs((8, 7), seed=11, scale=0.6)
    loss, metrics = fn(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    lp, o, a, m = as_lists(logprob, old, adv, mask)
    token_losses, token_grads = ref_rec(lp, o, a, m, fn)
    agg = "seq-mean-token-mean" if fn.clip_mode == "gspo-one-side" else mode
    assert fn.loss_agg_mode == agg  # the trainer weights micro-batches by what the loss uses
    assert loss.item() == pytest.approx(ref_agg(token_losses, m, agg), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logprob.grad, ref_grad(token_grads, m, agg), atol=1e-9, rtol=1e-7)
    assert 0.0 <= metrics["pg_clipfrac"] <= 1.0


def test_rec_hand_values_one_side():
    # A=+1 ratio 1.5 > 1.2: dropped; A=-1 ratio 0.5 < 0.8: dropped; A=+1 ratio 0.5: kept (one side)
    old = torch.zeros(1, 3, dtype=torch.float64)
    logprob = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    logprob.requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, m = RECPolicyLossFn(clip_mode="one-side")(
        logprob, old_logprob=old, action_mask=torch.ones(1, 3), advantages=adv
    )
    assert loss.item() == pytest.approx(-math.log(0.5) / 3)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[0.0, 0.0, -1 / 3]], dtype=torch.float64))
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)


def test_rec_rejects_unknown_modes():
    for bad in ({"clip_mode": "both"}, {"weight": "is"}, {"regularizer": "l2"}, {"epsilon_low": 1.5}):
        with pytest.raises(ValueError, match="rec"):
            RECPolicyLossFn(**bad)


# -- CHORD: sft_is / sft_phi / mu schedule / mix_chord ---------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_sft_is_and_phi_match_reference(shape, mode):
    logprob, _, _, mask = random_inputs(shape, seed=shape[0] * 7 + shape[1])
    lp, m = as_lists(logprob, mask)
    for fn, weight in (
        (SFTISLossFn(loss_agg_mode=mode), lambda p: p),
        (SFTPhiLossFn(loss_agg_mode=mode), lambda p: p * (1 - p)),
    ):
        logprob.grad = None
        loss, metrics = fn(logprob, action_mask=mask)
        tokens = [[-weight(math.exp(x)) * x for x in r] for r in lp]
        assert loss.item() == pytest.approx(ref_agg(tokens, m, mode), abs=1e-6)
        assert next(iter(metrics.values())) == pytest.approx(loss.item())
        if mask.sum() == 0:
            continue
        loss.backward()
        grads = [[-weight(math.exp(x)) for x in r] for r in lp]
        torch.testing.assert_close(logprob.grad, ref_grad(grads, m, mode), atol=1e-9, rtol=1e-7)


def test_sft_phi_hand_values_and_cutoff():
    # p = 0.5 -> phi 0.25; p = 0.9 -> phi 0.09. With cutoff 0.8 the p = 0.9 token gives log(0.8), no gradient.
    logprob = torch.tensor([[math.log(0.5), math.log(0.9)]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2)
    loss, _ = SFTPhiLossFn()(logprob, action_mask=mask)
    assert loss.item() == pytest.approx((-0.25 * math.log(0.5) - 0.09 * math.log(0.9)) / 2, abs=1e-12)
    loss, _ = SFTPhiLossFn(cutoff_prob=0.8)(logprob, action_mask=mask)
    assert loss.item() == pytest.approx((-0.25 * math.log(0.5) - 0.09 * math.log(0.8)) / 2, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.125, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="cutoff_prob"):
        SFTPhiLossFn(cutoff_prob=0.0)


def test_mu_schedule_hand_values():
    # warm-up 4 steps to 0.5, cosine to 0.1 over 8 steps, then 0.1
    def mu(step):
        return mu_schedule(step, 4, 8, 0.5, 0.1)

    assert mu(0) == 0.0
    assert mu(2) == pytest.approx(0.25)
    assert mu(4) == pytest.approx(0.5)
    assert mu(8) == pytest.approx(0.3)  # half-way: cos(pi/2) = 0
    assert mu(10) == pytest.approx(0.1 + 0.4 * 0.5 * (1 + math.cos(math.pi * 6 / 8)))
    assert mu(12) == pytest.approx(0.1) and mu(1000) == pytest.approx(0.1)
    assert mu_schedule(1, 0, 0, 0.9, 0.2) == 0.2  # no warm-up, no decay: the valley


def ref_mix(lp, old, adv, mask, expert, mu, sft_weight, mode="token-mean"):
    usual = [i for i, e in enumerate(expert) if not e]
    experts = [i for i, e in enumerate(expert) if e]
    ppo = ref_agg(
        [[ref_ppo_token(*v) for v in zip(lp[i], old[i], adv[i])] for i in usual],
        [mask[i] for i in usual],
        mode,
    )
    sft = ref_agg(
        [[-sft_weight(math.exp(x)) * x for x in lp[i]] for i in experts], [mask[i] for i in experts], mode
    )
    return (1 - mu) * ppo + mu * sft


@pytest.mark.parametrize("phi", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_mix_chord_matches_reference(phi, mode):
    logprob, old, adv, mask = random_inputs((9, 6), seed=21, scale=0.3)
    expert = torch.arange(9) % 3 == 1
    fn = MIXCHORDPolicyLossFn(
        mu_warmup_steps=4,
        mu_decay_steps=8,
        mu_peak=0.5,
        mu_valley=0.1,
        enable_phi_function=phi,
        loss_agg_mode=mode,
    )
    loss, metrics = fn(
        logprob, old_logprob=old, action_mask=mask, advantages=adv, expert_mask=expert, global_step=2
    )
    lp, o, a, m = as_lists(logprob, old, adv, mask)
    weight = (lambda p: p * (1 - p)) if phi else (lambda p: 1.0)
    assert metrics["mu"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(ref_mix(lp, o, a, m, expert.tolist(), 0.25, weight, mode), abs=1e-6)
    # Trinity-RFT's per-row step tensor gives the same mu
    again, metrics = fn(
        logprob,
        old_logprob=old,
        action_mask=mask,
        advantages=adv,
        expert_mask=expert,
        step=torch.full((9,), 2),
    )
    assert again.item() == pytest.approx(loss.item(), abs=1e-12) and metrics["mu"] == pytest.approx(0.25)


def test_mix_chord_step_handling():
    logprob, old, adv, mask = random_inputs((4, 3), seed=2)
    kwargs = {
        "old_logprob": old,
        "action_mask": mask,
        "advantages": adv,
        "expert_mask": torch.tensor([0, 1, 0, 1]) > 0,
    }
    scheduled = MIXCHORDPolicyLossFn(mu_warmup_steps=10)
    with pytest.raises(ValueError, match="global_step"):
        scheduled(logprob, **kwargs)
    with pytest.raises(ValueError, match="step"):
        scheduled(logprob, **kwargs, step=torch.tensor([1, 1, 2, 2]))
    # a constant schedule needs no step: mu_valley
    _, metrics = MIXCHORDPolicyLossFn(mu_peak=0.9, mu_valley=0.3)(logprob, **kwargs)
    assert metrics["mu"] == 0.3


def test_mix_chord_without_phi_equals_mix_at_the_same_mu():
    logprob, old, adv, mask = random_inputs((6, 5), seed=4)
    expert = torch.tensor([False, True, False, False, True, False])
    kwargs = {"old_logprob": old, "action_mask": mask, "advantages": adv, "expert_mask": expert}
    chord, _ = MIXCHORDPolicyLossFn(mu_peak=0.3, mu_valley=0.3, enable_phi_function=False)(
        logprob, **kwargs, global_step=7
    )
    mix, _ = MIXPolicyLossFn(mu=0.3)(logprob, **kwargs)
    assert chord.item() == pytest.approx(mix.item(), abs=1e-12)


# -- MIX across micro-batches (batch-size-aware weights) -----------------------------------


def mix_batch(n_usual=8, n_expert=4, t=7, seed=31):
    """Rollouts first, then expert rows, as the ``mix`` sample strategy orders them; one usual row
    is fully masked (Trinity-RFT counts it as a sample all the same)."""
    g = torch.Generator().manual_seed(seed)
    b = n_usual + n_expert
    mask = random_mask(b, t, g, empty_row=False)
    mask[2] = 0.0
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logprob + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    expert = torch.arange(b) >= n_usual
    return logprob, old, adv, mask, expert


def plain_token_mean(values, mask):
    n = mask.sum()
    return (values * mask).sum() / n if n > 0 else values.sum() * 0.0


def plain_ppo(lp, old, adv, mask, clip=0.2, c=3.0):
    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    lmax = torch.maximum(l1, l2)
    return plain_token_mean(torch.where(adv < 0, torch.minimum(-adv * c, lmax), lmax), mask)


def upstream_mix_loss(data, mu, n_usual, n_expert, gpus, micro_batches, dynamic, micro_size):
    """Trinity-RFT's MIX under veRL, written out: per data-parallel rank, each micro-batch's parts
    scaled by Trinity-RFT's per-micro-batch weights (per-rank counts) and the micro-batch loss by
    veRL's scale (``n_mb / mini_per_rank`` with dynamic batches, ``1 / grad_accum`` without);
    gradients averaged over ranks. ``data`` is (logprob, old, adv, mask, expert) in plain torch."""
    lp, old, adv, mask, expert = data
    n_gpus, mini = len(gpus), n_usual + n_expert
    per_rank = mini // n_gpus
    grad_accum = mini // micro_size  # Trinity-RFT's gradient_accumulation (global mini-batch)
    usual_rank, expert_rank = n_usual // n_gpus, n_expert // n_gpus
    total = lp.sum() * 0.0
    for rows_of_rank in micro_batches:
        rank_loss = lp.sum() * 0.0
        for rows in rows_of_rank:
            idx = torch.tensor(rows)
            e = expert[idx]
            n_mb = len(rows)
            if dynamic:
                w_usual, w_expert = per_rank / (n_mb * usual_rank), per_rank / (n_mb * expert_rank)
                verl_scale = n_mb / per_rank
            else:
                w_usual, w_expert = grad_accum / usual_rank, grad_accum / expert_rank
                verl_scale = 1.0 / (per_rank // micro_size)
            u = idx[~e]
            x = idx[e]
            grpo = plain_ppo(lp[u], old[u], adv[u], mask[u]) * len(u) * w_usual if len(u) else 0.0
            sft = plain_token_mean(-lp[x], mask[x]) * len(x) * w_expert if len(x) else 0.0
            rank_loss = rank_loss + ((1 - mu) * grpo + mu * sft) * verl_scale
        total = total + rank_loss / n_gpus
    return total


def accumulate(fn, data, groups):
    """What the trainer does: each micro-batch loss times micro_batch_weights(loss_agg_mode), summed."""
    lp, old, adv, mask, expert = data
    weights = micro_batch_weights(mask, groups, fn.loss_agg_mode)
    total = lp.sum() * 0.0
    for rows, w in zip(groups, weights):
        idx = torch.tensor(rows)
        loss, _ = fn(
            lp[idx], old_logprob=old[idx], action_mask=mask[idx], advantages=adv[idx], expert_mask=expert[idx]
        )
        total = total + w * loss
    return total


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n_gpus", [1, 2])
def test_mix_micro_batches_reproduce_trinity_rft_minibatch_gradient(dynamic, n_gpus):
    lp, old, adv, mask, expert = mix_batch()
    mu, micro = 0.3, 3
    rank_rows = [list(range(r * 12 // n_gpus, (r + 1) * 12 // n_gpus)) for r in range(n_gpus)]
    per_rank_groups = [[rows[i : i + micro] for i in range(0, len(rows), micro)] for rows in rank_rows]
    groups = [g for rank in per_rank_groups for g in rank]
    assert any(
        expert[g].any() and (~expert[g]).any() for g in map(torch.tensor, groups)
    )  # a mixed micro-batch

    ours_lp = lp.clone().requires_grad_(True)
    fn = MIXPolicyLossFn(
        mu=mu,
        use_dynamic_bsz=dynamic,
        ppo_mini_batch_size=12,
        ppo_micro_batch_size_per_gpu=micro,
        ngpus_trainer=n_gpus,
        train_batch_size_usual=8,
        train_batch_size_expert=4,
    )
    assert fn.loss_agg_mode == "rows"
    ours = accumulate(fn, (ours_lp, old, adv, mask, expert), groups)
    ours.backward()

    ref_lp = lp.clone().requires_grad_(True)
    ref = upstream_mix_loss(
        (ref_lp, old, adv, mask, expert), mu, 8, 4, rank_rows, per_rank_groups, dynamic, micro
    )
    ref.backward()
    # Trinity-RFT's non-dynamic branch multiplies the loss by ngpus_trainer: its gradient_accumulation
    # is the *global* mini-batch over the micro size, while veRL divides by the per-rank one. The
    # dynamic branch (every Trinity-RFT example) is the intended "mean over own samples"; we give it.
    factor = 1 if dynamic else n_gpus
    assert factor * ours.item() == pytest.approx(ref.item(), abs=1e-12)
    torch.testing.assert_close(factor * ours_lp.grad, ref_lp.grad, atol=1e-12, rtol=1e-10)

    # and the plain-loop value: sum over micro-batches of (n_part,mb / N_part) * part mean
    lpl, ol, al, ml = as_lists(lp, old, adv, mask)
    e = expert.tolist()
    expected = 0.0
    for rows in groups:
        usual = [i for i in rows if not e[i]]
        experts = [i for i in rows if e[i]]
        ppo = ref_agg(
            [[ref_ppo_token(*v) for v in zip(lpl[i], ol[i], al[i])] for i in usual],
            [ml[i] for i in usual],
            "token-mean",
        )
        sft = ref_agg([[-x for x in lpl[i]] for i in experts], [ml[i] for i in experts], "token-mean")
        expected += (1 - mu) * len(usual) / 8 * ppo + mu * len(experts) / 4 * sft
    assert ours.item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_mix_with_batch_sizes_is_split_independent_for_sequence_modes(mode):
    # Each part becomes a sum over its rows divided by its own sample count, so any split gives
    # (1 - mu) * PPO(all usual rows) + mu * SFT(all expert rows) computed in one piece.
    lp, old, adv, mask, expert = mix_batch()
    mask[2, 0] = 1.0  # no empty row: sequence means then count exactly the samples
    mu = 0.4
    fn = MIXPolicyLossFn(mu=mu, train_batch_size_usual=8, train_batch_size_expert=4, loss_agg_mode=mode)
    lengths = [int(x) for x in mask.sum(-1).tolist()]
    grads, values = [], []
    for groups in (
        [list(range(12))],
        split_by_rows(12, 5),
        split_by_rows(12, 1),
        split_by_tokens(lengths, 11),
    ):
        leaf = lp.clone().requires_grad_(True)
        total = accumulate(fn, (leaf, old, adv, mask, expert), groups)
        total.backward()
        values.append(total.item())
        grads.append(leaf.grad)
    lpl, ol, al, ml = as_lists(lp, old, adv, mask)
    expected = ref_mix(lpl, ol, al, ml, expert.tolist(), mu, lambda p: 1.0, mode)
    for value, grad in zip(values, grads):
        assert value == pytest.approx(expected, abs=1e-9)
        torch.testing.assert_close(grad, grads[0], atol=1e-12, rtol=1e-10)


def test_mix_without_batch_sizes_keeps_per_micro_batch_parts():
    fn = MIXPolicyLossFn(mu=0.2, loss_agg_mode="seq-mean-token-mean")
    assert fn.loss_agg_mode == "seq-mean-token-mean" and fn.batch_rows is None


def test_mix_batch_size_argument_errors():
    with pytest.raises(ValueError, match="both"):
        MIXPolicyLossFn(train_batch_size_usual=8)
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        MIXPolicyLossFn(train_batch_size_usual=8, train_batch_size_expert=4, ppo_mini_batch_size=16)
    fn = MIXPolicyLossFn(train_batch_size_usual=8, train_batch_size_expert=0)
    lp, old, adv, mask, expert = mix_batch()
    with pytest.raises(ValueError, match="train_batch_size_expert is 0"):
        fn(lp, old_logprob=old, action_mask=mask, advantages=adv, expert_mask=expert)
    # only rollouts: fine, the usual part is scaled by N / N_usual * n_usual / n = 1
    loss, _ = fn(
        lp[:8], old_logprob=old[:8], action_mask=mask[:8], advantages=adv[:8], expert_mask=expert[:8]
    )
    plain, _ = MIXPolicyLossFn()(lp[:8], old_logprob=old[:8], action_mask=mask[:8], advantages=adv[:8])
    assert loss.item() == pytest.approx(plain.item(), abs=1e-12)


# -- conformance ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,init_args",
    [
        (TOPRPolicyLossFn, None),
        (SPPOPolicyLossFn, None),
        (ImportanceSamplingPolicyLossFn, None),
        (SAPOPolicyLossFn, None),
        (RECPolicyLossFn, None),
        (
            RECPolicyLossFn,
            {"clip_mode": "gspo-one-side", "weight": "gspo_importance_sampling", "regularizer": "k2"},
        ),
        (SFTISLossFn, None),
        (SFTPhiLossFn, {"cutoff_prob": 0.5}),
        (MIXCHORDPolicyLossFn, None),
        (MIXPolicyLossFn, {"train_batch_size_usual": 2, "train_batch_size_expert": 2}),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_conformance(cls, init_args):
    check_component("policy_loss_fn", cls, init_args=init_args)
