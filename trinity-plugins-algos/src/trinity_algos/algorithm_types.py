"""Algorithm types: one ``algorithm.algorithm_type`` name that sets a whole algorithm up.

Defaults follow Trinity-RFT's ``trinity/algorithm/algorithm.py``: which components, how many
rollouts per task, whether a critic or a reference model is needed, and the data schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import AlgorithmType

if TYPE_CHECKING:
    from trinity.config import Config


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


class _GroupBaselineAlgorithm(AlgorithmType):
    """Algorithms whose advantage compares several rollouts of one task."""

    @classmethod
    def check_config(cls, config: Config) -> None:
        """``algorithm.repeat_times`` must be > 1: a group of one has no baseline."""
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


class PPOAlgorithm(AlgorithmType):
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


class REINFORCEPlusPlusAlgorithm(AlgorithmType):
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
        return _rollout_defaults("grpo", "mix", repeat_times=8, sample_strategy="mix")

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Group rule, plus: the ``mix`` sample strategy needs its expert buffer configured."""
        super().check_config(config)
        if _get(config, "algorithm.sample_strategy") not in (None, "mix"):
            return
        args = _get(config, "algorithm.sample_strategy_args") or {}
        name = args.get("sft_dataset_name", "sft_dataset") if isinstance(args, dict) else "sft_dataset"
        trainer_input = _get(config, "buffer.trainer_input")
        if trainer_input is None:
            return
        auxiliary = _get(trainer_input, "auxiliary_buffers") or {}
        if name not in auxiliary:
            raise ValueError(
                f"buffer.trainer_input.auxiliary_buffers.{name} is required when algorithm_type is 'mix' "
                "(it holds the expert data mixed into every batch)"
            )


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


ALGORITHM_TYPES: dict[str, type[AlgorithmType]] = {
    "ppo": PPOAlgorithm,
    "grpo": GRPOAlgorithm,
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
}

__all__ = ["ALGORITHM_TYPES", *sorted(cls.__name__ for cls in ALGORITHM_TYPES.values())]
