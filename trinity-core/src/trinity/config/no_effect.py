"""Config keys that are accepted but have no effect in this version, and the warning about them.

A Trinity-RFT YAML loads here unchanged, so some keys are accepted that nothing in this version
acts on. Every such key is on :data:`NO_EFFECT`, the one explicit list, with a one-line reason;
:func:`warn_no_effect` (called by ``load_config``) logs one warning line per such key the user
actually set (``model_fields_set``) to a value that would behave differently from this version
(by default: any value other than the key's default), once per process per key.

Patterns are dotted key paths. ``[*]`` stands for any list index or mapping key
(``explorer.auxiliary_models[*].repetition_penalty``), a leading ``**.`` for any path
(``**.format.tools_key``); stage overrides (``stages[0].explorer.over_rollout``) match the
pattern without the ``stages[*].`` prefix. A pattern naming a section covers every key in it.

Implementing a key means taking its entry off this list (and its "has no effect" from the
field's description); ``tests/config/test_no_effect.py`` fails for any config field that is
neither read by the runtime nor listed here, so a new key cannot silently do nothing either.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from trinity.config.models import Config

logger = logging.getLogger("trinity.config")


def _differs(value: Any, default: Any, root: Any) -> bool:
    dump = lambda v: v.model_dump() if isinstance(v, BaseModel) else v  # noqa: E731
    return dump(value) != dump(default)


def _enabled(value: Any, default: Any, root: Any) -> bool:
    return bool(getattr(value, "enable", False))


def _false(value: Any, default: Any, root: Any) -> bool:
    return value is False


@dataclass(frozen=True)
class NoEffect:
    """One key (or section) accepted for compatibility that this version does not act on.

    ``active(value, default, root)`` tells whether the value set would make a difference
    upstream (default: it differs from the key's default), so only those are warned about.
    """

    key: str
    reason: str
    active: Callable[[Any, Any, Any], bool] = _differs


def _same_buffer(a: Any, b: Any) -> bool:
    """Whether experience buffer configs ``a`` and ``b`` name the same storage."""
    if a is None or b is None:
        return a is b
    return (a.name, a.storage_type, a.path) == (b.name, b.storage_type, b.path)


def _runs_data_juicer(root: Any) -> bool:
    """Whether a pipeline of ``root`` (a config or stage) has a ``data_juicer`` operator."""
    dp = getattr(root, "data_processor", None)
    if dp is None:
        return False
    tp, ep = dp.task_pipeline, dp.experience_pipeline
    ops = [*(tp.operators if tp else []), *(ep.operators if ep else [])]
    return bool(tp and tp.config_path) or any(op.name == "data_juicer" for op in ops)


def _inference(field: str, reason: str, active: Callable[[Any, Any, Any], bool] = _differs) -> list[NoEffect]:
    """The same key of the rollout model and of every auxiliary model."""
    return [
        NoEffect(f"explorer.rollout_model.{field}", reason, active),
        NoEffect(f"explorer.auxiliary_models[*].{field}", reason, active),
    ]


def _tasksets(field: str, reason: str) -> list[NoEffect]:
    """The same key of every taskset (training, eval, and the single-taskset alias)."""
    return [
        NoEffect(f"buffer.explorer_input.{group}.{field}", reason)
        for group in ("tasksets[*]", "eval_tasksets[*]", "taskset")
    ]


_BUILTIN_SELECTORS = ("sequential", "shuffle", "random")


# Sections whose selector gets only selector_type and seed: eval tasksets are read in file order,
# and SFT/DPO datasets (trainer_input) build their selector without feature keys or arguments.
_SELECTOR_ARGS_UNREAD = ("eval_tasksets", "trainer_input")


def _selector_sections(value: Any, unread: bool = False) -> Iterator[tuple[Any, bool]]:
    """Every ``data_selector`` / ``task_selector`` section under ``value``, and whether it lies
    where feature keys and arguments are never read (:data:`_SELECTOR_ARGS_UNREAD`)."""
    if isinstance(value, BaseModel):
        if "selector_type" in type(value).model_fields:
            yield value, unread
            return
        unread = unread or getattr(value, "is_eval", False) is True
        for name in type(value).model_fields:
            yield from _selector_sections(getattr(value, name), unread or name in _SELECTOR_ARGS_UNREAD)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _selector_sections(item, unread)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _selector_sections(item, unread)


def _ignored_by_selector(field: str) -> Callable[[Any, Any, Any], bool]:
    """Active when the section holding ``value`` names a built-in selector (they read neither
    feature keys nor arguments) or lies where they are never read; plugin selectors of training
    tasksets read both."""

    def active(value: Any, default: Any, root: Any) -> bool:
        if not _differs(value, default, root):
            return False
        for section, unread in _selector_sections(root):
            if getattr(section, field) is value:
                return unread or section.selector_type in _BUILTIN_SELECTORS
        return False

    return active


_NO_AUX_LORA = "auxiliary models serve no LoRA adapters (only the trained rollout model has one)"
_LORA_ON_VLLM = (
    "vLLM's LoRA engine arguments: read only with model.lora_configs and a vllm rollout engine "
    "(the transformers engine folds the adapter into its weights)"
)


def _may_run_vllm(root: Any) -> bool:
    """Whether the rollout engine may be vLLM (``auto`` is vLLM where it finds a GPU)."""
    engine = getattr(getattr(getattr(root, "explorer", None), "rollout_model", None), "engine_type", None)
    return engine in ("vllm", "vllm_async", "auto")


def _not_lora_on_vllm(value: Any, default: Any, root: Any) -> bool:
    """Active when set, but vLLM serves no adapter in this job (no LoRA, or another engine)."""
    model = getattr(root, "model", None)
    return _differs(value, default, root) and not (
        getattr(model, "lora_configs", None) and _may_run_vllm(root)
    )


def _not_from_lora_configs(value: Any, default: Any, root: Any) -> bool:
    """``enable_lora`` set otherwise than ``model.lora_configs`` sets it."""
    return bool(value) != bool(getattr(getattr(root, "model", None), "lora_configs", None))


_NO_ROLLING_SYNC = "serve mode serves one engine, whose weights are swapped between batches"
_NO_HISTORY_DB = (
    "serve mode keeps calls awaiting feedback in memory; committed ones go to the experience buffer"
)
_SELECTORS = (
    "the built-in selectors (sequential, shuffle, random) take no feature keys or arguments, eval "
    "tasksets are read in file order, and SFT/DPO datasets give their selector only a seed"
)
_TASKSET_SQL = "tasksets are read from files; SQL retries apply to `sql` experience buffers"

NO_EFFECT: tuple[NoEffect, ...] = (
    NoEffect("ignore_validator_suggestions", "this version makes no validator suggestions"),
    # algorithm
    NoEffect("algorithm.enable_router_replay", "MoE router replay is not implemented"),
    NoEffect(
        "algorithm.bypass_old_logprobs",
        "`trainer.use_rollout_logprobs`, set too, decides the old logprobs",
        lambda value, default, root: value != root.trainer.use_rollout_logprobs,
    ),
    # model
    NoEffect("model.chat_template_path", "not read; put the template in `model.custom_chat_template`"),
    NoEffect("model.repetition_penalty", "the rollout engines apply no repetition penalty"),
    NoEffect("model.rope_scaling", "not passed to the model config"),
    NoEffect("model.rope_theta", "not passed to the model config"),
    NoEffect("model.fully_sharded_loras", _LORA_ON_VLLM, _not_lora_on_vllm),
    NoEffect("model.max_cpu_loras", _LORA_ON_VLLM, _not_lora_on_vllm),
    NoEffect(
        "model.lora_configs[*].base_model_name",
        "vLLM serves the trained adapter under a name of its own; requests name the base model",
    ),
    NoEffect(
        "model.lora_configs[*].lora_dtype", "the adapter trains in float32 under the trainer's autocast"
    ),
    NoEffect("model.lora_configs[*].is_dummy", "set automatically upstream; not read"),
    NoEffect("model.tinker", "training through Tinker is not implemented", _enabled),
    NoEffect("model.external_model", "an external API as rollout model is not implemented", _enabled),
    # buffer
    NoEffect("**.data_selector.feature_keys", _SELECTORS, _ignored_by_selector("feature_keys")),
    NoEffect("**.data_selector.kwargs", _SELECTORS, _ignored_by_selector("kwargs")),
    NoEffect("**.task_selector.feature_keys", _SELECTORS, _ignored_by_selector("feature_keys")),
    NoEffect("**.task_selector.kwargs", _SELECTORS, _ignored_by_selector("kwargs")),
    *_tasksets("max_retry_times", _TASKSET_SQL),
    *_tasksets("max_retry_interval", _TASKSET_SQL),
    NoEffect(
        "buffer.explorer_input.eval_tasksets[*].enable_progress_bar",
        "only the training tasksets' and the experience buffer's flags choose the console progress bar",
    ),
    NoEffect(
        "buffer.trainer_input.auxiliary_buffers[*].enable_progress_bar",
        "only the training tasksets' and the experience buffer's flags choose the console progress bar",
    ),
    # explorer
    NoEffect("explorer.runner_prepare_concurrency", "runner preparation is not throttled"),
    NoEffect("explorer.runner_prepare_max_retries", "runner preparation is not retried"),
    NoEffect("explorer.concurrent_mode", "how a runner runs a task's repeats is not configurable"),
    NoEffect("explorer.max_repeat_times_per_runner", "a task's repeats are not split over runners"),
    NoEffect("explorer.runner_num", "deprecated upstream and not read here; use `explorer.runner_per_model`"),
    *_inference("enable_expert_parallel", "expert parallelism is not passed to vLLM"),
    *_inference("use_v1", "the engine version is vLLM's own choice", _false),
    *_inference("repetition_penalty", "the rollout engines apply no repetition penalty"),
    *_inference("ignore_eos", "generation always stops at EOS"),
    *_inference("enable_multimodal", "multi-modal prompts are not supported"),
    *_inference("external_model_config", "an external API as rollout model is not implemented", _enabled),
    *_inference("weight_sync_buffer_size", "NCCL weight sync sends one tensor at a time"),
    *_inference("enable_return_routed_experts", "MoE routing is not returned with rollouts"),
    NoEffect(
        "explorer.rollout_model.enable_lora",
        "set from model.lora_configs: the rollout engine serves the trained adapter exactly when it has one",
        _not_from_lora_configs,
    ),
    NoEffect("explorer.rollout_model.lora_kwargs", _LORA_ON_VLLM, _not_lora_on_vllm),
    NoEffect("explorer.auxiliary_models[*].enable_lora", _NO_AUX_LORA),
    NoEffect("explorer.auxiliary_models[*].lora_kwargs", _NO_AUX_LORA),
    *_inference("rope_scaling", "not passed to the engines"),
    *_inference("rope_theta", "not passed to the engines"),
    NoEffect("explorer.min_running_model_num", _NO_ROLLING_SYNC),
    NoEffect("explorer.db_url", _NO_HISTORY_DB),
    NoEffect("explorer.runner_state_report_interval", "runner state reports are not implemented"),
    NoEffect("explorer.max_inflight_batches", "the explorer runs one explore step at a time"),
    # trainer
    NoEffect(
        "trainer.share_prompt_forward",
        "the veRL trainer runs its own forward passes; only the native trainer shares prompt passes",
        lambda value, default, root: (
            value != default and getattr(getattr(root, "trainer", None), "trainer_type", None) == "verl"
        ),
    ),
    NoEffect("trainer.enable_preview", "rollout previews are not logged"),
    NoEffect("trainer.fix_actor_microbatch_loss_scale", "not implemented"),
    NoEffect("trainer.grad_offload", "gradient offload is not passed to veRL"),
    NoEffect("trainer.save_strategy", "checkpoint saving is not coordinated across processes"),
    NoEffect("trainer.megatron", "the Megatron strategy is not wired to veRL"),
    # monitor, synchronizer, service, data_processor
    NoEffect("monitor.detailed_stats", "std/max/min of evaluation metrics are not logged"),
    NoEffect(
        "synchronizer.trainer_sync_interval",
        "only the `trainer_driven` and `fully_async` styles and `train`-mode jobs publish on the "
        "trainer's own interval",
        lambda value, default, root: (
            bool(value)
            and value != root.synchronizer.sync_interval
            and not (
                root.mode == "train"
                or (
                    root.mode in ("both", "colocate")
                    and root.synchronizer.sync_style in ("trainer_driven", "fully_async", "dynamic")
                )
            )
        ),
    ),
    NoEffect("synchronizer.wait_for_checkpoint", "not implemented"),
    NoEffect("synchronizer.explorer_world_size", "derived for Trinity-RFT compatibility; not read"),
    NoEffect("log.save_dir", "derived: actor logs always go to `<job_dir>/log`"),
    NoEffect(
        "service.data_juicer",
        "no data_juicer operator runs (neither pipeline has one)",
        lambda value, default, root: value is not None and not _runs_data_juicer(root),
    ),
    NoEffect(
        "data_processor.experience_pipeline.inputs[*]",
        "the pipeline reads only the explorer's experiences (Trinity-RFT reads no extra input buffer either)",
    ),
    NoEffect(
        "data_processor.experience_pipeline.output",
        "the pipeline writes to buffer.trainer_input.experience_buffer, the buffer the trainer reads "
        "(as Trinity-RFT does)",
        lambda value, default, root: not _same_buffer(value, root.buffer.trainer_input.experience_buffer),
    ),
)

_INDEX = re.compile(r"\[[^\]]*\]")
_STAGE = re.compile(r"^stages\[[^\]]*\]\.")


def normalise(path: str) -> str:
    """``path`` with indices and mapping keys as ``[*]`` and any stage prefix dropped."""
    return _INDEX.sub("[*]", _STAGE.sub("", path))


def entry_for(path: str) -> NoEffect | None:
    """The entry covering ``path`` itself (not an ancestor), or ``None``."""
    norm = normalise(path)
    for entry in NO_EFFECT:
        if entry.key.startswith("**."):
            tail = entry.key[3:]
            if norm == tail or norm.endswith("." + tail):
                return entry
        elif norm == entry.key:
            return entry
    return None


def covered(path: str) -> NoEffect | None:
    """The entry covering ``path`` or one of the sections above it, or ``None``."""
    parts = normalise(path).split(".")
    for end in range(len(parts), 0, -1):
        entry = entry_for(".".join(parts[:end]))
        if entry is not None:
            return entry
    return None


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, BaseModel):
        yield value, path
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _children(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _children(item, f"{path}[{key}]")


def _walk(model: BaseModel, path: str, root: Any) -> Iterator[tuple[str, str]]:
    fields = type(model).model_fields
    for name in [n for n in fields if n in model.model_fields_set]:
        value = getattr(model, name)
        key = f"{path}.{name}" if path else name
        entry = entry_for(key)
        if entry is not None:
            default = fields[name].get_default(call_default_factory=True)
            if value is not None and entry.active(value, default, root):
                yield key, entry.reason
            continue
        for child, child_path in _children(value, key):
            item = entry_for(child_path)  # an entry for the items themselves (`inputs[*]`)
            if item is not None:
                if item.active(child, None, root):
                    yield child_path, item.reason
                continue
            yield from _walk(child, child_path, root)


def find_no_effect(config: Config) -> list[tuple[str, str]]:
    """``(key, reason)`` of every no-effect key set in ``config`` by the user (in file order
    of the models' fields), where the value set would make a difference upstream."""
    return list(_walk(config, "", config))


_warned: set[str] = set()


def warn_no_effect(config: Config) -> list[str]:
    """Log one warning (logger ``trinity.config``) per no-effect key set in ``config``,
    once per process per key; returns the lines logged now."""
    lines = []
    for key, reason in find_no_effect(config):
        if key in _warned:
            continue
        _warned.add(key)
        line = f"config key {key} has no effect in this version: {reason}"
        logger.warning(line)
        lines.append(line)
    return lines


__all__ = ["NO_EFFECT", "NoEffect", "covered", "entry_for", "find_no_effect", "normalise", "warn_no_effect"]
