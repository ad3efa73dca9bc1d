"""KL estimators (as loss and as reward penalty) and entropy terms."""

from __future__ import annotations

import math

import pytest
import torch
from algos_testutil import SHAPES, random_mask

from trinity_algos.entropy import DefaultEntropyLossFn, NoEntropyLossFn
from trinity_algos.kl import AbsKLFn, K1KLFn, K2KLFn, K3KLFn, LowVarKLFn, NoKLFn


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
    # k1 per token: row 0 (1, 0, masked), row 1 (0, 2, 0); reward on the last valid token.
    expected = torch.tensor([[-0.1, 1.0, 0.0], [0.0, -0.2, 2.0]])
    torch.testing.assert_close(out["token_level_rewards"], expected)
    assert metrics["kl"] == pytest.approx((0.5 + 2 / 3) / 2)
    # error = clip(kl / target - 1, -0.2, 0.2) = 0.2; coef *= 1 + 0.2 * n_steps(2) / 10
    assert fn.kl_coef == pytest.approx(0.1 * 1.04)


def test_no_kl_leaves_rewards_and_needs_no_reference():
    batch = {"rewards": torch.ones(2), "action_mask": torch.ones(2, 2)}
    out, metrics = NoKLFn().apply_kl_penalty_to_reward(dict(batch))
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
