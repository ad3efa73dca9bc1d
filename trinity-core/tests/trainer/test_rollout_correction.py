"""Rollout correction (``algorithm.rollout_correction``, veRL 0.9's keys): the weights, the
rejection and their metrics on small tensors, the config's checks, and the one training step
applying it for both back-ends (over a stand-in back-end, no Ray)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trinity import hookimpl
from trinity.algorithm import PolicyLossFn
from trinity.config.sections.algorithm import RolloutCorrectionConfig
from trinity.testing.conformance import make_experiences
from trinity.testing.plugins import registered_plugin
from trinity.trainer.batch import TrainBatch, build_batch
from trinity.trainer.components import AlgorithmComponents
from trinity.trainer.rollout_correction import rollout_correction
from trinity.trainer.step import POLICY_STATS, train_step

MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
# Ratios trainer / rollout per token (the padding token's is never read).
RATIOS = torch.tensor([[0.5, 1.5, 3.0, 1.0], [1.1, 1.2, 1.0, 7.0]])


def _logprobs() -> tuple[torch.Tensor, torch.Tensor]:
    rollout = torch.full((2, 4), -1.0)
    return rollout + RATIOS.log(), rollout


def _correct(**settings: Any):
    old, rollout = _logprobs()
    return rollout_correction(old, rollout, MASK, RolloutCorrectionConfig(**settings))


def test_token_weights_are_truncated_at_the_threshold():
    weights, mask, metrics = _correct(rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, RATIOS.clamp(max=2.0) * MASK)
    assert torch.equal(mask, MASK)  # truncation rejects nothing
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 7)  # the 3.0
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(0.5)


def test_sequence_weights_are_the_rows_products():
    weights, _, metrics = _correct(rollout_is="sequence", rollout_is_threshold=2.0)
    products = (RATIOS * MASK + (1 - MASK)).prod(-1)  # 2.25 and 1.32
    expected = products.clamp(max=2.0).unsqueeze(-1) * MASK
    torch.testing.assert_close(weights, expected)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # one row of two


def test_a_lower_upper_threshold_zeroes_weights_outside_it():
    weights, mask, metrics = _correct(rollout_is="token", rollout_is_threshold="0.6_2.0")
    inside = (RATIOS >= 0.6) & (RATIOS <= 2.0)
    torch.testing.assert_close(weights, torch.where(inside, RATIOS, 0.0) * MASK)
    assert torch.equal(mask, MASK)  # the tokens stay in the loss with weight 0, as in veRL
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 7)


def test_batch_normalised_weights_average_one():
    weights, _, metrics = _correct(rollout_is="token", rollout_is_batch_normalize=True)
    assert float((weights * MASK).sum() / MASK.sum()) == pytest.approx(1.0)
    truncated = RATIOS.clamp(max=2.0)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(
        float((truncated * MASK).sum() / MASK.sum())
    )


def test_token_rejection_drops_the_tokens_out_of_the_ratio_bounds():
    weights, mask, metrics = _correct(rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold=2.0)
    assert weights is None
    keep = (RATIOS >= 0.5) & (RATIOS <= 2.0)
    torch.testing.assert_close(mask, MASK * keep)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 7)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)


def test_sequence_rejection_drops_whole_rows():
    # Geometric mean of the ratio (veRL's geo-RS) within [0.95, 1.25]: row 0's is 1.14, row 1's 1.10.
    _, mask, _ = _correct(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.95_1.12")
    geo = torch.exp((RATIOS.log() * MASK).sum(-1) / MASK.sum(-1))
    keep = ((geo >= 0.95) & (geo <= 1.12)).float().unsqueeze(-1)
    assert keep.squeeze(-1).tolist() == [0.0, 1.0]  # the planted data separates the rows
    torch.testing.assert_close(mask, MASK * keep)
    # k3 over the row's worst token: row 0's 3.0 gives 3 - 1 - log 3 = 0.90.
    _, mask, metrics = _correct(
        rollout_is=None, rollout_rs="seq_max_k3,token_k2", rollout_rs_threshold="0.5,2.0"
    )
    assert mask[0].sum() == 0 and torch.equal(mask[1], MASK[1])
    assert metrics["rollout_corr/rollout_rs_seq_max_k3_seq_masked_fraction"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_rs_token_k2_masked_fraction"] == pytest.approx(0.0)


def test_off_policy_metrics_measure_the_gap():
    _, _, metrics = _correct(rollout_is=None)
    log_ratio = RATIOS.log()
    assert metrics["rollout_corr/kl"] == pytest.approx(float(-(log_ratio * MASK).sum() / MASK.sum()))
    chi2 = float((RATIOS.square() * MASK).sum() / MASK.sum()) - 1
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(chi2, rel=1e-5)
    _, _, same = rollout_correction(*(_logprobs()[1],) * 2, MASK, RolloutCorrectionConfig())
    assert same["rollout_corr/kl"] == 0 and same["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)


# -- the config --------------------------------------------------------------------------------


def test_the_defaults_are_verls():
    rc = RolloutCorrectionConfig()
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.bypass_mode) == (
        "sequence",
        2.0,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rollout_is_level": "token"}, "rollout_is_level is veRL's older name; use rollout_is"),
        ({"rollout_rs": "token_k1"}, "rollout_rs is set but rollout_rs_threshold is not"),
        ({"rollout_rs": "geometric", "rollout_rs_threshold": 2}, "rollout_rs 'geometric': expected options"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}, "for token_k2: expected one positive"),
        ({"rollout_is_threshold": "2_0.5"}, "bounds must be positive with lower <= upper"),
        (
            {"bypass_mode": True, "rollout_rs": "token_k1", "rollout_rs_threshold": 2},
            "with bypass_mode: true",
        ),
        ({"loss_type": "reinforce"}, "loss_type"),
    ],
)
def test_settings_that_cannot_work_are_one_line_errors(settings, message):
    with pytest.raises(ValidationError) as failed:
        RolloutCorrectionConfig(**settings)
    assert message in str(failed.value)


# -- in the one training step ------------------------------------------------------------------


class _Backend:
    """A back-end whose policy's log-probs are ``rollout + log(ratios)`` before the update."""

    policy_stats_names = POLICY_STATS
    old_logprob_from_update = True

    def __init__(self, config: Any, ratios: torch.Tensor) -> None:
        self.config = config
        self.components = AlgorithmComponents.from_config(config.algorithm)
        self.use_ref = self.components.use_reference
        self.use_critic = False
        self.global_step = 0
        self.ratios = ratios
        self.calls: list[tuple[str, Any]] = []

    def prepare(self, experiences):
        return build_batch(experiences), None

    def ref_logprobs(self, batch, plan):
        return torch.full_like(batch.action_mask, -1.0)

    def policy_stats(self, batch, plan, names):
        self.calls.append(("stats", names))
        return {n: batch.rollout_logprobs + self.ratios.log() for n in names}

    def update_actor(self, batch: TrainBatch, plan):
        self.calls.append(("actor", batch))
        old = batch.rollout_logprobs + self.ratios.log() if batch.old_logprob is None else None
        return {"actor/pg_loss": 0.0}, old

    def actor_batch(self) -> TrainBatch:
        return next(b for n, b in self.calls if n == "actor")


GRPO = {"algorithm_type": "grpo", "repeat_times": 2}
STEP_RATIOS = torch.tensor([[0.5, 1.0, 3.0, 1.0]] * 2 + [[1.0, 1.0, 1.0, 1.0]] * 2)


def _uncorrected_advantages(config_factory) -> torch.Tensor:
    backend = _Backend(config_factory(GRPO), STEP_RATIOS)
    metrics = train_step(backend, make_experiences(4))
    assert [n for n, _ in backend.calls] == ["actor"]  # off: no extra forward pass
    assert not any(k.startswith("rollout_corr/") for k in metrics)
    return backend.actor_batch().advantages


def test_token_weights_scale_the_advantages_the_loss_reads(config_factory):
    plain = _uncorrected_advantages(config_factory)
    config = config_factory(
        {**GRPO, "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}}
    )
    backend = _Backend(config, STEP_RATIOS)
    metrics = train_step(backend, make_experiences(4))
    # The trainer's old log-probs are computed before the update, to compare with the rollout's.
    assert [n for n, _ in backend.calls] == ["stats", "actor"]
    actor = backend.actor_batch()
    torch.testing.assert_close(actor.advantages, plain * STEP_RATIOS.clamp(max=2.0))
    assert actor.rollout_is_weights is None  # folded into the advantages instead
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    # The data statistics describe the advantages as estimated, not as weighted.
    assert metrics["critic/advantages/max"] == pytest.approx(float(plain.max()))


def test_rejection_removes_tokens_from_the_loss_mask(config_factory):
    config = config_factory(
        {
            **GRPO,
            "rollout_correction": {"rollout_is": None, "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
        }
    )
    backend = _Backend(config, STEP_RATIOS)
    metrics = train_step(backend, make_experiences(4))
    actor = backend.actor_batch()
    keep = ((STEP_RATIOS >= 0.5) & (STEP_RATIOS <= 2.0)).float()
    torch.testing.assert_close(actor.action_mask, keep)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 16)


def test_expert_rows_are_neither_weighted_nor_rejected_nor_measured(config_factory):
    """mix's expert (SFT) rows carry no engine log-probs: the correction leaves them alone."""
    config = config_factory(
        {
            **GRPO,
            "rollout_correction": {
                "rollout_is": "token",
                "rollout_is_threshold": 2.0,
                "rollout_rs": "token_k1",
                "rollout_rs_threshold": 2.0,
            },
        }
    )
    experiences = make_experiences(4)
    for e in experiences[:2]:  # the rows whose ratios (0.5, 3.0) the correction would touch
        e.info["is_expert"] = True
    backend = _Backend(config, STEP_RATIOS)
    metrics = train_step(backend, experiences)
    actor = backend.actor_batch()
    torch.testing.assert_close(actor.action_mask, torch.ones_like(actor.action_mask))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(1.0)  # rollout rows: ratio 1


class _WeightedLoss(PolicyLossFn):
    """Declares ``rollout_is_weights``: it applies them itself (veRL's convention)."""

    def __call__(self, logprob, action_mask, advantages, rollout_is_weights=None, **kwargs):
        return (logprob * advantages * action_mask).sum(), {}


class _WeightedPlugin:
    @hookimpl
    def register_policy_loss_fns(self, register):
        register("weighted_pg", _WeightedLoss)


def test_a_loss_that_declares_the_weights_receives_them_and_the_advantages_stay(config_factory):
    plain = _uncorrected_advantages(config_factory)
    with registered_plugin(_WeightedPlugin(), "weighted"):
        config = config_factory(
            {**GRPO, "policy_loss_fn": "weighted_pg", "rollout_correction": {"rollout_is": "token"}}
        )
        backend = _Backend(config, STEP_RATIOS)
        train_step(backend, make_experiences(4))
    actor = backend.actor_batch()
    torch.testing.assert_close(actor.advantages, plain)
    torch.testing.assert_close(actor.rollout_is_weights, STEP_RATIOS.clamp(max=2.0))


def test_bypass_mode_trains_on_the_rollout_logprobs(config_factory):
    config = config_factory({**GRPO, "rollout_correction": {"bypass_mode": True}})
    backend = _Backend(config, STEP_RATIOS)
    metrics = train_step(backend, make_experiences(4))
    assert [n for n, _ in backend.calls] == ["actor"]
    actor = backend.actor_batch()
    assert torch.equal(actor.old_logprob, actor.rollout_logprobs)
    assert not any(k.startswith("rollout_corr/") for k in metrics)


def test_experiences_without_rollout_logprobs_train_uncorrected_with_a_warning(config_factory, caplog):
    experiences = make_experiences(4)
    experiences[0].logprobs = None
    config = config_factory({**GRPO, "rollout_correction": {"rollout_is": "token"}})
    backend = _Backend(config, STEP_RATIOS)
    with caplog.at_level("WARNING", logger="trinity.trainer"):
        metrics = train_step(backend, experiences)
        train_step(backend, experiences)
    assert not any(k.startswith("rollout_corr/") for k in metrics)
    warned = [r for r in caplog.records if "carry no rollout log-probs" in r.getMessage()]
    assert len(warned) == 1


def test_math_of_the_step_weights_matches_the_unit(config_factory):
    """The step's metrics are the unit function's on the batch's tensors (one implementation)."""
    config = config_factory({**GRPO, "rollout_correction": {"rollout_is": "sequence"}})
    backend = _Backend(config, STEP_RATIOS)
    metrics = train_step(backend, make_experiences(4))
    products = STEP_RATIOS.prod(-1)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(min(2.0, float(products.max())))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(
        float((products > 2.0).float().mean())
    )
    assert math.isfinite(metrics["rollout_corr/chi2_seq"])


# -- the native trainer on a tiny real model ---------------------------------------------------


def _tiny_rollouts(trainer, offset: float):
    """Two groups of experiences whose engine log-probs are the trainer's own, ``offset`` nats
    lower on every response token (a planted mismatch)."""
    experiences = make_experiences(4, prompt_length=3, response_length=3)
    for i, exp in enumerate(experiences):
        exp.reward = float(i % 2)
        # Rewarded rows train on one token, the others on three: token-mean does not cancel.
        exp.action_mask = torch.tensor([True, False, False] if i % 2 else [True] * 3)
    batch = build_batch(experiences, trainer.pad_token_id)
    from trinity.trainer.batch import to_device
    from trinity.trainer.forward import forward_logprobs

    with torch.no_grad():
        own, _ = forward_logprobs(trainer.model, to_device(batch, trainer.device))
    for row, exp in enumerate(experiences):
        exp.logprobs = own[row, : exp.response_length].cpu() - offset
    return experiences


def test_the_native_trainer_trains_with_the_correction(config_factory):
    from trinity.trainer.native import NativeTrainer

    def pg_loss(offset: float, correction: dict[str, Any] | None) -> dict[str, Any]:
        algorithm = {**GRPO, "optimizer": {"lr": 0.0}}
        if correction is not None:
            algorithm["rollout_correction"] = correction
        trainer = NativeTrainer(config_factory(algorithm))
        return trainer.train_step(_tiny_rollouts(trainer, offset))

    token = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    plain, matched = pg_loss(0.0, None), pg_loss(0.0, token)
    assert abs(plain["actor/pg_loss"]) > 0.1
    # No mismatch: weights of 1 change nothing.
    assert matched["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    assert matched["actor/pg_loss"] == pytest.approx(plain["actor/pg_loss"], abs=1e-6)
    # The engine 0.5 nats less sure of every token: r = e^0.5 on each, the token losses scale by it.
    shifted = pg_loss(0.5, token)
    assert shifted["rollout_corr/rollout_is_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert shifted["actor/pg_loss"] == pytest.approx(math.exp(0.5) * plain["actor/pg_loss"], rel=1e-4)
