"""The ``algorithm`` section: algorithm type, its components and their arguments, optimizer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

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


# veRL 0.9's rejection-sampling options (``rollout_rs``): statistic of the log-ratio
# ``log r = log p_trainer - log p_rollout`` per token, or its sum / mean / max over a sequence.
# k1 bounds the ratio itself ([lower, upper]); k2 = (log r)^2 / 2 and k3 = r - 1 - log r (KL
# estimators, 0 when the policies agree) take an upper bound only.
ROLLOUT_RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
# Keys of veRL 0.6's flat rollout-IS settings, and what replaced them in ``rollout_correction``.
_LEGACY_ROLLOUT_IS = {
    "rollout_is_level": "rollout_is: token | sequence (geometric is rollout_rs: seq_mean_k1)",
    "rollout_is_mode": "rollout_is_threshold: 2.0 truncates, 'lower_upper' (e.g. '0.5_2.0') masks",
    "rollout_is_threshold_lower": "rollout_is_threshold: 'lower_upper'",
    "rollout_is_veto_threshold": "rollout_rs: token_k1 with rollout_rs_threshold",
    "rollout_token_veto_threshold": "rollout_rs: token_k1 with rollout_rs_threshold",
    "rollout_rs_threshold_lower": "rollout_rs_threshold: 'lower_upper'",
}


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``(upper, lower)`` of ``rollout_is_threshold``: a number truncates the weights at
    ``upper`` (TIS, ``lower`` is ``None``); ``"lower_upper"`` zeroes weights outside the range
    (IcePop-style masking)."""
    if isinstance(spec, bool):
        raise ValueError("rollout_is_threshold must be a number or a 'lower_upper' string, not a boolean")
    text = str(spec).strip()
    lower_text, _, upper_text = text.rpartition("_") if "_" in text else ("", "", text)
    try:
        upper = float(upper_text)
        lower = float(lower_text) if lower_text else None
    except ValueError:
        raise ValueError(
            f"rollout_is_threshold {spec!r}: expected a number (2.0) or 'lower_upper' (0.5_2.0)"
        ) from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {spec!r}: bounds must be positive with lower <= upper")
    return upper, lower


def parse_rs_thresholds(options: list[str], spec: float | str | None) -> list[tuple[float | None, float]]:
    """``(lower, upper)`` per ``rollout_rs`` option, from ``rollout_rs_threshold``: one entry
    shared by every option or one per option (comma-separated). A k1 option takes ``lower_upper``
    ratio bounds (a single number ``u`` means ``1/u`` to ``u``); k2 / k3 options take an upper bound."""
    if spec is None:
        raise ValueError("rollout_rs is set but rollout_rs_threshold is not; give one threshold per option")
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold {spec!r}: give one threshold for all {len(options)} rollout_rs options, or one each"
        )
    parts = parts * len(options) if len(parts) == 1 else parts
    out: list[tuple[float | None, float]] = []
    for option, part in zip(options, parts):
        try:
            if option.endswith("k1"):
                lower_text, _, upper_text = part.rpartition("_")
                upper = float(upper_text)
                lower = float(lower_text) if lower_text else 1.0 / upper
            else:
                if "_" in part:
                    raise ValueError
                upper, lower = float(part), None
        except (ValueError, ZeroDivisionError):
            form = "'lower_upper' or a number" if option.endswith("k1") else "one positive number"
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: expected {form}") from None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(
                f"rollout_rs_threshold {part!r} for {option}: bounds must be positive with lower <= upper"
            )
        out.append((lower, upper))
    return out


class RolloutCorrectionConfig(Section):
    """Correction of the mismatch between the log-probs the rollout engine sampled with and the
    trainer's (veRL 0.9's ``algorithm.rollout_correction``, same keys and defaults; see
    docs/algorithms.md). Unset (``null``) is off; a mapping, even empty, turns it on. The trainer
    then recomputes ``old_logprob`` before the update and, per token ``t``, takes
    ``r_t = exp(old_logprob_t - rollout_logprob_t)``: importance weights (``rollout_is``)
    multiply each token's policy loss, rejection (``rollout_rs``) drops tokens or whole
    sequences from the loss."""

    rollout_is: Literal["token", "sequence"] | None = F(
        "sequence",
        "Importance weights: `token` (`r_t`; TRL's `token_*` modes), `sequence` (the product of the "
        "row's `r_t`; TRL's `sequence_*`), or null (none: rejection and metrics only).",
    )
    rollout_is_threshold: float | str = F(
        2.0,
        "A number truncates the weights at it (TIS; TRL's `*_truncate` with `vllm_importance_sampling_cap`); "
        "`'lower_upper'` (e.g. `'0.5_2.0'`) zeroes weights outside the range (TRL's `*_mask`).",
    )
    rollout_is_batch_normalize: bool = F(
        False, "Divide the weights by their batch mean (per token, or per sequence), so they average 1."
    )
    rollout_rs: str | None = F(
        None,
        "Rejection sampling: comma-separated options dropping tokens or rows whose log-ratio statistic "
        "is out of bounds: `token_k1`, `token_k2`, `token_k3`, `seq_sum_k1..k3`, `seq_mean_k1..k3` "
        "(`seq_mean_k1` is veRL's geometric mean), `seq_max_k2`, `seq_max_k3`.",
    )
    rollout_rs_threshold: float | str | None = F(
        None,
        "Bounds of `rollout_rs`, one for all options or one per option (comma-separated): k1 options "
        "take ratio bounds `'lower_upper'` (a number `u` means `1/u` to `u`), k2/k3 an upper bound.",
    )
    bypass_mode: bool = F(
        False,
        "veRL's bypass mode: `old_logprob` is the rollout's (as `trainer.use_rollout_logprobs`), so the PPO "
        "ratio itself corrects against the rollout policy; weights are not applied and `rollout_rs` is refused.",
    )
    loss_type: Literal["ppo_clip"] = F(
        "ppo_clip",
        "Loss of bypass mode: `ppo_clip` (the configured policy loss); veRL's `reinforce` is not here.",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, hint in _LEGACY_ROLLOUT_IS.items():
                if key in data:
                    raise ValueError(f"{key} is veRL's older name; use {hint}")
        return data

    @field_validator("rollout_is", "rollout_rs", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("rollout_is_threshold")
    @classmethod
    def _is_threshold(cls, value: float | str) -> float | str:
        parse_is_threshold(value)
        return value

    @field_validator("rollout_rs")
    @classmethod
    def _rs_options(cls, value: str | None) -> str | None:
        if value is None:
            return None
        options = list(dict.fromkeys(o.strip() for o in value.split(",") if o.strip()))
        bad = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
        if bad or not options:
            raise ValueError(f"rollout_rs {value!r}: expected options among {', '.join(ROLLOUT_RS_OPTIONS)}")
        return ",".join(options)

    @model_validator(mode="after")
    def _thresholds(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None:
            if self.bypass_mode:
                raise ValueError(
                    "rollout_rs with bypass_mode: true is not implemented (veRL rejects per micro-batch against "
                    "the current policy); set bypass_mode: false to reject against the trainer's old log-probs"
                )
            parse_rs_thresholds(self.rs_options, self.rollout_rs_threshold)
        return self

    @property
    def rs_options(self) -> list[str]:
        """The ``rollout_rs`` options in order, without duplicates."""
        return self.rollout_rs.split(",") if self.rollout_rs else []


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
        "Use rollout logprobs as old logprobs instead of recomputing them: when set, it sets "
        "`trainer.use_rollout_logprobs` (Trinity-RFT 0.6's name), unless that is set too.",
    )
    rollout_correction: RolloutCorrectionConfig | None = F(
        None,
        "Rollout correction (veRL's keys): importance weights and rejection between the rollout's and "
        "the trainer's log-probs, in both back-ends; null is off, `{}` is veRL's defaults.",
    )

    @field_validator("loss_agg_mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value
