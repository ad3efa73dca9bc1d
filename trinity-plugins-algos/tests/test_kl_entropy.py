"""KL estimators (as loss and as reward penalty) and entropy terms."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import MODES, SHAPES, random_mask, ref_agg, ref_agg_grad

from trinity.testing import check_component
from trinity_algos.entropy import DefaultEntropyLossFn, MixEntropyLossFn, NoEntropyLossFn
from trinity_algos.kl import AbsKLFn, CorrectedK3KLFn, K1KLFn, K2KLFn, K3KLFn, LowVarKLFn, NoKLFn


def k3(x):
    return math.exp(-x) - 1 + x


def low_var(x):
    log_r = max(-20.0, min(20.0, -x))
    return max(-10.0, min(10.0, math.exp(log_r) - 1 - log_r))


REFERENCE = {
    K1KLFn: lambda x: x,
    K2KLFn: lambda x: 0.5 * x * x,
    K3KLFn: k3,
    LowVarKLFn: low_var,
    AbsKLFn: abs,
    NoKLFn: lambda x: 0.0,
    CorrectedK3KLFn: k3,  # without old_logprob it is k3
}


def test_kl_hand_values():
    logprob, ref = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[-1.5]], dtype=torch.float64)
    # x = 0.5
    assert K1KLFn().calculate_kl(logprob, ref).item() == pytest.approx(0.5)
    assert K2KLFn().calculate_kl(logprob, ref).item() == pytest.approx(0.125)
    assert K3KLFn().calculate_kl(logprob, ref).item() == pytest.approx(math.exp(-0.5) - 0.5, abs=1e-12)
    assert AbsKLFn().calculate_kl(ref, logprob).item() == pytest.approx(0.5)
    # x = -30: k3 = e^30 - 31, low_var_kl clamps the log-ratio to 20 and the result to 10.
    far = torch.tensor([[-30.0]], dtype=torch.float64)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    assert LowVarKLFn().calculate_kl(far, zero).item() == 10.0
    assert K3KLFn().calculate_kl(far, zero).item() == pytest.approx(math.exp(30) - 31)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cls", list(REFERENCE), ids=lambda c: c.__name__)
def test_kl_matches_reference(cls, shape):
    b, t = shape
    g = torch.Generator().manual_seed(b * 7 + t)
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 4
    ref = logprob + torch.randn(b, t, generator=g, dtype=torch.float64) * 2
    ref[0, 0] = logprob[0, 0] + 25.0  # beyond low_var_kl's clamp
    mask = random_mask(b, t, g)
    fn = cls(kl_coef=0.05)
    expected = [
        [REFERENCE[cls](x - y) for x, y in zip(r1, r2)] for r1, r2 in zip(logprob.tolist(), ref.tolist())
    ]
    torch.testing.assert_close(
        fn.calculate_kl(logprob, ref), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=1e-9
    )
    loss, _ = fn.calculate_kl_loss(logprob, ref, mask, "token-mean")
    valid = [v for row, mrow in zip(expected, mask.tolist()) for v, m in zip(row, mrow) if m]
    assert loss.item() == pytest.approx(0.05 * sum(valid) / len(valid), rel=1e-9, abs=1e-6)


def test_kl_penalty_on_reward_and_adaptive_controller():
    batch = {
        "rewards": torch.tensor([1.0, 2.0]),
        "action_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
        "old_logprob": torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]),
        "ref_logprob": torch.tensor([[-2.0, -1.0, -9.0], [-1.0, -3.0, -1.0]]),
    }
    fn = K1KLFn(kl_coef=0.1, adaptive=True, target_kl=0.1, horizon=10)
    out, metrics = fn.apply_kl_penalty_to_reward(batch)
    assert set(batch) == {"rewards", "action_mask", "old_logprob", "ref_logprob"}  # a new dict
    # k1 per token: row 0 (1, 0, masked), row 1 (0, 2, 0); reward on the last valid token.
    expected = torch.tensor([[-0.1, 1.0, 0.0], [0.0, -0.2, 2.0]])
    torch.testing.assert_close(out["token_level_rewards"], expected)
    assert metrics["kl"] == pytest.approx((0.5 + 2 / 3) / 2)
    # error = clip(kl / target - 1, -0.2, 0.2) = 0.2; coef *= 1 + 0.2 * n_steps(2) / 10
    assert fn.kl_coef == pytest.approx(0.1 * 1.04)


def test_no_kl_leaves_rewards_and_needs_no_reference():
    batch = {"rewards": torch.ones(2), "action_mask": torch.ones(2, 2)}
    out, metrics = NoKLFn().apply_kl_penalty_to_reward(batch)
    assert "token_level_rewards" not in batch  # a new dict
    torch.testing.assert_close(out["token_level_rewards"], torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    assert metrics == {}
    loss, _ = NoKLFn().calculate_kl_loss(torch.zeros(2, 2), None, torch.ones(2, 2))
    assert loss.item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_entropy_hand_values(mode):
    entropy = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics = DefaultEntropyLossFn(entropy_coef=0.01)(entropy, mask, loss_agg_mode=mode)
    unweighted = 2.0 if mode == "token-mean" else (2.0 + 2.0) / 2
    assert metrics["entropy_loss"] == pytest.approx(unweighted)
    assert loss.item() == pytest.approx(0.01 * unweighted)
    loss, metrics = NoEntropyLossFn(entropy_coef=0.01)(entropy, mask, loss_agg_mode=mode)
    assert loss.item() == 0.0 and metrics == {}


# -- corrected_k3 -----------------------------------------------------------------------------


def test_corrected_k3_hand_values():
    logprob = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.5]], dtype=torch.float64)  # x = 0.5: k3 = e^-0.5 - 0.5
    old = logprob - torch.tensor([[math.log(1.5), math.log(3.0)]], dtype=torch.float64)  # ratios 1.5 and 3
    kl = CorrectedK3KLFn().calculate_kl(logprob, ref, old)
    base = math.exp(-0.5) - 0.5
    torch.testing.assert_close(kl, torch.tensor([[1.5 * base, 2.0 * base]], dtype=torch.float64))
    torch.testing.assert_close(
        CorrectedK3KLFn().calculate_kl(logprob, ref), torch.full((1, 2), base, dtype=torch.float64)
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_corrected_k3_loss_matches_reference(shape, mode):
    b, t = shape
    g = torch.Generator().manual_seed(b * 5 + t)
    logprob = (-torch.rand(b, t, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref = logprob.detach() + torch.randn(b, t, generator=g, dtype=torch.float64)
    old = logprob.detach() + 0.6 * torch.randn(b, t, generator=g, dtype=torch.float64)
    old[0, 0] = logprob[0, 0].detach() - 3.0  # ratio e^3, clipped to 2
    mask = random_mask(b, t, g)
    fn = CorrectedK3KLFn(kl_coef=0.2)
    loss, metrics = fn.calculate_kl_loss(logprob, ref, mask, mode, old_logprob=old)
    values, grads = [], []
    for xr, yr, orow in zip(logprob.tolist(), ref.tolist(), old.tolist()):
        vrow, grow = [], []
        for x, y, o in zip(xr, yr, orow):
            r = math.exp(x - o)
            value = k3(x - y)
            dk3 = 1.0 - math.exp(y - x)
            if r > 2.0:
                vrow.append(2.0 * value)
                grow.append(2.0 * dk3)
            else:
                vrow.append(r * value)
                grow.append(r * value + r * dk3)
        values.append(vrow)
        grads.append(grow)
    m = mask.tolist()
    expected = ref_agg(values, m, mode)
    assert metrics["kl_loss"] == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.2 * expected, abs=1e-6)
    loss.backward()
    weights = ref_agg_grad(m, mode)
    expected_grad = [[0.2 * gv * w for gv, w in zip(gr, wr)] for gr, wr in zip(grads, weights)]
    torch.testing.assert_close(
        logprob.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-9, rtol=1e-7
    )


def test_corrected_k3_without_old_logprob_is_k3_and_so_is_its_penalty():
    g = torch.Generator().manual_seed(3)
    logprob = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    ref = logprob + torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = random_mask(3, 4, g)
    a, _ = CorrectedK3KLFn(kl_coef=0.1).calculate_kl_loss(logprob, ref, mask, "token-mean")
    b, _ = K3KLFn(kl_coef=0.1).calculate_kl_loss(logprob, ref, mask, "token-mean")
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    batch = {"rewards": torch.ones(3), "action_mask": mask, "old_logprob": logprob, "ref_logprob": ref}
    out_a, _ = CorrectedK3KLFn(kl_coef=0.1).apply_kl_penalty_to_reward(dict(batch))
    out_b, _ = K3KLFn(kl_coef=0.1).apply_kl_penalty_to_reward(dict(batch))
    torch.testing.assert_close(out_a["token_level_rewards"], out_b["token_level_rewards"])


def test_corrected_k3_huge_ratio_stays_finite():
    logprob = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = CorrectedK3KLFn().calculate_kl_loss(
        logprob, torch.tensor([[-1.0]]), torch.ones(1, 1), old_logprob=torch.tensor([[-1000.0]])
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprob.grad).all()


# -- mix entropy ------------------------------------------------------------------------------


def test_mix_entropy_hand_values():
    entropy = torch.tensor([[1.0, 3.0], [2.0, 0.0], [10.0, 10.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    expert = torch.tensor([False, False, True])
    loss, metrics = MixEntropyLossFn(entropy_coef=0.01)(
        entropy, mask, loss_agg_mode="token-mean", expert_mask=expert
    )
    assert metrics["entropy_loss"] == pytest.approx(2.0)  # the expert row (entropy 10) is left out
    assert loss.item() == pytest.approx(0.02)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_mix_entropy_matches_reference(shape, mode):
    b, t = shape
    g = torch.Generator().manual_seed(b * 3 + t)
    entropy = (torch.rand(b, t, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    mask = random_mask(b, t, g)
    expert = torch.arange(b) % 2 == 1
    loss, metrics = MixEntropyLossFn(entropy_coef=0.05)(entropy, mask, loss_agg_mode=mode, expert_mask=expert)
    rows = [i for i in range(b) if not expert[i]]
    ent, m = entropy.tolist(), mask.tolist()
    expected = ref_agg([ent[i] for i in rows], [m[i] for i in rows], mode)
    assert metrics["entropy_loss"] == pytest.approx(expected, abs=1e-9)
    assert loss.item() == pytest.approx(0.05 * expected, abs=1e-9)
    loss.backward()
    usual_weights = iter(ref_agg_grad([m[i] for i in rows], mode))
    expected_grad = [
        [0.05 * w for w in next(usual_weights)] if not expert[i] else [0.0] * t for i in range(b)
    ]
    torch.testing.assert_close(
        entropy.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=1e-9
    )


@pytest.mark.parametrize("mode", MODES)
def test_mix_entropy_without_expert_mask_is_the_default_bonus(mode):
    g = torch.Generator().manual_seed(0)
    entropy, mask = torch.rand(5, 4, generator=g, dtype=torch.float64), random_mask(5, 4, g)
    mixed, _ = MixEntropyLossFn(entropy_coef=0.1)(entropy, mask, loss_agg_mode=mode)
    default, _ = DefaultEntropyLossFn(entropy_coef=0.1)(entropy, mask, loss_agg_mode=mode)
    assert mixed.item() == pytest.approx(default.item(), abs=1e-12)
    no_expert, _ = MixEntropyLossFn(entropy_coef=0.1)(
        entropy, mask, loss_agg_mode=mode, expert_mask=torch.zeros(5, dtype=torch.bool)
    )
    assert no_expert.item() == pytest.approx(default.item(), abs=1e-12)


def test_conformance_of_new_kl_and_entropy():
    check_component("kl_fn", CorrectedK3KLFn)
    check_component("entropy_loss_fn", MixEntropyLossFn, init_args={"entropy_coef": 0.01})
