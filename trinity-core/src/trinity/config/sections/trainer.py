"""The ``trainer`` section: training backend, checkpointing and batching."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from trinity.config.sections.base import F, Section, lower_alias

TrainerType = Literal["auto", "verl", "native"]
SaveStrategy = Literal["single_thread", "single_process", "single_node", "unrestricted"]


class MegatronParallelConfig(Section):
    """Megatron-Core parallelism (veRL megatron strategy)."""

    tensor_model_parallel_size: int = F(1, "Tensor-parallel size.", ge=1)
    pipeline_model_parallel_size: int = F(1, "Pipeline-parallel size.", ge=1)
    virtual_pipeline_model_parallel_size: int | None = F(None, "Virtual pipeline-parallel size.", ge=1)
    expert_model_parallel_size: int = F(1, "Expert-parallel size.", ge=1)
    expert_tensor_parallel_size: int | None = F(None, "Expert tensor-parallel size.", ge=1)
    context_parallel_size: int = F(1, "Context-parallel size.", ge=1)
    sequence_parallel: bool = F(True, "Sequence parallelism.")


class TrainerConfig(Section):
    """The trainer: which backend, how often to save, micro-batching."""

    name: str = F("trainer", "Ray actor name of the trainer (unique).")
    trainer_type: TrainerType = F(
        "auto",
        "`verl` (veRL's FSDP workers: on GPUs, or on CPU with gloo where Ray has no GPU), `native` (plain "
        "torch, anywhere) or `auto` (verl when installed with a GPU, else native).",
    )
    trainer_strategy: Literal["fsdp", "fsdp2", "megatron"] = F("fsdp2", "veRL parallel strategy.")
    save_interval: int = F(0, "Save a checkpoint every this many steps; 0 saves only at the end.", ge=0)
    enable_preview: bool = F(
        True, "Log rollout previews to the monitor (wandb). Has no effect in this version."
    )
    total_steps: int | None = F(None, "Stop training after this many steps; unset: no limit.", ge=1)
    save_hf_checkpoint: Literal["always", "never", "last"] = F(
        "last", "Which checkpoints are also saved in Hugging Face format."
    )
    grad_clip: float = F(1.0, "Gradient-norm clipping of the actor.", gt=0)
    use_dynamic_bsz: bool = F(True, "Pack micro-batches by token count instead of row count.")
    use_remove_padding: bool = F(
        True, "Remove padding tokens before the forward pass (veRL; on CPU too, with SDPA attention)."
    )
    balance_batch: bool = F(True, "Balance tokens across data-parallel ranks.")
    critic_warmup: int = F(0, "Steps that train only the critic.", ge=0)
    max_token_len_per_gpu: int | None = F(
        None,
        "Token budget of a dynamic micro-batch; defaults to ceil(2 * max_model_len / ulysses size).",
        ge=1,
    )
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel size.", ge=1)
    fix_actor_microbatch_loss_scale: bool = F(
        False, "Scale micro-batch losses by token share (experimental). Has no effect in this version."
    )
    param_offload: bool = F(False, "Offload parameters to CPU (FSDP).")
    optimizer_offload: bool = F(False, "Offload optimizer state to CPU (FSDP).")
    grad_offload: bool = F(False, "Offload gradients to CPU (FSDP). Has no effect in this version.")
    offload_policy: bool = F(False, "FSDP2 CPU offload policy.")
    save_strategy: SaveStrategy = F(
        "unrestricted",
        "Which processes may save checkpoints at the same time. Has no effect in this version.",
    )
    max_checkpoints_to_keep: int | None = F(
        None, "Checkpoints kept; older ones are deleted. Unset or 0: all.", ge=0
    )
    max_actor_ckpt_to_keep: int | None = F(None, "Actor checkpoints kept (veRL); unset: all.", ge=0)
    max_critic_ckpt_to_keep: int | None = F(None, "Critic checkpoints kept (veRL); unset: all.", ge=0)
    megatron: MegatronParallelConfig = F(
        default_factory=MegatronParallelConfig, doc="Megatron parallelism. Has no effect in this version."
    )
    trainer_config: dict[str, Any] | None = F(
        None, "veRL configuration passed through unchanged (`actor_rollout_ref`, `critic`, `trainer`, ...)."
    )
    trainer_config_path: str = F("", "File holding the veRL configuration; exclusive with `trainer_config`.")
    ppo_micro_batch_size_per_gpu: int | None = F(
        None,
        "Rows per micro-batch when `use_dynamic_bsz` is off; unset: one micro-batch per GPU batch.",
        ge=1,
    )
    ppo_epochs: int = F(1, "Passes over each training batch (native trainer).", ge=1)
    gradient_checkpointing: bool = F(
        False, "Recompute activations in backward to save memory (native trainer)."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = F(
        "auto",
        "Training dtype (native trainer; veRL: its FSDP compute dtype); `auto`: bfloat16 on GPU, float32 on CPU.",
    )
    use_rollout_logprobs: bool = F(
        False, "Use the explorer's logprobs as old logprobs instead of recomputing them (native trainer)."
    )
    logprob_guard_threshold: float | None = F(
        0.1,
        "Warn once when `rollout/logprob_diff/mean` (mean |trainer - rollout| log-prob of the trained tokens) "
        "exceeds this, naming the likely cause (sampling settings or dtypes that differ between engine and "
        "trainer); null disables the check. See docs/algorithms.md.",
        ge=0,
    )
    logprob_guard_auto_correct: bool = F(
        False,
        "When the guard fires and `algorithm.rollout_correction` is off, switch it on (veRL's defaults) for "
        "the rest of the run.",
    )
    seed: int = F(42, "Seed of the trainer (native trainer).")
    share_prompt_forward: bool = F(
        True,
        "Run each distinct prompt of a micro-batch once and its responses on the prompt's "
        "key/value cache (native trainer): the same log-probs and gradients up to rounding, checked "
        "against a full pass the first time; fewer tokens when rows share prompts (GRPO groups).",
    )

    @field_validator(
        "trainer_type", "save_strategy", "trainer_strategy", "dtype", "save_hf_checkpoint", mode="before"
    )
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)
