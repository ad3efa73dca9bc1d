"""Algorithm types: one ``algorithm.algorithm_type`` name that sets a whole algorithm up.

Defaults follow Trinity-RFT's ``trinity/algorithm/algorithm.py``: which components, how many
rollouts per task, whether a critic or a reference model is needed, and the data schema.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trinity.algorithm import AlgorithmType

if TYPE_CHECKING:
    from trinity.config import Config

logger = logging.getLogger(__name__)


def _get(obj: Any, dotted: str) -> Any:
    """``obj.a.b.c`` for ``"a.b.c"``; ``None`` where a link is missing (mappings work too)."""
    for part in dotted.split("."):
        if obj is None:
            return None
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


def _rollout_defaults(
    advantage_fn: str, policy_loss_fn: str, repeat_times: int = 2, **over: Any
) -> dict[str, Any]:
    config = {
        "repeat_times": repeat_times,
        "advantage_fn": advantage_fn,
        "sample_strategy": "default",
        "policy_loss_fn": policy_loss_fn,
        "kl_penalty_fn": "none",
        "kl_loss_fn": "k2",
        "entropy_loss_fn": "default",
    }
    config.update(over)
    return config


def _check_expert_buffer(config: Config) -> None:
    """With the ``mix`` sample strategy, the auxiliary buffer of expert data must exist."""
    if _get(config, "algorithm.sample_strategy") not in (None, "mix"):
        return
    args = _get(config, "algorithm.sample_strategy_args") or {}
    name = args.get("sft_dataset_name", "sft_dataset") if isinstance(args, dict) else "sft_dataset"
    trainer_input = _get(config, "buffer.trainer_input")
    if trainer_input is None:
        return
    auxiliary = _get(trainer_input, "auxiliary_buffers") or {}
    if name not in auxiliary:
        algo = _get(config, "algorithm.algorithm_type") or "mix"
        raise ValueError(
            f"buffer.trainer_input.auxiliary_buffers.{name} is required when algorithm_type is {algo!r} "
            "(it holds the expert data mixed into every batch)"
        )


def _mix_batch_sizes(config: Config) -> dict[str, dict[str, Any]]:
    """The ``mix`` / ``mix_chord`` loss's usual and expert row counts, as the ``mix`` sample
    strategy splits a training batch (:func:`~trinity_algos.sample_strategy.mix_split`): with them
    the loss averages each part over its own rows across micro-batches, as upstream's loss does
    under veRL. Config resolution fills them unless the user set them."""
    from trinity_algos.sample_strategy import mix_split

    if _get(config, "algorithm.policy_loss_fn") not in ("mix", "mix_chord"):
        return {}
    ratio = (_get(config, "algorithm.sample_strategy_args") or {}).get("expert_data_ratio")
    args = _get(config, "algorithm.policy_loss_fn_args") or {}
    if (
        ratio is None
        or args.get("train_batch_size_usual") is not None
        or args.get("train_batch_size_expert") is not None
    ):
        return {}
    usual, expert = mix_split(ratio, config.geometry.experiences_per_train_step)
    return {"policy_loss_fn_args": {"train_batch_size_usual": usual, "train_batch_size_expert": expert}}


def _mix_explored(config: Config) -> int:
    """Rollout rows of a ``mix`` sampled batch (the rest are expert rows): what the explorer
    must supply per train step."""
    from trinity_algos.sample_strategy import mix_split

    train_batch_size = config.buffer.train_batch_size
    if _get(config, "algorithm.sample_strategy") != "mix":
        return train_batch_size
    ratio = (_get(config, "algorithm.sample_strategy_args") or {}).get("expert_data_ratio", 0.5)
    return mix_split(ratio, train_batch_size)[0]


# Configurations the M2PO micro-batch warning was logged for (once per process each).
_M2PO_WARNED: set[tuple[Any, ...]] = set()


def _check_m2po(config: Config) -> None:
    """Rules for the ``m2po`` policy loss, whichever algorithm type uses it.

    Its ratio must be against the behaviour policy, so ``old_logprob`` must be the rollout's
    (``trainer.use_rollout_logprobs``, which Trinity-RFT's ``algorithm.bypass_old_logprobs``
    sets). And its token selection is made per loss call: where the
    trainer may split a step into micro-batches, a warning (once) says so and how to avoid it.
    """
    if _get(config, "algorithm.policy_loss_fn") != "m2po":
        return
    if _get(config, "mode") in ("explore", "bench", "serve"):
        return  # no trainer in this job (the explorer side of a decoupled run)
    # veRL's rollout_correction bypass mode also makes old_logprob the rollout's.
    bypass = _get(config, "algorithm.rollout_correction.bypass_mode") is True
    if _get(config, "trainer.use_rollout_logprobs") is False and not bypass:
        raise ValueError(
            "policy_loss_fn 'm2po' measures the importance ratio against the policy that sampled the "
            "rollouts; set trainer.use_rollout_logprobs: true (Trinity-RFT's "
            "algorithm.bypass_old_logprobs: true)"
        )
    trainer = _get(config, "trainer")
    geometry = getattr(config, "geometry", None)
    rows = getattr(geometry, "experiences_per_train_step", None)
    max_len = _get(config, "model.max_model_len")
    if trainer is None or not rows:
        return
    budget, micro = _get(trainer, "max_token_len_per_gpu"), _get(trainer, "ppo_micro_batch_size_per_gpu")
    if _get(trainer, "use_dynamic_bsz") and budget:
        if not max_len or rows * max_len <= budget:
            return
        why = (
            f"trainer.max_token_len_per_gpu ({budget}) is below {rows} experiences x "
            f"model.max_model_len ({max_len})"
        )
        fix = f"raise trainer.max_token_len_per_gpu to {rows * max_len}"
    elif micro and micro < rows:
        why = f"trainer.ppo_micro_batch_size_per_gpu ({micro}) is below the {rows} experiences of a step"
        fix = "leave trainer.ppo_micro_batch_size_per_gpu unset"
    else:
        return
    key = (why, fix)
    if key not in _M2PO_WARNED:
        _M2PO_WARNED.add(key)
        logger.warning(
            "policy_loss_fn 'm2po': the trainer may split a training step into micro-batches (%s), and "
            "M2PO then chooses the tokens to mask within each micro-batch, not over the whole step "
            "as the paper's Algorithm 1 does; %s for the exact selection",
            why,
            fix,
        )


class _RolloutAlgorithm(AlgorithmType):
    """Algorithms that train on the explorer's rollouts (any policy loss may be configured)."""

    @classmethod
    def check_config(cls, config: Config) -> None:
        """The ``m2po`` loss's rules (:func:`_check_m2po`)."""
        _check_m2po(config)


class _GroupBaselineAlgorithm(_RolloutAlgorithm):
    """Algorithms whose advantage compares several rollouts of one task."""

    @classmethod
    def check_config(cls, config: Config) -> None:
        """``algorithm.repeat_times`` must be > 1: a group of one has no baseline; the ``m2po``
        loss's rules (:func:`_check_m2po`)."""
        super().check_config(config)
        repeat_times = _get(config, "algorithm.repeat_times")
        if repeat_times is not None and repeat_times <= 1:
            name = _get(config, "algorithm.algorithm_type") or cls.__name__
            raise ValueError(
                f"algorithm.repeat_times is {repeat_times}, but algorithm_type {name!r} compares several "
                "rollouts of each task; set algorithm.repeat_times to 2 or more"
            )


class _OfflineAlgorithm(AlgorithmType):
    """Algorithms that train on a fixed dataset (SFT, DPO): ``mode: train`` only."""

    use_advantage = False

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Require ``mode: train`` and an experience buffer with a ``path``."""
        name = _get(config, "algorithm.algorithm_type") or cls.__name__
        mode = _get(config, "mode")
        if mode is not None and mode != "train":
            raise ValueError(
                f"mode is {mode!r}, but algorithm_type {name!r} trains on a dataset and runs only with "
                "mode: train"
            )
        buffer = _get(config, "buffer.trainer_input.experience_buffer")
        if _get(config, "buffer.trainer_input") is not None and not _get(buffer, "path"):
            raise ValueError(
                f"buffer.trainer_input.experience_buffer.path is required when algorithm_type is {name!r} "
                "(it points at the training dataset)"
            )


class PPOAlgorithm(_RolloutAlgorithm):
    """PPO with a critic (GAE advantages)."""

    use_critic = True
    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's PPO defaults."""
        return _rollout_defaults("ppo", "ppo", repeat_times=1)


class GRPOAlgorithm(_GroupBaselineAlgorithm):
    """GRPO: group-normalised advantages, PPO loss, k2 KL loss."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's GRPO defaults."""
        return _rollout_defaults("grpo", "ppo")


class M2POAlgorithm(_GroupBaselineAlgorithm):
    """M2PO, second-moment trust policy optimisation, for stale (off-policy) rollouts
    (https://openreview.net/forum?id=IIgl5MWelz): GRPO advantages, the ``m2po`` loss, no
    reference model, no KL or entropy term. Needs ``trainer.use_rollout_logprobs: true``."""

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT 0.6's M2PO defaults (8 rollouts per task)."""
        return _rollout_defaults("grpo", "m2po", repeat_times=8, kl_loss_fn="none", entropy_loss_fn="none")


class DAPOAlgorithm(_GroupBaselineAlgorithm):
    """DAPO: GRPO advantages and PPO loss, no KL and no reference model; clip-higher and
    token-level loss are set through ``policy_loss_fn_args``."""

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's DAPO defaults (16 rollouts per task)."""
        return _rollout_defaults("grpo", "ppo", repeat_times=16, kl_loss_fn="none")


class OPMDAlgorithm(_GroupBaselineAlgorithm):
    """Online policy mirror descent."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's OPMD defaults."""
        return _rollout_defaults("opmd", "opmd")


class AsymREAlgorithm(_GroupBaselineAlgorithm):
    """Asymmetric REINFORCE: shifted group-mean baseline, OPMD loss, no KL, no entropy."""

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's AsymRE defaults."""
        return _rollout_defaults("asymre", "opmd", kl_loss_fn="none", entropy_loss_fn="none")


class RLOOAlgorithm(_GroupBaselineAlgorithm):
    """REINFORCE leave-one-out."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's RLOO defaults."""
        return _rollout_defaults("rloo", "ppo")


class REINFORCEPlusPlusAlgorithm(_RolloutAlgorithm):
    """REINFORCE++: batch-whitened returns (no group baseline, so one rollout per task works)."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's REINFORCE++ defaults."""
        return _rollout_defaults("reinforceplusplus", "ppo")


class GSPOAlgorithm(_GroupBaselineAlgorithm):
    """GSPO: GRPO advantages with the sequence-level ratio loss."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's GSPO defaults."""
        return _rollout_defaults("grpo", "gspo")


class CISPOAlgorithm(_GroupBaselineAlgorithm):
    """CISPO: GRPO advantages with the clipped-IS-weight loss."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's CISPO defaults."""
        return _rollout_defaults("grpo", "cispo")


class MIXAlgorithm(_GroupBaselineAlgorithm):
    """MIX: GRPO on rollouts plus SFT on expert data from an auxiliary buffer."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's MIX defaults (8 rollouts per task, ``mix`` sampling and loss)."""
        return _rollout_defaults("grpo", "mix", repeat_times=8, sample_strategy="mix", entropy_loss_fn="mix")

    @classmethod
    def derived_args(cls, config: Config) -> dict[str, dict[str, Any]]:
        """The loss gets the batch's usual / expert row counts (:func:`_mix_batch_sizes`)."""
        return _mix_batch_sizes(config)

    @classmethod
    def explored_per_train_step(cls, config: Config) -> int:
        """Only the rollout share of a batch comes from the explorer (:func:`_mix_explored`)."""
        return _mix_explored(config)

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Group rule, plus: the ``mix`` sample strategy needs its expert buffer configured."""
        super().check_config(config)
        _check_expert_buffer(config)


class DPOAlgorithm(_OfflineAlgorithm):
    """Direct preference optimisation on chosen/rejected pairs."""

    use_reference = True
    can_balance_batch = False  # rows 2k and 2k+1 form a pair and must stay together
    schema = "dpo"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's DPO defaults; ``repeat_times`` 2 because each sample yields two rows."""
        return {
            "repeat_times": 2,
            "sample_strategy": "default",
            "policy_loss_fn": "dpo",
            "kl_loss_fn": "k2",
            "entropy_loss_fn": "default",
        }


class SFTAlgorithm(_OfflineAlgorithm):
    """Supervised fine-tuning on a dataset."""

    use_reference = False
    schema = "sft"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's SFT defaults."""
        return {
            "repeat_times": 1,
            "sample_strategy": "default",
            "policy_loss_fn": "sft",
            "kl_loss_fn": "none",
            "entropy_loss_fn": "none",
        }


class CPTAlgorithm(_OfflineAlgorithm):
    """Continued pre-training: next-token loss on every token of raw text (``format.text_key``)."""

    use_reference = False
    schema = "cpt"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """SFT's loss on raw text: no KL, no entropy term."""
        return {
            "repeat_times": 1,
            "sample_strategy": "default",
            "policy_loss_fn": "sft",
            "kl_loss_fn": "none",
            "entropy_loss_fn": "none",
        }


class TOPRAlgorithm(_RolloutAlgorithm):
    """TOPR, tapered off-policy REINFORCE (Le Roux et al., arXiv:2503.14286)."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's TOPR defaults (``reinforce`` advantages, ``topr`` loss)."""
        return _rollout_defaults("reinforce", "topr")


class SAPOAlgorithm(_GroupBaselineAlgorithm):
    """SAPO, soft adaptive policy optimisation: a temperature-controlled soft gate instead of
    PPO's hard clip."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's SAPO defaults."""
        return _rollout_defaults("grpo", "sapo")


class MIXCHORDAlgorithm(_GroupBaselineAlgorithm):
    """CHORD (arXiv:2508.11408): GRPO on rollouts plus an SFT term on expert data whose weight
    ``mu`` follows a schedule, with token-wise weighting (``sft_is`` / ``sft_phi``)."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's CHORD defaults (8 rollouts, ``mix`` sampling, ``mix_chord`` loss)."""
        return _rollout_defaults(
            "grpo", "mix_chord", repeat_times=8, sample_strategy="mix", entropy_loss_fn="mix"
        )

    @classmethod
    def derived_args(cls, config: Config) -> dict[str, dict[str, Any]]:
        """The loss gets the batch's usual / expert row counts (:func:`_mix_batch_sizes`)."""
        return _mix_batch_sizes(config)

    @classmethod
    def explored_per_train_step(cls, config: Config) -> int:
        """Only the rollout share of a batch comes from the explorer (:func:`_mix_explored`)."""
        return _mix_explored(config)

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Group rule, plus: the ``mix`` sample strategy needs its expert buffer configured."""
        super().check_config(config)
        _check_expert_buffer(config)


class RAFTAlgorithm(_RolloutAlgorithm):
    """RAFT, reward-ranked fine-tuning (arXiv:2304.06767): the SFT loss on successful rollouts.

    The ``raft`` advantage stage keeps rows with ``reward >= reward_threshold`` (1.0 by default;
    ``top_k`` keeps only the best per task) and masks the rest out of the loss.
    """

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's RAFT defaults (SFT loss, no KL, no entropy) plus the selection stage."""
        return {
            "sample_strategy": "default",
            "advantage_fn": "raft",
            "policy_loss_fn": "sft",
            "kl_penalty_fn": "none",
            "kl_loss_fn": "none",
            "entropy_loss_fn": "none",
        }


class SPPOAlgorithm(_GroupBaselineAlgorithm):
    """sPPO: OPMD advantages with the sPPO loss, no reference model."""

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's sPPO defaults."""
        return _rollout_defaults("opmd", "sppo", kl_loss_fn="none", entropy_loss_fn="none")


class RECAlgorithm(_GroupBaselineAlgorithm):
    """REC: group-relative REINFORCE with the REC family's clipping / weighting of the loss."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's REC defaults."""
        return _rollout_defaults("rec", "rec")


class MultiStepGRPOAlgorithm(_GroupBaselineAlgorithm):
    """GRPO for multi-step (step-wise) episodes: each turn is an Experience; the episode's
    advantage is computed per trajectory and broadcast to all its turns (``step_wise_grpo``)."""

    use_reference = True
    step_wise = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's multi-step GRPO defaults (8 rollouts per task)."""
        return _rollout_defaults("step_wise_grpo", "ppo", repeat_times=8)


class GiGPOAlgorithm(_GroupBaselineAlgorithm):
    """GiGPO, group-in-group policy optimisation (Feng et al., arXiv:2505.10978): episode-level
    group advantages plus step-level advantages among turns from the same environment state."""

    use_reference = True
    step_wise = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's GiGPO defaults."""
        return _rollout_defaults(
            "gigpo",
            "ppo",
            repeat_times=8,
            advantage_fn_args={"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-6},
            policy_loss_fn_args={
                "clip_range_low": 0.2,
                "clip_range_high": 0.2,
                "loss_agg_mode": "token-mean",
            },
        )


class OnPolicyDistillAlgorithm(_RolloutAlgorithm):
    """On-policy distillation: the student samples, a teacher (``explorer.auxiliary_models[0]``)
    scores its tokens, and ``A = kl_coef * (teacher_logprob - student_logprob)`` per token."""

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's on-policy distillation defaults."""
        return _rollout_defaults(
            "on_policy_distill",
            "ppo",
            repeat_times=8,
            advantage_fn_args={"kl_coef": 1.0},
            kl_loss_fn="none",
            entropy_loss_fn="none",
        )


class JSDAlgorithm(_RolloutAlgorithm):
    """On-policy distillation with a Jensen-Shannon divergence advantage."""

    use_reference = False

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's JSD defaults."""
        return _rollout_defaults(
            "jsd",
            "ppo",
            repeat_times=8,
            advantage_fn_args={"kl_coef": 1.0, "lambda_coef": 0.5},
            kl_loss_fn="none",
            entropy_loss_fn="none",
        )


class GRPOverlAlgorithm(_GroupBaselineAlgorithm):
    """GRPO as upstream runs it in veRL's trainer. Here every advantage runs in the trainer, so
    this is GRPO with upstream's ``grpo_verl`` defaults (which name the ``grpo`` advantage)."""

    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Trinity-RFT's GRPO-veRL defaults."""
        return _rollout_defaults("grpo", "ppo")


ALGORITHM_TYPES: dict[str, type[AlgorithmType]] = {
    "ppo": PPOAlgorithm,
    "grpo": GRPOAlgorithm,
    "m2po": M2POAlgorithm,
    "dapo": DAPOAlgorithm,
    "opmd": OPMDAlgorithm,
    "asymre": AsymREAlgorithm,
    "rloo": RLOOAlgorithm,
    "reinforceplusplus": REINFORCEPlusPlusAlgorithm,
    "gspo": GSPOAlgorithm,
    "cispo": CISPOAlgorithm,
    "dpo": DPOAlgorithm,
    "sft": SFTAlgorithm,
    "mix": MIXAlgorithm,
    "cpt": CPTAlgorithm,
    "topr": TOPRAlgorithm,
    "sapo": SAPOAlgorithm,
    "mix_chord": MIXCHORDAlgorithm,
    "raft": RAFTAlgorithm,
    "sppo": SPPOAlgorithm,
    "rec": RECAlgorithm,
    "multi_step_grpo": MultiStepGRPOAlgorithm,
    "gigpo": GiGPOAlgorithm,
    "on_policy_distill": OnPolicyDistillAlgorithm,
    "jsd": JSDAlgorithm,
    "grpo_verl": GRPOverlAlgorithm,
}

__all__ = ["ALGORITHM_TYPES", *sorted(cls.__name__ for cls in ALGORITHM_TYPES.values())]
