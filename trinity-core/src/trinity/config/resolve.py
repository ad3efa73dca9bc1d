"""``resolve_config``: the one place where derived values are filled in and cross-key rules checked.

Everything a user may leave unset and that follows from other keys is computed here, so that the
rest of Trinity reads a complete config and ``trinity run --dry-run`` shows exactly what will run.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
from typing import Any

from trinity.config.algorithm_defaults import (
    check_arg_names,
    check_init_args,
    deep_merge,
    lookup_component,
    resolve_algorithm,
)
from trinity.config.checks import (
    check_colocate,
    check_data_processor,
    check_mode_inputs,
    check_optimizer,
    check_sync,
    check_task_component,
)
from trinity.config.errors import ConfigError
from trinity.config.geometry import batch_geometry
from trinity.config.limits import derive_token_limits
from trinity.config.models import Config
from trinity.config.sections.buffer import ExperienceBufferConfig, ReplayBufferConfig, TasksetConfig
from trinity.config.sections.explorer import MAX_PORT, InferenceModelConfig
from trinity.config.validation import validate_config
from trinity.config.vllm_lora import vllm_lora_kwargs
from trinity.config.yaml_io import load_yaml_dict

CHECKPOINT_ROOT_ENV = "TRINITY_CHECKPOINT_ROOT_DIR"

logger = logging.getLogger(__name__)


def resolve_config(config: Config) -> Config:
    """A copy of ``config`` with every derived value filled in; raises :class:`ConfigError`.

    Idempotent: resolving a resolved config changes nothing.
    """
    source = config._source if config._source is not None else config.model_dump(exclude_unset=True)
    c = config.model_copy(deep=True)
    c._source = source
    try:
        _resolve(c)
    except ConfigError as exc:
        raise exc.with_file(config._file) from None
    return c


def _resolve(c: Config) -> None:
    _resolve_paths(c)
    _resolve_model(c)
    c.algorithm, algo_cls = resolve_algorithm(c.algorithm)
    check_optimizer(c)
    _resolve_buffer(c, algo_cls)
    _resolve_explorer(c)
    _resolve_trainer(c)
    _resolve_synchronizer(c)
    _resolve_eval_interval(c)
    _check_mode(c)
    check_sync(c)
    check_colocate(c)
    check_data_processor(c)
    c._geometry = batch_geometry(
        c, step_wise=bool(getattr(algo_cls, "step_wise", False)), explored=algo_cls.explored_per_train_step(c)
    )
    _derive_component_args(c, algo_cls)
    try:
        algo_cls.check_config(c)
    except ValueError as exc:
        raise ConfigError(f"algorithm type {c.algorithm.algorithm_type!r}: {exc}") from None


def _derive_component_args(c: Config, algo_cls: type) -> None:
    """Component arguments that follow from the resolved config (``AlgorithmType.derived_args``,
    e.g. the usual/expert row counts ``mix`` losses get from the batch geometry), each only
    where the user left it unset."""
    derive = getattr(algo_cls, "derived_args", None)
    if derive is None:
        return
    for field, values in (derive(c) or {}).items():
        args = getattr(c.algorithm, field)
        if args is None:
            args = {}
            setattr(c.algorithm, field, args)
        for key, value in values.items():
            if args.get(key) is None:
                args[key] = value


def _resolve_paths(c: Config) -> None:
    root = c.checkpoint_root_dir or os.environ.get(CHECKPOINT_ROOT_ENV) or "./checkpoints"
    # Absolute, so Ray workers started in another directory write to the same place.
    c.checkpoint_root_dir = os.path.abspath(os.path.expanduser(root))
    c.checkpoint_job_dir = c.job_dir
    if not c.ray_namespace:
        c.ray_namespace = "/".join(p for p in (c.project, c.group, c.name) if p)
    c.monitor.cache_dir = os.path.join(c.job_dir, "monitor")
    c.log.save_dir = os.path.join(c.job_dir, "log")
    c.buffer.cache_dir = os.path.join(c.job_dir, "buffer")
    c.synchronizer.ray_namespace = c.ray_namespace


def _resolve_model(c: Config) -> None:
    m = c.model
    if not m.model_path:
        raise ConfigError(
            "required key is missing; set it to a Hugging Face model id or a local model folder",
            key="model.model_path",
        )
    if not m.critic_model_path:
        m.critic_model_path = m.model_path
    derive_token_limits(m, "model")


# (kind, key) of the component names a taskset and the levels above it may set.
_TASK_COMPONENTS = (("workflow", "default_workflow_type"), ("reward_fn", "default_reward_fn_type"))


def _resolve_buffer(c: Config, algo_cls: type) -> None:
    b, ei = c.buffer, c.buffer.explorer_input
    for section, key in ((b, "buffer"), (ei, "buffer.explorer_input")):
        for kind, field in _TASK_COMPONENTS:
            check_task_component(kind, getattr(section, field), f"{key}.{field}")
    check_task_component(
        "workflow", ei.default_eval_workflow_type, "buffer.explorer_input.default_eval_workflow_type"
    )
    repeat = c.algorithm.repeat_times
    if ei.taskset is not None:
        if ei.tasksets:
            raise ConfigError(
                "set either taskset (one taskset) or tasksets (a list), not both",
                key="buffer.explorer_input.taskset",
            )
        ei.tasksets, ei.taskset = [ei.taskset], None
    if not b.train_batch_size:
        b.train_batch_size = b.batch_size * repeat
    b.tokenizer_path = c.model.model_path
    # Names are unique within a group, where they identify something: a training taskset's
    # read position in checkpoints, an eval taskset's metrics (eval/<name>/...), a buffer's Ray
    # actor or SQL table. A training and an eval taskset may share a name (Trinity-RFT's
    # examples often do): they never meet.
    for group, tasksets, why in (
        ("tasksets", ei.tasksets, "it keys the taskset's read position in checkpoints"),
        ("eval_tasksets", ei.eval_tasksets, "eval metrics are logged under eval/<name>"),
    ):
        taskset_names: dict[str, str] = {}
        for i, ts in enumerate(tasksets):
            key = f"buffer.explorer_input.{group}[{i}]"
            _resolve_taskset(c, ts, key, i, is_eval=group == "eval_tasksets")
            _unique(taskset_names, ts.name, key, why)
    names: dict[str, str] = {}
    ti = b.trainer_input
    if ti.experience_buffer is None:
        ti.experience_buffer = ExperienceBufferConfig(name="experience_buffer")
    _resolve_experience_buffer(
        c, ti.experience_buffer, "buffer.trainer_input.experience_buffer", "experience_buffer"
    )
    if ti.experience_buffer.schema_type is None:
        ti.experience_buffer.schema_type = algo_cls.schema
    _keep_queue_experiences(c, ti.experience_buffer)
    _unique(names, ti.experience_buffer.name, "buffer.trainer_input.experience_buffer")
    for name, aux in ti.auxiliary_buffers.items():
        key = f"buffer.trainer_input.auxiliary_buffers.{name}"
        _resolve_experience_buffer(c, aux, key, name)
        _unique(names, aux.name, key)


def _unique(
    names: dict[str, str], name: str, key: str, why: str = "buffer names become Ray actor names"
) -> None:
    if name in names:
        raise ConfigError(
            f"name {name!r} is already used by {names[name]}; it must be unique ({why})",
            key=f"{key}.name",
        )
    names[name] = key


def _resolve_storage_common(c: Config, storage: Any, key: str) -> None:
    if storage.storage_type in ("file", "sql") and not storage.path:
        raise ConfigError(
            f"required for storage_type {storage.storage_type!r}; set the data's location", key=f"{key}.path"
        )
    storage.total_epochs = c.buffer.total_epochs
    storage.total_steps = c.buffer.total_steps
    if storage.ray_namespace is None:
        storage.ray_namespace = c.ray_namespace


def _resolve_taskset(c: Config, ts: TasksetConfig, key: str, index: int, *, is_eval: bool) -> None:
    m, b, ei = c.model, c.buffer, c.buffer.explorer_input
    for kind, field in _TASK_COMPONENTS:
        check_task_component(kind, getattr(ts, field), f"{key}.{field}")
    if ts.task_selector is not None:
        if "data_selector" in ts.model_fields_set:
            raise ConfigError(
                "set data_selector only (task_selector is its deprecated alias)", key=f"{key}.task_selector"
            )
        ts.data_selector, ts.task_selector = ts.task_selector, None
    if not is_eval:  # eval tasksets are read in file order whatever they name
        check_task_component("selector", ts.data_selector.selector_type, f"{key}.data_selector.selector_type")
    if not ts.name:
        ts.name = f"{'eval_' if is_eval else ''}taskset_{index}"
    _resolve_storage_common(c, ts, key)
    ts.is_eval = is_eval
    ts.batch_size = b.batch_size
    repeat = c.algorithm.repeat_times
    if is_eval:
        ts.repeat_times = ts.repeat_times or 1
    else:
        if ts.repeat_times is not None and ts.repeat_times != repeat:
            raise ConfigError(
                f"{ts.repeat_times} conflicts with algorithm.repeat_times ({repeat}); training tasksets always use "
                "algorithm.repeat_times, remove this key",
                key=f"{key}.repeat_times",
            )
        ts.repeat_times = repeat
    ra = ts.rollout_args
    if ra.n is not None and ra.n != ts.repeat_times:
        raise ConfigError(
            f"{ra.n} conflicts with repeat_times ({ts.repeat_times}); rollout_args.n is derived, remove it",
            key=f"{key}.rollout_args.n",
        )
    ra.n = ts.repeat_times
    for field in ("temperature", "top_p", "top_k", "logprobs"):
        if getattr(ra, field) is None:
            setattr(ra, field, getattr(m, field))
    if ra.max_tokens is None:
        ra.max_tokens = m.max_response_tokens
    if ts.default_workflow_type is None:
        ts.default_workflow_type = (
            (ei.default_eval_workflow_type if is_eval else None)
            or ei.default_workflow_type
            or b.default_workflow_type
        )
    if ts.default_reward_fn_type is None:
        ts.default_reward_fn_type = ei.default_reward_fn_type or b.default_reward_fn_type
    _check_task_args(ts, key)


def _check_task_args(ts: TasksetConfig, key: str) -> None:
    """``reward_fn_args`` must be arguments of the reward function's constructor (the workflow
    builds it with them: an unknown one failed every task at run time), and ``workflow_args``
    among the workflow's ``WORKFLOW_ARGS`` where it declares them. Tasksets whose rows name
    their own workflow or reward (``format.workflow_key`` / ``reward_fn_key``) are not checked."""
    fmt, workflow = ts.format, None
    if ts.default_workflow_type and not fmt.workflow_key:
        workflow = lookup_component("workflow", ts.default_workflow_type, f"{key}.default_workflow_type")
        declared = getattr(workflow, "WORKFLOW_ARGS", None)
        if declared is not None:
            what = f"workflow {ts.default_workflow_type!r}"
            check_arg_names(ts.workflow_args, sorted(declared), what, f"{key}.workflow_args")
    if not ts.reward_fn_args or fmt.reward_fn_key:
        return
    if ts.default_reward_fn_type:
        reward = lookup_component("reward_fn", ts.default_reward_fn_type, f"{key}.default_reward_fn_type")
        what = f"reward_fn {ts.default_reward_fn_type!r}"
    else:  # the workflow's own reward function, if it has one
        reward = getattr(workflow, "default_reward_fn", None)
        what = f"{getattr(reward, '__name__', '')} (workflow {ts.default_workflow_type!r}'s reward)"
    if isinstance(reward, type):
        check_init_args(reward, ts.reward_fn_args, what, f"{key}.reward_fn_args")


def _resolve_experience_buffer(c: Config, eb: ExperienceBufferConfig, key: str, default_name: str) -> None:
    if not eb.name:
        eb.name = default_name
    _resolve_storage_common(c, eb, key)
    if eb.storage_type in ("sql", "queue") and eb.path:
        eb.path = _absolute_sqlite_url(eb.path)
    eb.batch_size = c.buffer.train_batch_size or 0
    eb.tokenizer_path = eb.tokenizer_path or c.model.model_path
    # Deprecated flat keys move into replay_buffer, so there is one place to read them.
    if eb.use_priority_queue is not None or eb.reuse_cooldown_time is not None:
        if eb.replay_buffer is None:
            eb.replay_buffer = ReplayBufferConfig()
        if eb.use_priority_queue is not None:
            eb.replay_buffer.enable = eb.use_priority_queue
        if eb.reuse_cooldown_time is not None:
            eb.replay_buffer.reuse_cooldown_time = eb.reuse_cooldown_time
        eb.use_priority_queue = eb.reuse_cooldown_time = None


def _keep_queue_experiences(c: Config, eb: ExperienceBufferConfig) -> None:
    """A ``queue`` without a ``path`` in a job that runs both explorer and trainer on a Ray of
    its own gets its SQL mirror in the job folder (``<job_dir>/buffer/<name>.db``): the trained
    experiences stay browsable (``trinity studio``) and a resumed run gets its unread ones back,
    for a few milliseconds per step. On a shared cluster (``cluster.ray_address``) the job folder
    may be on a network file system, where SQLite is no safe default: set ``path`` there."""
    if eb.storage_type != "queue" or eb.path or c.mode not in ("both", "colocate") or joins_cluster(c):
        return
    eb.path = "sqlite:///" + os.path.join(os.path.abspath(c.buffer.cache_dir), f"{eb.name}.db")


def _absolute_sqlite_url(path: str) -> str:
    """``sqlite:///buffer.db`` (relative to where ``trinity run`` started) made absolute, so
    the actors, whose working directory may differ, and a second job open the same file."""
    prefix = "sqlite:///"
    if "://" not in path:  # a bare file path (sql reads it as SQLite)
        return os.path.abspath(os.path.expanduser(path))
    if not path.startswith(prefix):
        return path
    file, sep, query = path[len(prefix) :].partition("?")
    if not file or file == ":memory:" or os.path.isabs(file):
        return path
    return prefix + os.path.abspath(file) + sep + query


def _resolve_explorer(c: Config) -> None:
    m, rm = c.model, c.explorer.rollout_model
    if rm.model_path and rm.model_path != m.model_path:
        raise ConfigError(
            f"{rm.model_path!r} differs from model.model_path ({m.model_path!r}); the rollout model is always the "
            "trained model, remove this key",
            key="explorer.rollout_model.model_path",
        )
    rm.model_path = m.model_path
    rm.trust_remote_code = rm.trust_remote_code or m.trust_remote_code
    for field in ("temperature", "top_p", "top_k", "logprobs"):
        setattr(rm, field, getattr(m, field))
    for field in (*_LENGTH_FIELDS, "repetition_penalty", "enable_thinking"):
        if getattr(rm, field) is None:
            setattr(rm, field, getattr(m, field))
    if rm.chat_template is None:
        rm.chat_template = m.custom_chat_template
    rm.enable_lora = bool(m.lora_configs)
    if m.lora_configs:
        rm.lora_kwargs = {**vllm_lora_kwargs(m), **rm.lora_kwargs}
    rm.rope_scaling, rm.rope_theta = m.rope_scaling, m.rope_theta
    runners = rm.engine_num * c.explorer.runner_per_model
    _resolve_engine(rm, "explorer.rollout_model", runners)
    for i, aux in enumerate(c.explorer.auxiliary_models):
        if not aux.model_path:
            raise ConfigError(
                "required key is missing; an auxiliary model needs its own model_path",
                key=f"explorer.auxiliary_models[{i}].model_path",
            )
        # As Trinity-RFT: the trained model's limits where unset. An auxiliary model that sets
        # its own max_model_len splits that; one that sets only its prompt or response limit
        # takes the other part from the trained model and their sum as its max_model_len.
        given = [f for f in _LENGTH_FIELDS[:3] if getattr(aux, f) is not None]
        if not given:
            inherited = _LENGTH_FIELDS
        elif "max_model_len" in given:
            inherited = _LENGTH_FIELDS[3:]
        else:
            inherited = ("max_prompt_tokens", "max_response_tokens", *_LENGTH_FIELDS[3:])
        for field in inherited:
            if getattr(aux, field) is None:
                setattr(aux, field, getattr(m, field))
        _resolve_engine(aux, f"explorer.auxiliary_models[{i}]", runners)


_LENGTH_FIELDS = ("max_model_len", "max_prompt_tokens", "max_response_tokens", "min_response_tokens",
                  "enable_prompt_truncation")  # fmt: skip


def _resolve_engine(model: InferenceModelConfig, key: str, runners: int) -> None:
    derive_token_limits(model, key, auxiliary=key.startswith("explorer.auxiliary_models"))
    if model.base_port == 0:  # port 0 asks the OS for a free port: the same as leaving it unset
        model.base_port = None
    if model.base_port is not None and model.base_port + runners - 1 > MAX_PORT:
        raise ConfigError(
            f"{model.base_port} + {runners} runners reaches port {model.base_port + runners - 1}, past "
            f"{MAX_PORT} (one OpenAI API server per runner; runners = explorer.rollout_model.engine_num * "
            f"explorer.runner_per_model); use at most {MAX_PORT - runners + 1}, or leave it unset for free ports",
            key=f"{key}.base_port",
        )
    if model.engine_type == "vllm_async":  # Trinity-RFT alias: both names mean the async vLLM engine
        model.engine_type = "vllm"
    elif model.engine_type == "auto":
        model.engine_type = "vllm" if gpu_backend_available("vllm") else "transformers"
    model.gpu_per_engine = (
        model.tensor_parallel_size * model.data_parallel_size * model.pipeline_parallel_size
    )


def _resolve_trainer(c: Config) -> None:
    t = c.trainer
    if t.trainer_type == "auto":
        t.trainer_type = "verl" if gpu_backend_available("verl") else "native"
    if t.trainer_config_path:
        if t.trainer_config:
            raise ConfigError(
                "set either trainer_config or trainer_config_path, not both",
                key="trainer.trainer_config_path",
            )
        t.trainer_config, t.trainer_config_path = _load_trainer_config(t.trainer_config_path), ""
    if t.trainer_config is None:
        t.trainer_config = {}
    if t.max_token_len_per_gpu is None:
        t.max_token_len_per_gpu = math.ceil(
            2 * (c.model.max_model_len or 0) / t.ulysses_sequence_parallel_size
        )


def _load_trainer_config(path: str) -> dict[str, Any]:
    try:
        data = load_yaml_dict(path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}", key="trainer.trainer_config_path") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping", key="trainer.trainer_config_path")
    return data


def _resolve_synchronizer(c: Config) -> None:
    s, rm = c.synchronizer, c.explorer.rollout_model
    if "sync_method" not in s.model_fields_set:
        # Only separate processes (explore / train modes) need checkpoints on disk. `both` mode
        # defaults to memory (state dict via Ray); `nccl` (a broadcast group) is asked for by name.
        s.sync_method = "memory" if c.mode in ("both", "colocate") else "checkpoint"
    s.explorer_sync_interval = s.explorer_sync_interval or s.sync_interval
    s.trainer_sync_interval = s.trainer_sync_interval or s.sync_interval
    s.explorer_world_size = rm.engine_num * rm.gpu_per_engine


def _resolve_eval_interval(c: Config) -> None:
    """As in Trinity-RFT: evaluate on steps where the explorer gets new weights."""
    ex, sync_interval = c.explorer, c.synchronizer.sync_interval
    if c.mode == "bench" or c.algorithm.algorithm_type == "dpo" or ex.eval_interval % sync_interval == 0:
        return
    adjusted = max(ex.eval_interval // sync_interval, 1) * sync_interval
    logger.warning(
        "`eval_interval` is not a multiple of `sync_interval`; adjusted to %d "
        "(explorer.eval_interval %d, synchronizer.sync_interval %d)",
        adjusted,
        ex.eval_interval,
        sync_interval,
    )
    ex.eval_interval = adjusted


def _check_mode(c: Config) -> None:
    check_mode_inputs(c)
    _share_queue_between_jobs(c)
    if c.mode in ("explore", "train") and c.synchronizer.sync_method == "nccl" and not joins_cluster(c):
        # Checkpoints instead, said once, as Trinity-RFT does (e.g. BOTS's ref_eval_collect.yaml).
        logger.warning(
            "synchronizer.sync_method: 'nccl' broadcasts to the explore job's actors, which mode %r "
            "reaches only when both jobs run on one Ray cluster (cluster.ray_address, after `ray start "
            "--head`); this job syncs through checkpoints (sync_method: checkpoint)",
            c.mode,
        )
        c.synchronizer.sync_method = "checkpoint"


def joins_cluster(c: Config) -> bool:
    """Whether the job joins an existing Ray cluster (``cluster.ray_address`` or
    ``$RAY_ADDRESS``) rather than starting a Ray of its own."""
    from trinity.config.ray_address import resolve_address

    return resolve_address(c.cluster.ray_address, os.environ)[0] is not None


def _share_queue_between_jobs(c: Config) -> None:
    """A ``queue`` read or written by one side of a decoupled pair (``mode: explore`` or
    ``serve``, and ``mode: train``, as two jobs). On a shared Ray cluster the two jobs find the same named queue
    actor (namespace ``<project>/<name>``). A job that starts a Ray of its own cannot reach the
    other job's actor, so it uses the queue's SQL backup (``path``) as the buffer itself, as
    ``storage_type: sql``: the explorer writes rows there, the trainer claims them."""
    eb = c.buffer.trainer_input.experience_buffer
    if (
        c.mode not in ("explore", "train", "serve")
        or eb is None
        or eb.storage_type != "queue"
        or joins_cluster(c)
    ):
        return
    key = "buffer.trainer_input.experience_buffer"
    given = ((c._source or {}).get("buffer") or {}).get("trainer_input") or {}
    if not eb.path and given.get("experience_buffer") is None and c.mode == "explore":
        # No buffer configured (`trinity debug`, an explore job looking at its rollouts): the
        # explorer writes to a queue of its own run, nothing shared with another job.
        return
    if not eb.path:
        raise ConfigError(
            f"mode {c.mode!r} shares its queue with a separate {'explore' if c.mode == 'train' else 'train'} "
            "job: give the queue a path (its SQL backup, e.g. sqlite:///buffer.db) or run both jobs on one "
            "Ray cluster (cluster.ray_address, after `ray start --head`)",
            key=f"{key}.path",
        )
    logger.info(
        "mode %r on a Ray of its own: the queue %r is shared with the other job through its SQL path %s",
        c.mode,
        eb.name,
        eb.path,
    )
    eb.storage_type = "sql"


@functools.cache
def gpu_backend_available(package: str) -> bool:
    """Whether ``package`` (vllm, verl) is installed and a CUDA device is visible.

    ``find_spec`` first, so torch is imported only when the backend is installed at all.
    """
    if importlib.util.find_spec(package) is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def stage_configs(config: Config) -> list[Config]:
    """One resolved config per stage; each is the global config deep-merged with the stage's keys."""
    source = config._source if config._source is not None else config.model_dump(exclude_unset=True)
    stages = source.get("stages") or []
    if not stages:
        return [config if config._source is not None else resolve_config(config)]
    base = {k: v for k, v in source.items() if k != "stages"}
    seen: set[str] = set()
    out = []
    for i, stage in enumerate(stages):
        stage_name = stage["stage_name"]
        if stage_name in seen:
            raise ConfigError(
                f"stage name {stage_name!r} is used twice", key=f"stages[{i}].stage_name", file=config._file
            )
        seen.add(stage_name)
        # An explicit null in a stage means "inherit", like leaving the key out.
        overrides = {k: v for k, v in stage.items() if k != "stage_name" and v is not None}
        stage_base = dict(base)
        stage_algo = overrides.get("algorithm") or {}
        if stage_algo.get("algorithm_type", base.get("algorithm", {}).get("algorithm_type")) != base.get(
            "algorithm", {}
        ).get("algorithm_type"):
            # Another algorithm: the global components and their args belong to the old one.
            stage_base.pop("algorithm", None)
        merged = deep_merge(stage_base, overrides)
        merged["name"] = f"{base.get('name', Config.model_fields['name'].default)}/{stage_name}"
        try:
            stage_config = validate_config(merged, config._file)
            stage_config._file = config._file
            out.append(resolve_config(stage_config))
        except ConfigError as exc:
            raise ConfigError(f"in stage {stage_name!r}: {exc.message}", key=exc.key, file=exc.file) from None
    if any(s.mode in ("both", "colocate") for s in out):
        for s in out:
            s._sync_for_other_stages = s.mode not in ("both", "colocate")
    return out


def resolve_with(config: Config, overrides: dict[str, Any]) -> Config:
    """``config`` resolved anew from the user's keys with ``overrides`` (a nested mapping)
    merged over them: every derived value (job folder, paths, namespaces, defaults) follows.

    How a renamed run or a later stage changes its config: the one place that derives values
    stays :func:`resolve_config`.
    """
    return _resolve_source(config, deep_merge(_source_of(config), overrides))


def start_from(config: Config, model_path: str) -> Config:
    """``config`` starting from the weights at ``model_path`` (a later stage, from the previous
    stage's final checkpoint): resolved anew with ``model.model_path`` set, so what derives from
    it follows (rollout model, critic, tokenizers), and so does every key the user set to the
    old path (typically through ``${model.model_path}``, which the YAML loader already
    replaced with the path). A critic or tokenizer the user pointed elsewhere is kept."""
    source = replace_values(_source_of(config), config.model.model_path, model_path)
    return _resolve_source(config, deep_merge(source, {"model": {"model_path": model_path}}))


def _source_of(config: Config) -> dict[str, Any]:
    return config._source if config._source is not None else config.model_dump(exclude_unset=True)


def _resolve_source(config: Config, source: dict[str, Any]) -> Config:
    fresh = validate_config(source, config._file)
    fresh._file = config._file
    fresh._sync_for_other_stages = config._sync_for_other_stages
    return resolve_config(fresh)


def replace_values(data: Any, old: str, new: str) -> Any:
    """``data`` with every string equal to ``old`` replaced by ``new`` (nested dicts and lists)."""
    if isinstance(data, dict):
        return {k: replace_values(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [replace_values(v, old, new) for v in data]
    return new if data == old else data
