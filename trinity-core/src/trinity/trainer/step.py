"""One training step, the same for every back-end: :func:`train_step` over :class:`StepPrimitives`.

A back-end (:class:`~trinity.trainer.native.NativeTrainer`, :class:`~trinity.trainer.verl.trainer.VerlTrainer`)
provides the primitives — build the batch, reference log-probs, critic values, the policy's
log-probs (and entropy) before the update, a critic update, an actor update — and this module runs
them in one order, with one set of rules:

1. the batch (:class:`~trinity.trainer.batch.TrainBatch`) and the back-end's plan for it;
2. reference log-probs (when a reference model is loaded) and critic values (PPO), no gradients;
3. ``old_logprob``: the rollout's own with ``trainer.use_rollout_logprobs`` (or
   ``algorithm.rollout_correction.bypass_mode``; when every experience carries them), else
   recomputed — before the advantage when the KL reward penalty or rollout correction needs it or
   the back-end cannot take it from its update, else from the first epoch of the actor update
   (the same, not yet updated, weights: the same numbers without another forward pass); with
   ``old_entropy`` / ``old_nec`` when the advantage declares them;
4. the KL reward penalty and the advantage (:meth:`~trinity.trainer.components.AlgorithmComponents.shape_rewards_and_advantages`);
5. rollout correction (``algorithm.rollout_correction``, :mod:`trinity.trainer.rollout_correction`):
   importance weights and rejection between the rollout's and the trainer's log-probs;
6. the critic update, then (after ``trainer.critic_warmup`` steps) the actor update;
7. the step's metrics: the trainer-vs-rollout log-prob agreement and its histogram (when
   ``old_logprob`` was recomputed), checked by the log-prob guard
   (:mod:`trinity.trainer.logprob_guard`), the data statistics and timings
   (:func:`~trinity.trainer.metrics.step_summary`).

Each stage returns what it adds and the step makes a new batch with it; nothing changes a batch
in place.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from trinity.trainer.components import MissingInputError
from trinity.trainer.logprob_guard import guard_for
from trinity.trainer.metrics import logprob_agreement, logprob_diff_histogram, step_summary

if TYPE_CHECKING:
    import torch

    from trinity.config import Config
    from trinity.experience import Experience
    from trinity.trainer.batch import TrainBatch
    from trinity.trainer.components import AlgorithmComponents

#: What the policy can give before the update, besides its log-probs (AdvantageFn.required_inputs).
POLICY_STATS = ("old_logprob", "old_entropy", "old_nec")

_WHAT = {
    "old_entropy": "the policy's entropy before the update",
    "old_nec": "the expectation of p(H + log p) over the vocabulary",
}


class StepPrimitives(Protocol):
    """What a back-end provides for :func:`train_step`.

    ``plan`` is whatever :meth:`prepare` returned with the batch (the native trainer's
    micro-batches); the step hands it unchanged to every other primitive of the same step.
    """

    config: Config
    components: AlgorithmComponents
    #: Steps trained so far; :func:`train_step` advances it.
    global_step: int
    #: A reference model is loaded (a component needs ``ref_logprob``).
    use_ref: bool
    #: A critic is trained (the algorithm type uses one).
    use_critic: bool
    #: Which of :data:`POLICY_STATS` :meth:`policy_stats` computes.
    policy_stats_names: ClassVar[tuple[str, ...]]
    #: Whether :meth:`update_actor` returns ``old_logprob`` from its first epoch when the batch
    #: has none (else the step computes it before the advantage).
    old_logprob_from_update: ClassVar[bool]

    def prepare(self, experiences: list[Experience]) -> tuple[TrainBatch, Any]:
        """The padded batch of ``experiences`` where the back-end computes, and its plan."""
        ...

    def ref_logprobs(self, batch: TrainBatch, plan: Any) -> torch.Tensor:
        """The reference model's log-probs ``(B, T)``."""
        ...

    def values(self, batch: TrainBatch, plan: Any) -> torch.Tensor:
        """The critic's values ``(B, T)``."""
        ...

    def policy_stats(self, batch: TrainBatch, plan: Any, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``(B, T)`` no-grad statistics of the policy before the update, those of ``names``."""
        ...

    def update_critic(self, batch: TrainBatch, plan: Any) -> dict[str, float]:
        """Train the critic on ``batch``; metrics under ``critic/``."""
        ...

    def update_actor(self, batch: TrainBatch, plan: Any) -> tuple[dict[str, float], torch.Tensor | None]:
        """Train the actor on ``batch`` (``trainer.ppo_epochs`` epochs; the loss's ``global_step``
        is ``self.global_step + 1``); metrics under ``actor/``, and ``old_logprob`` when it was
        taken from the first epoch (``old_logprob_from_update`` and the batch had none)."""
        ...


def train_step(backend: StepPrimitives, experiences: list[Experience]) -> dict[str, Any]:
    """Train ``backend`` on one batch of experiences (see the module docstring); returns metrics
    with Trinity-RFT names (numbers, and one :class:`~trinity.monitor.base.Histogram`)."""
    start = time.perf_counter()
    timing: dict[str, float] = {}
    metrics: dict[str, Any] = {}
    comps = backend.components
    guard = guard_for(backend)
    correction = backend.config.algorithm.rollout_correction or guard.correction
    bypass = correction is not None and correction.bypass_mode
    batch, plan = backend.prepare(experiences)

    def timed(name: str, fn: Any, *args: Any) -> Any:
        tick = time.perf_counter()
        out = fn(*args)
        timing[name] = time.perf_counter() - tick
        return out

    if backend.use_ref:
        batch = batch.with_(ref_logprob=timed("timing/ref", backend.ref_logprobs, batch, plan))
    if backend.use_critic:
        batch = batch.with_(values=timed("timing/values", backend.values, batch, plan))

    from_rollout = False
    if backend.config.trainer.use_rollout_logprobs or bypass:
        rollout = comps.rollout_old_logprob(batch)
        if rollout is not None:
            batch, from_rollout = batch.with_(old_logprob=rollout), True
    # Rollout correction compares the trainer's log-probs with the rollout's before the update.
    correct = correction is not None and not from_rollout
    wanted = set(comps.pre_update_inputs)
    if from_rollout:
        wanted.discard("old_logprob")
    elif (
        comps.uses_kl_penalty
        or not backend.old_logprob_from_update
        or (correct and batch.has_rollout_logprobs)
    ):
        wanted.add("old_logprob")
    unsupported = [n for n in POLICY_STATS if n in wanted and n not in backend.policy_stats_names]
    if unsupported:
        name = unsupported[0]
        raise MissingInputError(
            f"{comps.describe('advantage_fn')} needs {name!r} ({_WHAT.get(name, name)}), which the "
            f"{backend.config.trainer.trainer_type} trainer does not compute; use trainer_type: native"
        )
    if wanted:
        names = tuple(n for n in POLICY_STATS if n in wanted)
        batch = batch.with_(**timed("timing/old_log_prob", backend.policy_stats, batch, plan, names))

    def agreement(compared: TrainBatch) -> None:
        # old_logprob is the trainer's forward of the weights the rollouts were sampled with.
        found = logprob_agreement(compared)
        metrics.update(found)
        metrics.update(logprob_diff_histogram(compared))
        guard.check(found, compared.info, backend, backend.global_step + 1)

    compared = not from_rollout and batch.old_logprob is not None
    if compared:
        agreement(batch)

    batch, shaping_metrics = timed("timing/adv", comps.shape_rewards_and_advantages, batch)
    metrics.update(shaping_metrics)
    # The data statistics describe the batch as shaped, not as weighted by the correction.
    shaped = batch
    if correct:
        from trinity.trainer.rollout_correction import apply_rollout_correction

        batch, correction_metrics = timed(
            "timing/rollout_correction", apply_rollout_correction, batch, correction, comps
        )
        metrics.update(correction_metrics)

    if backend.use_critic:
        metrics.update(timed("timing/update_critic", backend.update_critic, batch, plan))
    if backend.global_step >= backend.config.trainer.critic_warmup:
        actor_metrics, old_logprob = timed("timing/update_actor", backend.update_actor, batch, plan)
        metrics.update(actor_metrics)
        if old_logprob is not None:
            batch = batch.with_(old_logprob=old_logprob)
    if not from_rollout and not compared:
        agreement(batch)
    backend.global_step += 1

    timing["timing/step"] = time.perf_counter() - start
    max_response = backend.config.model.max_response_tokens
    metrics.update(step_summary(shaped, timing, backend.global_step, max_response))
    return metrics


__all__ = ["POLICY_STATS", "StepPrimitives", "train_step"]
