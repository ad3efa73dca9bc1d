"""The ``algorithm`` section: algorithm type, its components and their arguments, optimizer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from trinity.config.sections.base import F, Section, lower_alias

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
# Learning-rate schedules (``trinity.trainer.schedule.SCHEDULE_TYPES``); checked by resolve_config,
# so an OptimizerConfig built in code still reaches the trainer's own check.
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")

# (config key, plugin kind) of every configurable algorithm component; ``<key>_args`` holds its args.
COMPONENT_KEYS: tuple[tuple[str, str], ...] = (
    ("sample_strategy", "sample_strategy"),
    ("advantage_fn", "advantage_fn"),
    ("policy_loss_fn", "policy_loss_fn"),
    ("kl_penalty_fn", "kl_fn"),
    ("kl_loss_fn", "kl_fn"),
    ("entropy_loss_fn", "entropy_loss_fn"),
)


class OptimizerConfig(Section):
    """Optimizer and learning-rate schedule of the policy model."""

    lr: float = F(1e-6, "Learning rate.", ge=0)
    lr_warmup_steps: int = F(-1, "Warm-up steps; a negative value uses `lr_warmup_steps_ratio` instead.")
    lr_warmup_steps_ratio: float = F(
        0.0, "Warm-up steps as a fraction of the total training steps.", ge=0, le=1
    )
    min_lr_ratio: float = F(
        0.01, "Lowest learning rate of the cosine schedule, as a fraction of `lr`.", ge=0, le=1
    )
    warmup_style: str | None = F(None, "Deprecated alias of `lr_scheduler_type` (`constant` or `cosine`).")
    lr_scheduler_type: str = F("constant", "Learning-rate schedule after warm-up: `constant` or `cosine`.")
    optimizer_type: str = F("adam", "Optimizer: `adam` (AdamW) or `sgd`.")
    betas: list[float] = F([0.9, 0.999], "Adam beta coefficients.", min_length=2, max_length=2)
    weight_decay: float = F(0.01, "Weight decay.", ge=0)
    clip_grad: float = F(1.0, "Gradient-norm clipping threshold.", gt=0)

    @field_validator("warmup_style", "lr_scheduler_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: list[float]) -> list[float]:
        for beta in value:
            if not 0 <= beta < 1:
                raise ValueError(f"each beta must be in [0, 1), got {value}")
        return value


class AlgorithmConfig(Section):
    """Which RL algorithm to run. Components left unset come from the algorithm type's
    ``default_config()``; ``*_args`` left unset come from the component's ``default_args()``."""

    algorithm_type: str = F("ppo", "Algorithm, as registered by a plugin (`ppo`, `grpo`, `dpo`, `sft`, ...).")
    repeat_times: int = F(1, "Rollouts per task (the group size of GRPO-like algorithms).", ge=1)
    optimizer: OptimizerConfig = F(default_factory=OptimizerConfig, doc="Optimizer settings.")
    sample_strategy: str | None = F(None, "How the trainer draws experiences from the buffer.")
    sample_strategy_args: dict[str, Any] | None = F(None, "Arguments of the sample strategy.")
    advantage_fn: str | None = F(None, "Advantage estimator (e.g. `ppo` = GAE, `grpo`).")
    advantage_fn_args: dict[str, Any] | None = F(None, "Arguments of the advantage estimator.")
    kl_penalty_fn: str | None = F(None, "KL estimator applied to the reward; `none` disables it.")
    kl_penalty_fn_args: dict[str, Any] | None = F(None, "Arguments of the reward KL penalty.")
    policy_loss_fn: str | None = F(None, "Policy loss (e.g. `ppo`, `sft`, `dpo`).")
    policy_loss_fn_args: dict[str, Any] | None = F(None, "Arguments of the policy loss.")
    kl_loss_fn: str | None = F(None, "KL estimator added to the loss; `none` disables it.")
    kl_loss_fn_args: dict[str, Any] | None = F(None, "Arguments of the KL loss (e.g. `kl_coef`).")
    entropy_loss_fn: str | None = F(None, "Entropy bonus (`default`, or `none`).")
    entropy_loss_fn_args: dict[str, Any] | None = F(
        None, "Arguments of the entropy term (e.g. `entropy_coef`)."
    )
    loss_agg_mode: LossAggMode | None = F(
        None, "How token losses are reduced to a scalar; default `token-mean`."
    )
    enable_router_replay: bool = F(
        False,
        "Replay rollout expert routing in training (MoE models, veRL only). Has no effect in this version.",
    )
    bypass_old_logprobs: bool = F(
        True,
        "Use rollout logprobs as old logprobs instead of recomputing them. Has no effect in this version.",
    )
    rollout_correction: dict[str, Any] | None = F(
        None,
        "Off-policy correction settings (importance weights, rejection sampling), veRL only. Has no effect in this version.",
    )

    @field_validator("loss_agg_mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value
