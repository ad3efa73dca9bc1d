"""Our config → veRL's config (``trainer.trainer_type: verl``).

:func:`build_verl_config` translates the keys Trinity owns (model path, optimizer, batch sizes,
micro-batching, gradient clipping, epochs, checkpoint folder, GPU split, …) into veRL's layout
(``actor_rollout_ref``, ``critic``, ``trainer``, ``algorithm``, ``data``), then deep-merges
``trainer.trainer_config`` over it, so a key the user writes there always wins — the mapping of
Trinity-RFT's "Align configuration with veRL" guide.

Keys whose veRL default follows another key (``rollout.log_prob_*`` follows the actor's
micro-batching, the critic follows the actor's epochs, …) are filled *after* the merge from the
merged leading key unless the user set them, so overriding the leader in ``trainer_config``
moves its followers too, as veRL's own ``${oc.select:...}`` defaults do. Interpolations the user
writes in ``trainer_config`` are kept as written; they resolve against veRL's full defaults.

Pure Python: nothing here imports veRL or torch. The result is a plain nested ``dict``;
:func:`trinity.trainer.verl.trainer.full_verl_config` lays it over veRL's own defaults.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from trinity.config.algorithm_defaults import deep_merge
from trinity.config.errors import ConfigError

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.trainer.components import AlgorithmComponents

# Trinity advantage names whose veRL estimator has another name (for the informational
# ``algorithm.adv_estimator`` key; our AdvantageFn computes the advantage either way).
_ADV_ESTIMATOR = {"ppo": "gae"}

# Trinity optimizer_type → veRL ``optim.optimizer`` (a ``torch.optim`` class name).
_OPTIMIZER = {"adam": "AdamW", "adamw": "AdamW", "sgd": "SGD"}


def explorer_gpu_count(config: Config) -> int:
    """GPUs taken by the rollout engines and the auxiliary models (0 when no explorer runs)."""
    if config.mode not in ("both",):
        # `train` runs no explorer in this job; `explore`/`bench` run no trainer at all.
        return 0
    rm = config.explorer.rollout_model
    total = rm.engine_num * _gpus_per_engine(rm)
    for aux in config.explorer.auxiliary_models:
        total += aux.engine_num * _gpus_per_engine(aux)
    return total


def _gpus_per_engine(model: Any) -> int:
    # Resolved configs carry gpu_per_engine; compute it for unresolved ones too.
    return model.gpu_per_engine or (
        model.tensor_parallel_size * model.data_parallel_size * model.pipeline_parallel_size
    )


def trainer_gpu_split(
    config: Config, node_num: int | None = None, gpu_per_node: int | None = None
) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` of the trainer: every GPU the explorer does not take.

    Trainer GPUs = ``node_num * gpu_per_node`` − rollout ``engine_num * tensor_parallel_size``
    − the auxiliary models' GPUs (Trinity-RFT's rule). ``node_num`` / ``gpu_per_node`` default to
    ``cluster.*``; a 0 there means "what Ray reports", which the caller must then pass in.
    """
    nodes = node_num if node_num is not None else config.cluster.node_num
    per_node = gpu_per_node if gpu_per_node is not None else config.cluster.gpu_per_node
    if nodes <= 0 or per_node <= 0:
        raise ConfigError(
            "the veRL trainer needs the cluster size; set cluster.node_num and cluster.gpu_per_node "
            f"(got {nodes} and {per_node})",
            key="cluster.gpu_per_node",
        )
    explorer = explorer_gpu_count(config)
    trainer = nodes * per_node - explorer
    if trainer <= 0:
        raise ConfigError(
            f"no GPU is left for the trainer: the cluster has {nodes} x {per_node} GPUs and the explorer takes "
            f"{explorer} (rollout engine_num x tensor_parallel_size plus auxiliary models); lower "
            "explorer.rollout_model.engine_num or add GPUs",
            key="cluster.gpu_per_node",
        )
    if trainer < per_node:
        return 1, trainer
    if trainer % per_node:
        raise ConfigError(
            f"the trainer would get {trainer} GPUs, which spans nodes of {per_node} GPUs unevenly; the explorer's "
            f"{explorer} GPUs must leave the trainer whole nodes (or less than one node)",
            key="explorer.rollout_model.engine_num",
        )
    return trainer // per_node, per_node


#: Attention implementations transformers runs without a GPU (``flash_attention_*`` need CUDA).
CPU_ATTENTION = ("sdpa", "eager")

#: veRL keys this back-end sets differently when veRL's workers run on CPU (gloo), and why. A key the
#: user writes in ``trainer.trainer_config`` still wins; impossible values are refused
#: (:func:`check_cpu_config`).
CPU_SETTINGS: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.model.override_config.attn_implementation": (
        "sdpa",
        "veRL loads models with flash_attention_2, which needs a CUDA GPU; torch's SDPA runs on CPU and, "
        "with use_remove_padding, reads the packed sequences' boundaries from their position ids",
    ),
    "critic.model.override_config.attn_implementation": ("sdpa", "as the actor's"),
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": (
        False,
        "veRL compiles its entropy function with torch.compile; on CPU inductor builds C++ for it in every "
        "worker (tens of seconds, again for each new shape) to speed up an element-wise function",
    ),
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": (False, "as the actor's"),
    "critic.fsdp.use_torch_compile": (False, "as the actor's"),
}

_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def cpu_trainer_split(config: Config) -> tuple[int, int]:
    """``(nnodes, ranks_per_node)`` of the trainer when veRL's workers run on CPU.

    Without GPUs there is no split to derive: each rank is one gloo process on one CPU bundle. The
    count is veRL's own ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` from
    ``trainer.trainer_config`` (on CPU: ranks per node), 1 x 1 unless set there.
    """
    section = (config.trainer.trainer_config or {}).get("trainer") or {}
    out = []
    for key in ("nnodes", "n_gpus_per_node"):
        value = section.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"must be a positive integer (veRL ranks; on CPU each is one gloo process), got {value!r}",
                key=f"trainer.trainer_config.trainer.{key}",
            )
        out.append(value)
    return out[0], out[1]


def cpu_settings_summary(merged: dict[str, Any]) -> str:
    """``path=value`` of each :data:`CPU_SETTINGS` key in the merged config (for the trainer's log)."""
    return ", ".join(f"{path}={_get(merged, path)}" for path in CPU_SETTINGS)


def check_cpu_config(merged: dict[str, Any]) -> None:
    """Refuse, in one line naming the key, a veRL setting that cannot run on CPU."""
    device = _get(merged, "trainer.device")
    if device != "cpu":
        raise ConfigError(
            f"is {device!r}, but Ray reports no GPU, so the veRL trainer runs on CPU; remove the key",
            key="trainer.trainer_config.trainer.device",
        )
    for key in ("actor_rollout_ref.model", "critic.model"):
        attn = _get(merged, f"{key}.override_config.attn_implementation")
        if attn is not _MISSING and attn not in CPU_ATTENTION:
            raise ConfigError(
                f"attn_implementation {attn!r} needs a CUDA GPU and the veRL trainer runs on CPU here (Ray "
                f"reports no GPU); use one of {', '.join(CPU_ATTENTION)}",
                key=f"trainer.trainer_config.{key}.override_config.attn_implementation",
            )


def _mini_batch(config: Config) -> tuple[int, int]:
    """``(ppo_mini_batch_size, rollout.n)`` with veRL's meaning (mini-batch rows = their product).

    ``buffer.batch_size`` = ``ppo_mini_batch_size`` and ``train_batch_size`` =
    ``ppo_mini_batch_size * rollout.n``: one optimizer step per training batch and epoch.
    """
    geometry = config.geometry
    rows, n = geometry.experiences_per_train_step, geometry.repeat_times
    if rows % n:
        return rows, 1
    return rows // n, n


def _grad_clip(config: Config) -> float:
    opt = config.algorithm.optimizer
    # Same rule as the native trainer: an explicitly set optimizer.clip_grad wins.
    return opt.clip_grad if "clip_grad" in opt.model_fields_set else config.trainer.grad_clip


def _optim(config: Config) -> dict[str, Any]:
    opt = config.algorithm.optimizer
    optimizer = _OPTIMIZER.get(opt.optimizer_type.lower())
    if optimizer is None:
        raise ConfigError(
            f"{opt.optimizer_type!r} is not supported by the veRL trainer; use 'adam' or 'sgd'",
            key="algorithm.optimizer.optimizer_type",
        )
    return {
        "optimizer": optimizer,
        "lr": opt.lr,
        "lr_warmup_steps": opt.lr_warmup_steps,
        "lr_warmup_steps_ratio": opt.lr_warmup_steps_ratio,
        "min_lr_ratio": opt.min_lr_ratio,
        "lr_scheduler_type": opt.warmup_style or opt.lr_scheduler_type,
        "weight_decay": opt.weight_decay,
        "betas": list(opt.betas),
        "clip_grad": _grad_clip(config),
    }


def _fsdp(config: Config) -> dict[str, Any]:
    t = config.trainer
    return {
        "param_offload": t.param_offload,
        "optimizer_offload": t.optimizer_offload,
        "offload_policy": t.offload_policy,
    }


def _arg(config: Config, key: str, arg: str, default: Any) -> Any:
    return (getattr(config.algorithm, f"{key}_args") or {}).get(arg, default)


def _actor_rollout_ref(config: Config, n_gpus: int, comps: AlgorithmComponents) -> dict[str, Any]:
    t, m, algo = config.trainer, config.model, config.algorithm
    mini, n = _mini_batch(config)
    # Unset: one micro-batch per GPU and mini-batch, like the native trainer's "whole batch".
    micro = t.ppo_micro_batch_size_per_gpu or max(1, math.ceil(mini * n / n_gpus))
    model: dict[str, Any] = {
        "path": m.model_path,
        "trust_remote_code": m.trust_remote_code,
        "use_remove_padding": t.use_remove_padding,
    }
    if m.custom_chat_template:
        model["custom_chat_template"] = m.custom_chat_template
    if "gradient_checkpointing" in t.model_fields_set:
        model["enable_gradient_checkpointing"] = t.gradient_checkpointing
    if m.lora_configs:
        lora = m.lora_configs[0]
        model.update(lora_rank=lora.lora_rank, lora_alpha=lora.lora_alpha, target_modules=lora.target_modules)
    kl_on = comps.uses_kl_loss
    entropy_on = comps.uses_entropy_bonus
    actor = {
        "strategy": t.trainer_strategy,
        "ppo_mini_batch_size": mini,
        "ppo_micro_batch_size_per_gpu": micro,
        "use_dynamic_bsz": t.use_dynamic_bsz,
        "ppo_max_token_len_per_gpu": t.max_token_len_per_gpu,
        "grad_clip": _grad_clip(config),
        "ppo_epochs": t.ppo_epochs,
        "shuffle": False,
        "ulysses_sequence_parallel_size": t.ulysses_sequence_parallel_size,
        "loss_agg_mode": algo.loss_agg_mode or "token-mean",
        # Informational: our policy loss (not veRL's) reads the algorithm section; these keys let a
        # veRL user read the job in familiar terms, as Trinity-RFT does.
        "use_kl_loss": kl_on,
        "kl_loss_coef": _arg(config, "kl_loss_fn", "kl_coef", 0.0) if kl_on else 0.0,
        "entropy_coeff": _arg(config, "entropy_loss_fn", "entropy_coef", 0.0) if entropy_on else 0.0,
        "optim": _optim(config),
        "fsdp_config": _fsdp(config),
        "checkpoint": {"save_contents": _save_contents(config)},
    }
    if kl_on:
        actor["kl_loss_type"] = algo.kl_loss_fn
    rm = config.explorer.rollout_model
    rollout = {
        "n": n,
        # Log-probs are computed at the sampling temperature; veRL reads it from here.
        "temperature": m.temperature,
        # Rollout happens in our explorer; these describe it for readers of the veRL config.
        "name": "vllm",
        "tensor_model_parallel_size": rm.tensor_parallel_size,
        "gpu_memory_utilization": rm.gpu_memory_utilization,
    }
    return {"model": model, "actor": actor, "rollout": rollout, "ref": {}}


def _save_contents(config: Config) -> list[str]:
    contents = ["model", "optimizer", "extra"]
    # The explorer reloads Hugging Face weights from disk with checkpoint sync.
    if config.trainer.save_hf_checkpoint != "never" or config.synchronizer.sync_method == "checkpoint":
        contents.append("hf_model")
    return contents


def _critic(config: Config) -> dict[str, Any]:
    t, m = config.trainer, config.model
    return {
        "strategy": t.trainer_strategy,
        "model": {
            "path": m.critic_model_path or m.model_path,
            "trust_remote_code": m.trust_remote_code,
            "use_remove_padding": t.use_remove_padding,
        },
        # The native trainer trains the critic with the actor's optimizer settings; so does this one.
        "optim": _optim(config),
        "fsdp": _fsdp(config),
        "grad_clip": t.grad_clip,
        "ulysses_sequence_parallel_size": t.ulysses_sequence_parallel_size,
        "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
    }


_ACTOR = "actor_rollout_ref.actor"

# (follower, leader, transform): after the merge, a follower the user did not set takes the merged
# leader's value. The same links as veRL's own defaults, so overriding a leader moves them.
FOLLOWERS: tuple[tuple[str, str, Any], ...] = (
    *(
        (f"actor_rollout_ref.{role}.log_prob_{name}", f"{_ACTOR}.{leader}", None)
        for role in ("rollout", "ref")
        for name, leader in (
            ("micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"),
            ("use_dynamic_bsz", "use_dynamic_bsz"),
            ("max_token_len_per_gpu", "ppo_max_token_len_per_gpu"),
        )
    ),
    ("critic.ppo_micro_batch_size_per_gpu", f"{_ACTOR}.ppo_micro_batch_size_per_gpu", None),
    ("critic.use_dynamic_bsz", f"{_ACTOR}.use_dynamic_bsz", None),
    # veRL's rule: a value head's token budget is twice the actor's.
    ("critic.ppo_max_token_len_per_gpu", f"{_ACTOR}.ppo_max_token_len_per_gpu", lambda v: v * 2),
    ("critic.ppo_epochs", f"{_ACTOR}.ppo_epochs", None),
    ("critic.ppo_mini_batch_size", f"{_ACTOR}.ppo_mini_batch_size", None),
    ("critic.loss_agg_mode", f"{_ACTOR}.loss_agg_mode", None),
    ("actor_rollout_ref.actor.optim.total_training_steps", "trainer.total_training_steps", None),
    ("critic.optim.total_training_steps", "trainer.total_training_steps", None),
)


def _get(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


_MISSING = object()


def _fill_followers(merged: dict[str, Any], user: dict[str, Any]) -> None:
    for follower, leader, transform in FOLLOWERS:
        if _get(user, follower) is not _MISSING:
            continue
        value = _get(merged, leader)
        if value is _MISSING or value is None:
            continue
        _set(merged, follower, transform(value) if transform and isinstance(value, int) else value)


# Trinity-RFT (and veRL < 0.6) kept the critic's FSDP settings under critic.model.fsdp_config;
# veRL 0.9 reads critic.fsdp and rejects the old key. Old YAML keeps working.
LEGACY_MOVES: tuple[tuple[str, str], ...] = (("critic.model.fsdp_config", "critic.fsdp"),)


def _move_legacy(user: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(user)  # the config object stays as the user wrote it
    for old, new in LEGACY_MOVES:
        *parents, last = old.split(".")
        holder = _get(out, ".".join(parents))
        if not isinstance(holder, dict) or last not in holder:
            continue
        value = holder.pop(last)
        current = _get(out, new)
        _set(out, new, deep_merge(value, current) if isinstance(current, dict) else value)
    return out


def total_training_steps(config: Config) -> int | None:
    """The number of training steps when the config fixes it (for warm-up ratios and cosine)."""
    return config.trainer.total_steps or getattr(config.buffer, "total_steps", None) or None


def build_verl_config(
    config: Config, *, node_num: int | None = None, gpu_per_node: int | None = None, device: str = "cuda"
) -> dict[str, Any]:
    """veRL's configuration for ``config`` (a resolved :class:`~trinity.config.Config`).

    Returns a plain nested ``dict`` with veRL's section names; ``trainer.trainer_config`` has been
    deep-merged over the translated keys (user keys win), then the :data:`FOLLOWERS` filled.
    ``node_num`` / ``gpu_per_node`` override ``cluster.*`` (the launcher passes what Ray reports
    when those are 0). ``device="cpu"``: veRL's workers run on CPU with gloo; the ranks come from
    :func:`cpu_trainer_split` and the :data:`CPU_SETTINGS` apply. Raises
    :class:`~trinity.config.errors.ConfigError` naming the key at fault.
    """
    from trinity.trainer.components import AlgorithmComponents

    if device == "cpu":
        nnodes, n_gpus_per_node = cpu_trainer_split(config)
    else:
        nnodes, n_gpus_per_node = trainer_gpu_split(config, node_num, gpu_per_node)
    steps = total_training_steps(config)
    t, m, algo = config.trainer, config.model, config.algorithm
    # The back-ends' own reading of the algorithm, so the informational keys say what runs.
    comps = AlgorithmComponents.from_config(algo)
    translated: dict[str, Any] = {
        "actor_rollout_ref": _actor_rollout_ref(config, nnodes * n_gpus_per_node, comps),
        "critic": {"enable": bool(comps.algorithm_type.use_critic), **_critic(config)},
        "data": {
            "max_prompt_length": m.max_prompt_tokens,
            "max_response_length": m.max_response_tokens,
        },
        "algorithm": {
            "adv_estimator": _ADV_ESTIMATOR.get(algo.advantage_fn, algo.advantage_fn),
            "use_kl_in_reward": comps.uses_kl_penalty,
        },
        "trainer": {
            "nnodes": nnodes,
            "n_gpus_per_node": n_gpus_per_node,
            "device": device,
            "project_name": config.project,
            "experiment_name": config.name,
            "default_local_dir": config.checkpoint_job_dir or config.job_dir,
            "total_training_steps": steps,
            "save_freq": t.save_interval or -1,
            "critic_warmup": t.critic_warmup,
            "balance_batch": t.balance_batch,
            "resume_mode": "auto" if config.continue_from_checkpoint else "disable",
            "max_actor_ckpt_to_keep": t.max_actor_ckpt_to_keep or t.max_checkpoints_to_keep,
            "max_critic_ckpt_to_keep": t.max_critic_ckpt_to_keep or t.max_checkpoints_to_keep,
            # Metrics go through Trinity's monitors; validation runs in the explorer.
            "logger": ["console"],
            "val_before_train": False,
        },
    }
    param_dtype = _param_dtype(config, device)
    if param_dtype:
        for path in (f"{_ACTOR}.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
            _set(translated, f"{path}.mixed_precision.param_dtype", param_dtype)
    if device == "cpu":
        for path, (value, _why) in CPU_SETTINGS.items():
            _set(translated, path, value)
    user = _move_legacy(t.trainer_config or {})
    merged = deep_merge(translated, user)
    _fill_followers(merged, user)
    if device == "cpu":
        check_cpu_config(merged)
    return merged


def _param_dtype(config: Config, device: str) -> str | None:
    """veRL's FSDP compute dtype from ``trainer.dtype``; ``None`` leaves veRL's default (bf16).

    ``auto`` follows the native trainer: bfloat16 on GPU, float32 on CPU (bf16 matmuls are slow
    on most CPUs and would make the CPU run differ from the native trainer's numerics).
    """
    dtype = config.trainer.dtype
    if dtype == "auto":
        return "fp32" if device == "cpu" else None
    return _DTYPES[dtype]


__all__ = [
    "CPU_ATTENTION",
    "CPU_SETTINGS",
    "build_verl_config",
    "check_cpu_config",
    "cpu_settings_summary",
    "cpu_trainer_split",
    "explorer_gpu_count",
    "total_training_steps",
    "trainer_gpu_split",
]
