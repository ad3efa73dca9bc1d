"""The one training step (``trinity.trainer.step``) over a stand-in back-end: which primitive runs
when, with which batch, and that no stage changes a batch in place."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trinity import hookimpl
from trinity.algorithm import AdvantageFn
from trinity.testing.conformance import make_experiences
from trinity.testing.plugins import registered_plugin
from trinity.trainer.batch import TrainBatch, build_batch
from trinity.trainer.components import AlgorithmComponents, MissingInputError
from trinity.trainer.step import POLICY_STATS, train_step


class _Backend:
    """Primitives that return fixed tensors and record each call with the batch it got."""

    def __init__(self, config: Any, *, stats=POLICY_STATS, from_update: bool = True) -> None:
        self.config = config
        self.components = AlgorithmComponents.from_config(config.algorithm)
        self.use_ref = self.components.use_reference
        self.use_critic = bool(self.components.algorithm_type.use_critic)
        self.policy_stats_names = stats
        self.old_logprob_from_update = from_update
        self.global_step = 0
        self.calls: list[tuple[str, Any]] = []
        self.prepared: TrainBatch | None = None

    def _like(self, batch: TrainBatch, value: float) -> torch.Tensor:
        return torch.full_like(batch.action_mask, value)

    def prepare(self, experiences):
        self.prepared = build_batch(experiences)
        self.calls.append(("prepare", None))
        return self.prepared, "the plan"

    def ref_logprobs(self, batch, plan):
        assert plan == "the plan"
        self.calls.append(("ref", batch))
        return self._like(batch, -1.5)

    def values(self, batch, plan):
        self.calls.append(("values", batch))
        return self._like(batch, 0.25)

    def policy_stats(self, batch, plan, names):
        self.calls.append(("stats", names))
        return {name: self._like(batch, -1.0) for name in names}

    def update_critic(self, batch, plan):
        self.calls.append(("critic", batch))
        return {"critic/vf_loss": 0.5}

    def update_actor(self, batch, plan):
        self.calls.append(("actor", batch))
        old = self._like(batch, -1.25) if batch.old_logprob is None and self.old_logprob_from_update else None
        return {"actor/pg_loss": 0.1}, old

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def batch_of(self, name: str) -> TrainBatch:
        return next(batch for n, batch in self.calls if n == name)


def test_old_logprob_comes_from_the_update_when_nothing_needs_it_earlier(config_factory):
    backend = _Backend(config_factory({"algorithm_type": "grpo", "repeat_times": 2}))
    metrics = train_step(backend, make_experiences(4))
    assert backend.names() == ["prepare", "ref", "actor"]
    seen = backend.batch_of("actor")
    assert seen.old_logprob is None and seen.advantages is not None
    assert torch.equal(seen.ref_logprob, torch.full_like(seen.action_mask, -1.5))
    # The agreement metric reads the update's old_logprob (-1.25) against the rollout's (-1.0).
    assert metrics["rollout/logprob_diff/mean"] == pytest.approx(0.25)
    assert metrics["actor/pg_loss"] == 0.1 and backend.global_step == 1
    assert {"timing/ref", "timing/adv", "timing/update_actor", "timing/step"} <= set(metrics)


def test_a_back_end_whose_update_needs_old_logprob_gets_it_before_the_advantage(config_factory):
    backend = _Backend(config_factory({"algorithm_type": "grpo", "repeat_times": 2}), from_update=False)
    metrics = train_step(backend, make_experiences(4))
    assert backend.names() == ["prepare", "ref", "stats", "actor"]
    assert backend.calls[2][1] == ("old_logprob",)
    assert torch.equal(backend.batch_of("actor").old_logprob, torch.full((4, 4), -1.0))
    assert metrics["rollout/logprob_diff/mean"] == pytest.approx(0.0)
    assert "timing/old_log_prob" in metrics


def test_ppo_with_a_kl_penalty_runs_every_stage_in_order(config_factory):
    config = config_factory(
        {"algorithm_type": "ppo", "repeat_times": 2, "kl_penalty_fn": "k1", "kl_loss_fn": "none"}
    )
    backend = _Backend(config)
    metrics = train_step(backend, make_experiences(4))
    assert backend.names() == ["prepare", "ref", "values", "stats", "critic", "actor"]
    critic, actor = backend.batch_of("critic"), backend.batch_of("actor")
    assert critic is actor
    assert actor.values is not None and actor.returns is not None
    # k1 penalty: scores - 0.001 * (old - ref) on the valid tokens.
    expected = actor.token_level_scores - 0.001 * (-1.0 + 1.5) * actor.action_mask
    torch.testing.assert_close(actor.token_level_rewards, expected)
    assert "actor/reward_kl_penalty" in metrics and "critic/vf_loss" in metrics


def test_no_stage_changes_a_batch_in_place(config_factory):
    config = config_factory({"algorithm_type": "ppo", "repeat_times": 2, "kl_penalty_fn": "k1"})
    backend = _Backend(config)
    train_step(backend, make_experiences(4))
    prepared = backend.prepared
    for name in ("ref_logprob", "values", "old_logprob", "token_level_scores", "advantages", "returns"):
        assert getattr(prepared, name) is None, name
    # Each stage made a new batch; the one the ref pass saw has no values yet.
    assert backend.batch_of("ref") is prepared and backend.batch_of("values").values is None


def test_the_actor_waits_for_the_critic_warmup(config_factory):
    backend = _Backend(
        config_factory({"algorithm_type": "ppo", "repeat_times": 2}, trainer={"critic_warmup": 1})
    )
    train_step(backend, make_experiences(4))
    assert "critic" in backend.names() and "actor" not in backend.names()
    backend.calls.clear()
    train_step(backend, make_experiences(4))
    assert backend.names()[-2:] == ["critic", "actor"] and backend.global_step == 2


def test_rollout_logprobs_serve_as_old_logprob_without_a_forward_pass(config_factory):
    config = config_factory(
        {"algorithm_type": "grpo", "repeat_times": 2}, trainer={"use_rollout_logprobs": True}
    )
    backend = _Backend(config, from_update=False)
    metrics = train_step(backend, make_experiences(4))
    assert "stats" not in backend.names()
    actor = backend.batch_of("actor")
    assert torch.equal(actor.old_logprob, actor.rollout_logprobs)
    assert "rollout/logprob_diff/mean" not in metrics  # nothing recomputed to compare


class _NeedsNec(AdvantageFn):
    required_inputs = ("old_logprob", "old_nec")

    def __call__(self, batch):
        batch["advantages"] = batch["old_nec"] * batch["action_mask"]
        batch["returns"] = batch["advantages"].clone()
        batch["my_signal"] = batch["old_nec"] + 1  # a key that is not a field: kept in `extra`
        return batch, {}


class _NecPlugin:
    @hookimpl
    def register_advantage_fns(self, register):
        register("needs_nec", _NeedsNec)


def test_a_statistic_the_back_end_cannot_compute_is_an_error_before_any_update(config_factory):
    with registered_plugin(_NecPlugin(), "needs-nec"):
        config = config_factory({"algorithm_type": "grpo", "repeat_times": 2, "advantage_fn": "needs_nec"})
        backend = _Backend(config, stats=("old_logprob", "old_entropy"))
        with pytest.raises(MissingInputError) as failed:
            train_step(backend, make_experiences(4))
        assert str(failed.value).startswith("advantage_fn 'needs_nec' needs 'old_nec'")
        assert "native trainer does not compute; use trainer_type: native" in str(failed.value)
        assert "actor" not in backend.names() and backend.global_step == 0

        backend = _Backend(config)
        train_step(backend, make_experiences(4))
        assert backend.calls[2][1] == ("old_logprob", "old_nec")
        actor = backend.batch_of("actor")
        assert actor.extra.keys() == {"my_signal"} and torch.equal(actor["my_signal"], actor.old_nec + 1)
