"""The algorithm runtime both trainer back-ends share: components built once, one actor loss.

:meth:`AlgorithmComponents.from_config` turns ``config.algorithm`` into component instances
(looked up in the plugin registry) and applies the rules every back-end follows, here and nowhere
else:

- ``kl_loss_fn`` / ``kl_penalty_fn`` / ``entropy_loss_fn`` unset or ``none`` are the null
  components :class:`~trinity.algorithm.NoKLFn` / :class:`~trinity.algorithm.NoEntropyLossFn`
  (the registry's ``none`` when a plugin registers it, else the core's own class), and an entropy
  bonus with ``entropy_coef: 0`` is :class:`~trinity.algorithm.NoEntropyLossFn` too (it would add
  nothing but a backward pass through the softmax). A null component is skipped, not added as 0;
- ``policy_loss_fn`` is required, and ``advantage_fn`` when the algorithm type uses an advantage;
- a component that needs ``ref_logprob`` while the algorithm type has no reference model is an
  error naming both.

The one training step (:mod:`trinity.trainer.step`) calls
:meth:`~AlgorithmComponents.shape_rewards_and_advantages` in-process for every back-end. The native
trainer's update calls :meth:`~AlgorithmComponents.actor_loss` in-process; the veRL back-end calls
it inside its workers, through
:class:`~trinity.trainer.verl.loss.ActorLoss`, which travels as :func:`algorithm_spec` (names and
arguments only) and rebuilds the same components there with :meth:`AlgorithmComponents.from_spec`.

A tensor a component needs and the batch lacks is a :class:`MissingInputError` naming the
component and the tensor, in both back-ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity.algorithm import NULL_COMPONENTS, NoEntropyLossFn, NoKLFn

if TYPE_CHECKING:
    import torch

    from trinity.algorithm import AdvantageFn, AlgorithmType, EntropyLossFn, KLFn, PolicyLossFn
    from trinity.config.sections.algorithm import AlgorithmConfig
    from trinity.trainer.batch import TrainBatch

# The keys the actor loss is made of (what ActorLoss carries to veRL's workers).
LOSS_KEYS = ("policy_loss_fn", "kl_loss_fn", "entropy_loss_fn")
# The keys of every component a back-end builds (the sample strategy is the Trainer's).
TRAINER_KEYS = ("advantage_fn", "kl_penalty_fn", *LOSS_KEYS)


class MissingInputError(ValueError):
    """A component needs a tensor the training batch does not have."""


def _kind(key: str) -> str:
    from trinity.config.sections.algorithm import COMPONENT_KEYS

    return dict(COMPONENT_KEYS)[key]


def algorithm_spec(algorithm: AlgorithmConfig, keys: tuple[str, ...] = TRAINER_KEYS) -> dict[str, Any]:
    """The names and ``*_args`` of ``keys`` in ``algorithm``, its type and ``loss_agg_mode``: a
    plain, picklable dict :meth:`AlgorithmComponents.from_spec` builds the components from."""
    spec: dict[str, Any] = {
        "algorithm_type": algorithm.algorithm_type,
        "loss_agg_mode": algorithm.loss_agg_mode or "token-mean",
    }
    for key in keys:
        spec[key] = getattr(algorithm, key)
        spec[f"{key}_args"] = dict(getattr(algorithm, f"{key}_args") or {})
    return spec


def _required_params(fn: Any) -> tuple[str, ...]:
    """Keyword tensors ``fn.__call__`` declares without a default (besides ``logprob``)."""
    params = inspect.signature(type(fn).__call__).parameters
    return tuple(
        n
        for n, p in params.items()
        if n not in ("self", "logprob")
        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        and p.default is inspect.Parameter.empty
    )


@dataclass
class AlgorithmComponents:
    """The algorithm's component instances, with the rules of the module docstring applied.

    ``kl_penalty_fn``, ``kl_loss_fn`` and ``entropy_loss_fn`` are never ``None``: off is the null
    component. ``advantage_fn`` is ``None`` when the algorithm has none (SFT, DPO);
    ``algorithm_type`` is ``None`` where only the loss was built (veRL's workers).
    """

    policy_loss_fn: PolicyLossFn
    kl_loss_fn: KLFn = field(default_factory=NoKLFn)
    entropy_loss_fn: EntropyLossFn = field(default_factory=NoEntropyLossFn)
    kl_penalty_fn: KLFn = field(default_factory=NoKLFn)
    advantage_fn: AdvantageFn | None = None
    algorithm_type: type[AlgorithmType] | None = None
    loss_agg_mode: str = "token-mean"
    # Configured name per key, for messages ("kl_loss_fn 'k2'").
    names: dict[str, str | None] = field(default_factory=dict)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig) -> AlgorithmComponents:
        """The components of a resolved ``config.algorithm`` (every key a back-end uses)."""
        return cls.from_spec(algorithm_spec(algorithm))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> AlgorithmComponents:
        """Build from :func:`algorithm_spec` output (keys it lacks are off); the classes come from
        this process's plugin registry."""
        from trinity.plugins import get_component

        algo_name = spec.get("algorithm_type")
        algo_cls = get_component("algorithm_type", algo_name) if algo_name else None
        built: dict[str, Any] = {}
        names: dict[str, str | None] = {"algorithm_type": algo_name}
        for key in TRAINER_KEYS:
            names[key] = spec.get(key)
            built[key] = _build(key, spec.get(key), spec.get(f"{key}_args"))
        if built["policy_loss_fn"] is None:
            raise ValueError("algorithm.policy_loss_fn is not set; the trainer needs one")
        if getattr(built["entropy_loss_fn"], "entropy_coef", None) == 0:
            built["entropy_loss_fn"] = NoEntropyLossFn()
        comps = cls(
            policy_loss_fn=built["policy_loss_fn"],
            kl_loss_fn=built["kl_loss_fn"],
            entropy_loss_fn=built["entropy_loss_fn"],
            kl_penalty_fn=built["kl_penalty_fn"],
            advantage_fn=built["advantage_fn"],
            algorithm_type=algo_cls,
            loss_agg_mode=spec.get("loss_agg_mode") or "token-mean",
            names=names,
        )
        comps._check_algorithm_type()
        return comps

    def _check_algorithm_type(self) -> None:
        algo = self.algorithm_type
        if algo is None:
            return
        name = self.names.get("algorithm_type") or getattr(algo, "__name__", str(algo))
        if algo.use_advantage and self.advantage_fn is None:
            raise ValueError(
                f"algorithm type {name!r} uses an advantage but algorithm.advantage_fn is not set"
            )
        adv = self.advantage_fn
        if self.uses_kl_penalty and adv is not None and not getattr(adv, "reads_token_level_rewards", True):
            raise ValueError(
                f"{self.describe('kl_penalty_fn')} would have no effect: {self.describe('advantage_fn')} "
                "reads the scalar reward, not the token-level rewards the penalty is applied to; "
                "use its veRL form (e.g. grpo_verl) or set kl_penalty_fn: none"
            )
        users = self._ref_users()
        if users and not algo.use_reference:
            raise MissingInputError(
                f"{users[0]} needs 'ref_logprob', but algorithm type {name!r} uses no reference model "
                "(use_reference = False), so none is computed; set that component to none or "
                "choose an algorithm type with a reference model"
            )

    # -- what the components need ---------------------------------------------------------------

    def describe(self, key: str) -> str:
        """``"kl_loss_fn 'k2'"``: the key and its configured name, for messages."""
        name = self.names.get(key)
        if name is None:
            fn = getattr(self, key, None)
            name = type(fn).__name__ if fn is not None else None
        return f"{key} {name!r}"

    @property
    def uses_kl_loss(self) -> bool:
        return not isinstance(self.kl_loss_fn, NoKLFn)

    @property
    def uses_kl_penalty(self) -> bool:
        return not isinstance(self.kl_penalty_fn, NoKLFn)

    @property
    def uses_entropy_bonus(self) -> bool:
        return not isinstance(self.entropy_loss_fn, NoEntropyLossFn)

    @property
    def policy_inputs(self) -> tuple[str, ...]:
        """Tensors the policy loss declares without a default: it cannot run without them."""
        return _required_params(self.policy_loss_fn)

    @property
    def advantage_inputs(self) -> tuple[str, ...]:
        """Tensors the advantage function needs computed before it runs
        (:attr:`~trinity.algorithm.AdvantageFn.required_inputs`); empty when none is called."""
        use = self.algorithm_type.use_advantage if self.algorithm_type is not None else True
        if not use or self.advantage_fn is None:
            return ()
        return tuple(getattr(self.advantage_fn, "required_inputs", ()) or ())

    @property
    def pre_update_inputs(self) -> tuple[str, ...]:
        """What the back-end computes with the policy *before* the advantage, of
        ``old_logprob``, ``old_entropy`` and ``old_nec`` (normally ``old_logprob`` comes for free from the first
        epoch of the update; an advantage that reads it, or the policy's entropy, needs a
        forward pass first)."""
        return tuple(n for n in ("old_logprob", "old_entropy", "old_nec") if n in self.advantage_inputs)

    def _ref_users(self) -> list[str]:
        users = []
        if "ref_logprob" in self.policy_inputs:
            users.append(self.describe("policy_loss_fn"))
        if "ref_logprob" in self.advantage_inputs:
            users.append(self.describe("advantage_fn"))
        if self.uses_kl_loss:
            users.append(self.describe("kl_loss_fn"))
        if self.uses_kl_penalty:
            users.append(self.describe("kl_penalty_fn"))
        return users

    @property
    def needs_ref_logprob(self) -> bool:
        """Whether anything needs the reference model's log-probs."""
        return bool(self._ref_users())

    @property
    def use_reference(self) -> bool:
        """Whether a back-end loads a reference model: the algorithm type has one and a
        component needs it."""
        use = self.algorithm_type.use_reference if self.algorithm_type is not None else True
        return bool(use) and self.needs_ref_logprob

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss uses entropy (the bonus, or a policy loss that declares it)."""
        return self.uses_entropy_bonus or "entropy" in self.policy_loss_fn.required_tensors()

    def _old_logprob_users(self) -> list[str]:
        users = []
        if "old_logprob" in self.policy_inputs:
            users.append(self.describe("policy_loss_fn"))
        if "old_logprob" in self.advantage_inputs:
            users.append(self.describe("advantage_fn"))
        if self.uses_kl_penalty:
            users.append(self.describe("kl_penalty_fn"))
        return users

    @property
    def needs_old_logprob(self) -> bool:
        """Whether anything needs ``old_logprob`` (SFT and DPO losses do not)."""
        return bool(self._old_logprob_users())

    # -- one step -------------------------------------------------------------------------------

    def rollout_old_logprob(self, batch: TrainBatch) -> torch.Tensor | None:
        """With ``trainer.use_rollout_logprobs``: the rollout's log-probs, to serve as
        ``old_logprob``. Where some experience carries none (the batch's ``has_rollout_logprobs``
        is false) that is an error if a component needs ``old_logprob``, else ``None`` (the
        back-end recomputes it as usual)."""
        if batch.has_rollout_logprobs:
            return batch.rollout_logprobs
        users = self._old_logprob_users()
        if users:
            raise MissingInputError(
                f"{users[0]} needs 'old_logprob', and trainer.use_rollout_logprobs is set, but some "
                "experiences carry no log-probs (rollout_logprobs); have the explorer return them, "
                "or unset trainer.use_rollout_logprobs"
            )
        return None

    def shape_rewards_and_advantages(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """Apply the KL reward penalty (if any), then the advantage function (if the algorithm
        uses one), as every back-end does before its updates; returns a new batch and metrics.

        The components receive the batch as a plain ``dict`` of its fields (their contract:
        a mapping they may change and return); ``batch`` itself is left as it was.
        """
        from trinity.trainer.batch import TrainBatch

        metrics: dict[str, float] = {}
        data: Mapping[str, Any] = batch
        if self.uses_kl_penalty:
            for name in ("old_logprob", "ref_logprob"):
                self._require(data, name, "kl_penalty_fn")
            data, kl_metrics = self.kl_penalty_fn.apply_kl_penalty_to_reward(dict(data))
            metrics["actor/reward_kl_penalty"] = kl_metrics.get("kl", 0.0)
            metrics["actor/reward_kl_penalty_coeff"] = kl_metrics.get("kl_coef", 0.0)
        use_advantage = self.algorithm_type.use_advantage if self.algorithm_type is not None else True
        if use_advantage and self.advantage_fn is not None:
            for name in self.advantage_inputs:
                self._require(data, name, "advantage_fn")
            data, adv_metrics = self.advantage_fn(dict(data))
            metrics.update({f"advantage/{k}": v for k, v in adv_metrics.items()})
        return TrainBatch.from_mapping(data), metrics

    def _require(self, tensors: Mapping[str, Any], name: str, key: str) -> None:
        if tensors.get(name) is None:
            raise MissingInputError(
                f"{self.describe(key)} needs {name!r}, which the training batch does not have"
                + _HINTS.get(name, "")
            )

    def actor_loss(
        self,
        logprob: torch.Tensor,
        entropy: torch.Tensor | None,
        tensors: Mapping[str, Any],
        global_step: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``policy_loss + kl_loss - entropy_bonus`` for one micro-batch (not scaled).

        ``logprob`` / ``entropy`` ``(B, T)`` come from the model being trained (``entropy`` may
        be ``None`` where nothing needs it); ``tensors`` holds the micro-batch under Trinity's
        names (``action_mask``, ``old_logprob``, ``advantages``, ``ref_logprob``, …), all passed
        to the policy loss by keyword, with ``global_step`` (the 1-based index of the training
        step being computed, for schedules such as CHORD's ``mu``) when the back-end gives it.
        The entropy loss also receives ``expert_mask`` (``mix`` leaves expert rows out). Null
        components are skipped. Metric names carry no prefix. Raises :class:`MissingInputError`
        when a component's tensor is missing.
        """
        from trinity.algorithm import masked_mean

        for name in self.policy_inputs:
            if name == "entropy":
                if entropy is None:
                    self._require({}, "entropy", "policy_loss_fn")
            else:
                self._require(tensors, name, "policy_loss_fn")
        self._require(tensors, "action_mask", "policy_loss_fn")
        if self.uses_kl_loss:
            self._require(tensors, "ref_logprob", "kl_loss_fn")
        if self.uses_entropy_bonus and entropy is None:
            self._require({}, "entropy", "entropy_loss_fn")

        mask = tensors["action_mask"]
        kwargs = dict(tensors)
        if entropy is not None:
            kwargs["entropy"] = entropy
        if global_step is not None:
            kwargs["global_step"] = int(global_step)
        loss, policy_metrics = self.policy_loss_fn(logprob, **kwargs)
        metrics = dict(policy_metrics)
        total = loss
        if self.uses_kl_loss:
            kl_loss, km = self.kl_loss_fn.calculate_kl_loss(
                logprob,
                tensors["ref_logprob"],
                mask,
                self.loss_agg_mode,
                old_logprob=tensors.get("old_logprob"),
            )
            total = total + kl_loss
            metrics.update(km)
        if self.uses_entropy_bonus:
            ent_loss, em = self.entropy_loss_fn(
                entropy, mask, loss_agg_mode=self.loss_agg_mode, expert_mask=tensors.get("expert_mask")
            )
            total = total - ent_loss
            metrics.update(em)
        if entropy is not None:
            metrics["entropy"] = float(masked_mean(entropy.detach(), mask))
        metrics["loss"] = float(total.detach())
        return total, metrics


_HINTS = {
    "ref_logprob": " (the reference model's log-probs: the algorithm type must use a reference model)",
    "entropy": " (the back-end computes entropy only when the loss declares it)",
    "old_logprob": " (recomputed by the back-end, or the rollout's with trainer.use_rollout_logprobs)",
    "teacher_logprobs": (
        " (a teacher model's log-probs of each response: the workflow records them on "
        "Experience.teacher_logprobs, e.g. on_policy_distill_workflow with a teacher in "
        "explorer.auxiliary_models; every experience of the batch needs them)"
    ),
    "old_entropy": " (the back-end computes it before the advantage when the advantage declares it)",
    "old_nec": " (the native trainer computes it before the advantage when the advantage declares it)",
    "trajectory_ids": " (built from each experience's eid: batch, task and run)",
}


def _build(key: str, name: str | None, args: Mapping[str, Any] | None) -> Any:
    """An instance of the component ``name`` for ``key``, or the null component (see the module
    docstring); ``None`` for an unset policy loss or advantage."""
    from trinity.plugins import UnknownComponentError, get_component

    kind = _kind(key)
    null = NULL_COMPONENTS.get(kind)
    if name is None:
        return null() if null is not None else None
    try:
        cls = get_component(kind, name)
    except UnknownComponentError:
        # `none` means the null component with or without the plugin that registers the name.
        if name == "none" and null is not None:
            return null()
        raise
    try:
        return cls(**dict(args or {}))
    except TypeError as exc:
        raise ValueError(f"algorithm.{key}_args do not fit {kind} {name!r}: {exc}") from None


__all__ = ["LOSS_KEYS", "TRAINER_KEYS", "AlgorithmComponents", "MissingInputError", "algorithm_spec"]
