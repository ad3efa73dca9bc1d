"""Cross-section rules of a resolved config that only validate (they derive nothing): what
``serve`` and ``colocate`` modes allow, the synchronizer's settings, the data processor's
operators (through the registry). Called by :func:`trinity.config.resolve.resolve_config`."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from trinity.config.algorithm_defaults import lookup_component
from trinity.config.errors import ConfigError
from trinity.config.sections.algorithm import LR_SCHEDULES
from trinity.config.sections.base import invalid_choice

if TYPE_CHECKING:
    from trinity.config.models import Config

logger = logging.getLogger("trinity.config.resolve")


def check_serve(c: Config) -> None:
    """``mode: serve`` writes for a separate ``mode: train`` job and picks up its checkpoints
    (see :mod:`trinity.serving.serve`): the buffer must outlive the job and be readable by
    another process, the weights come from checkpoints on disk, and one engine serves."""
    sync = c.synchronizer
    if sync.sync_method != "checkpoint":
        raise ConfigError(
            f"mode 'serve' loads the train job's checkpoints from disk; {sync.sync_method!r} needs both "
            "roles in one job: use sync_method: checkpoint (or leave it unset)",
            key="synchronizer.sync_method",
        )
    rm = c.explorer.rollout_model
    if rm.engine_num != 1:
        raise ConfigError(
            f"mode 'serve' serves one engine (got {rm.engine_num}); set engine_num: 1 "
            "(use tensor_parallel_size for a larger model)",
            key="explorer.rollout_model.engine_num",
        )
    if c.buffer.explorer_input.tasksets:
        logger.warning("mode 'serve' reads no tasksets: buffer.explorer_input.tasksets are not used")
    if c.explorer.auxiliary_models:
        logger.warning(
            "mode 'serve' serves only the rollout model: explorer.auxiliary_models are not started"
        )


def check_colocate(c: Config) -> None:
    """``mode: colocate``, as in Trinity-RFT: trainer and explorer share one GPU (on a CPU-only
    cluster, the cores), so one engine of one GPU, no auxiliary models, and weights synced
    through memory: there is no second device for an ``nccl`` broadcast."""
    if c.mode != "colocate":
        return
    rm, cluster = c.explorer.rollout_model, c.cluster
    if not c.buffer.explorer_input.tasksets:
        raise ConfigError(
            "mode 'colocate' needs at least one training taskset; add buffer.explorer_input.tasksets",
            key="buffer.explorer_input.tasksets",
        )
    if cluster.node_num * cluster.gpu_per_node > 1:
        raise ConfigError(
            f"mode 'colocate' shares one GPU between trainer and explorer, and cluster.node_num * "
            f"cluster.gpu_per_node is {cluster.node_num * cluster.gpu_per_node}; use mode 'both'",
            key="mode",
        )
    one_gpu = "mode 'colocate' (trainer and explorer on one GPU)"
    checks = [
        ("explorer.rollout_model.engine_num", rm.engine_num),
        ("explorer.rollout_model.tensor_parallel_size", rm.tensor_parallel_size),
        ("trainer.ulysses_sequence_parallel_size", c.trainer.ulysses_sequence_parallel_size),
    ]
    for key, value in checks:
        if value != 1:
            raise ConfigError(f"is {value}; {one_gpu} needs 1, or use mode 'both'", key=key)
    if c.explorer.auxiliary_models:
        raise ConfigError(
            f"{one_gpu} runs no auxiliary models; use mode 'both'", key="explorer.auxiliary_models"
        )
    if c.synchronizer.sync_method == "nccl":
        raise ConfigError(
            "mode 'colocate' cannot use nccl: trainer and explorer share one GPU, there is nothing to "
            "broadcast to; use memory (the default) or checkpoint",
            key="synchronizer.sync_method",
        )


def check_sync(c: Config) -> None:
    """Cross-section rules of the synchronizer (see :mod:`trinity.sync.synchronizer`)."""
    over = c.explorer.over_rollout
    style = c.synchronizer.sync_style
    if (over.ratio > 0 or over.return_partial_tasks) and style == "fixed":
        # Trinity-RFT refuses it too: a fixed schedule waits for the trainer at every sync step
        # anyway, so ending explore steps early would only drop tasks.
        raise ConfigError(
            "over_rollout needs a dynamic sync style: set synchronizer.sync_style to explorer_driven, "
            "trainer_driven or fully_async (fixed waits for every task)",
            key="explorer.over_rollout.ratio"
            if over.ratio > 0
            else "explorer.over_rollout.return_partial_tasks",
        )
    if over.partial_rollout and over.ratio == 0:
        raise ConfigError(
            "explorer.over_rollout.partial_rollout carries the tasks a step ends without, but with "
            "ratio 0 every step waits for all its tasks: set explorer.over_rollout.ratio above 0",
            key="explorer.over_rollout.partial_rollout",
        )


def check_data_processor(c: Config) -> None:
    """Every operator of the task and experience pipelines is a registered operator of its
    pipeline, taking the arguments given (checked through the registry, nothing is built: what
    the operators need from the job is checked before it starts, :mod:`trinity.data.checks`)."""
    from trinity.config.pipelines import check_operators, check_weights

    dp = c.data_processor
    if dp is None:
        return
    service = c.service.data_juicer
    if service is not None and not (service.auto_start or service.server_url):
        raise ConfigError(
            "needs server_url (a running service) or auto_start: true", key="service.data_juicer"
        )
    tp = dp.task_pipeline
    if tp is not None:
        if tp.config_path and not os.path.isabs(tp.config_path):
            tp.config_path = os.path.abspath(tp.config_path)
        if tp.priority_weights:
            try:
                check_weights(tp.priority_weights)
            except ValueError as exc:
                raise ConfigError(
                    str(exc).removeprefix("priority_weights: "),
                    key="data_processor.task_pipeline.priority_weights",
                ) from None
    for section in (tp, dp.experience_pipeline):
        for op in section.operators if section is not None else ():
            path = (op.args or {}).get("config_path")
            if op.name == "data_juicer" and isinstance(path, str) and path and not os.path.isabs(path):
                # Relative to where the job starts; the actors' working directory may differ.
                op.args = {**op.args, "config_path": os.path.abspath(path)}
    check_operators(c)


def check_optimizer(c: Config) -> None:
    """The optimizer's schedule names are ones the trainers know."""
    opt = c.algorithm.optimizer
    for field in ("warmup_style", "lr_scheduler_type"):
        value = getattr(opt, field)
        if value is not None and value not in LR_SCHEDULES:
            raise ConfigError(invalid_choice(value, LR_SCHEDULES), key=f"algorithm.optimizer.{field}")


def check_task_component(kind: str, name: str | None, key: str) -> None:
    """An unknown workflow / reward_fn name fails here, with the closest registered name; a
    dotted name (``pkg.module.Class``) is imported and type-checked as a class path."""
    if name:
        lookup_component(kind, name, key)


def check_mode_inputs(c: Config) -> None:
    """What the job's mode reads must be configured: serve's rules, training tasksets for
    ``both`` / ``explore``, eval tasksets for ``bench``."""
    if c.mode == "serve":
        check_serve(c)
    ei = c.buffer.explorer_input
    if c.mode in ("both", "explore") and not ei.tasksets:
        raise ConfigError(
            f"mode {c.mode!r} needs at least one training taskset; add buffer.explorer_input.tasksets",
            key="buffer.explorer_input.tasksets",
        )
    if c.mode == "bench" and not ei.eval_tasksets:
        raise ConfigError(
            "mode 'bench' evaluates checkpoints and needs buffer.explorer_input.eval_tasksets",
            key="buffer.explorer_input.eval_tasksets",
        )
