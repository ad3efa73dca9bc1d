"""Ray orchestration of a job: stages, modes, actors and the explore/train/sync schedule.

``run(config)`` runs every stage in sequence (each starting from the previous stage's
weights) and returns a process exit code. Per stage it connects to Ray (``cluster.ray_address``
or a local Ray started with this machine's CPUs), starts the actors the mode needs, drives
them step by step and always shuts them down: on success, on Ctrl-C and when an actor dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config

logger = logging.getLogger("trinity.launcher")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class JobFailed(RuntimeError):
    """An actor failed; the message says which one and why."""


@dataclass
class StageResult:
    name: str
    trainer_steps: int
    explorer_steps: int
    final_checkpoint: str | None
    metrics: dict[str, float]


def run(config: Config) -> int:
    """Run all stages of ``config``; return the process exit code."""
    _setup_driver_logging()
    previous_checkpoint: str | None = None
    stages = config.stage_configs()
    for index, stage in enumerate(stages):
        if previous_checkpoint is not None:
            # Each stage starts from the weights the previous one ended with.
            start_from(stage, previous_checkpoint)
        label = stage.name if len(stages) > 1 else config.name
        print(f"[trinity] stage {index + 1}/{len(stages)}: {label} (mode {stage.mode})", flush=True)
        try:
            result = run_stage(stage)
        except KeyboardInterrupt:
            print("[trinity] interrupted; actors stopped.", file=sys.stderr)
            return EXIT_INTERRUPTED
        except JobFailed as exc:
            print(f"[trinity] job failed: {exc}", file=sys.stderr)
            return EXIT_FAILED
        previous_checkpoint = result.final_checkpoint or previous_checkpoint
    return EXIT_OK


def start_from(config: Config, model_path: str) -> None:
    """Point a resolved stage config at ``model_path`` (the previous stage's final weights).

    Resolving copied ``model.model_path`` into derived keys (the rollout model, the critic and
    the tokenizers); they follow it here, or the explorer would roll out with the old weights.
    A critic or tokenizer path the user set to something else is kept.
    """
    old = config.model.model_path
    config.model.model_path = model_path
    config.explorer.rollout_model.model_path = model_path
    if config.model.critic_model_path == old:
        config.model.critic_model_path = model_path
    buffer = config.buffer
    readers = [buffer, *buffer.explorer_input.tasksets, *buffer.explorer_input.eval_tasksets]
    if buffer.trainer_input.experience_buffer is not None:
        readers.append(buffer.trainer_input.experience_buffer)
    readers.extend(buffer.trainer_input.auxiliary_buffers.values())
    for reader in readers:
        if getattr(reader, "tokenizer_path", None) == old:
            reader.tokenizer_path = model_path


def _setup_driver_logging() -> None:
    if not logging.getLogger("trinity").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[trinity] %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("trinity").addHandler(handler)
        logging.getLogger("trinity").setLevel(logging.INFO)


def _init_ray(config: Config) -> Any:
    import ray

    if ray.is_initialized():
        return ray
    env_vars = {
        key: value
        for key, value in os.environ.items()
        if key.startswith("TRINITY_")
        or key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")
    }
    env_vars.setdefault("TOKENIZERS_PARALLELISM", "false")
    runtime_env = {"env_vars": env_vars}
    address = config.cluster.ray_address
    if address in ("", "auto", "local") and not os.environ.get("RAY_ADDRESS"):
        # No cluster named: start our own. Probing for "any running cluster" can latch onto a
        # stale or dying local one (its session file outlives it), so it is opt-in.
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, 2),
            namespace=config.ray_namespace,
            runtime_env=runtime_env,
            include_dashboard=False,
            log_to_driver=False,
        )
    else:
        target = os.environ.get("RAY_ADDRESS") if address in ("", "auto", "local") else address
        ray.init(address=target, namespace=config.ray_namespace, runtime_env=runtime_env, log_to_driver=False)
    return ray


def run_stage(config: Config) -> StageResult:
    """Run one stage (one resolved config) to completion."""
    from trinity.actors import ExplorerActor, TrainerActor
    from trinity.monitor import get_monitor, get_monitors
    from trinity.placement import actor_resources, cpu_shares, runs
    from trinity.sync import Synchronizer
    from trinity.trainer.checkpoint import apply_continue_rule

    renamed = apply_continue_rule(config)
    if renamed is not config:
        # Trinity-RFT's rule: without continue_from_checkpoint an existing run is never overwritten.
        print(
            f"[trinity] {config.job_dir} exists and continue_from_checkpoint is false: "
            f"running as {renamed.name!r}",
            flush=True,
        )
        config = renamed
    ray = _init_ray(config)
    job_dir = Path(config.checkpoint_job_dir)
    (job_dir / "log").mkdir(parents=True, exist_ok=True)
    synchronizer = Synchronizer.from_config(config.synchronizer)
    total = total_steps(config)
    # One run per role, as Trinity-RFT logs them (the "_explorer" / "_trainer" runs).
    monitors = {role: get_monitors(config, role, total) for role in ("explorer", "trainer")}
    if "console" not in config.monitor.monitor_types():
        # The console progress bar is always on, following the role that paces the job.
        role = "trainer" if runs(config, "trainer") else "explorer"
        monitors[role].monitors.append(get_monitor("console", config, role, total))
    actors: list[Any] = []
    _INTERRUPTED.clear()
    previous_handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        explorer = trainer = None
        gpus = ray.cluster_resources().get("GPU", 0)
        resources = actor_resources(config, gpus)
        # A user's OMP_NUM_THREADS travels to the actors (above) and wins over our share.
        shares = {} if "OMP_NUM_THREADS" in os.environ else cpu_shares(config, gpus)
        if runs(config, "explorer"):
            explorer = ExplorerActor.options(name=config.explorer.name, **resources["explorer"]).remote(
                config, shares.get("explorer")
            )
            actors.append(explorer)
        if runs(config, "trainer"):
            trainer = TrainerActor.options(name=config.trainer.name, **resources["trainer"]).remote(
                config, shares.get("trainer")
            )
            actors.append(trainer)
        # Construction errors surface here, with the actor named.
        _get(ray, [a.ready.remote() for a in actors], "starting actors")
        if config.mode == "bench":
            metrics = _get(ray, explorer.benchmark.remote(), "explorer benchmark")
            _log(monitors["explorer"], metrics, 0)
            return StageResult(config.name, 0, 0, None, metrics)
        return _drive(ray, config, explorer, trainer, synchronizer, monitors)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if config.monitor.enable_ray_timeline:
            # Chrome-trace view of every actor call (chrome://tracing), as Trinity-RFT exports it.
            with contextlib.suppress(Exception):
                (job_dir / "monitor").mkdir(parents=True, exist_ok=True)
                ray.timeline(filename=str(job_dir / "monitor" / "timeline.json"))
        for monitor in monitors.values():
            monitor.close()
        for actor in actors:
            with contextlib.suppress(Exception):  # the actor may already be gone
                ray.kill(actor)
        ray.shutdown()


# Set by Ctrl-C / SIGTERM during a stage. The handler also raises KeyboardInterrupt, but a raise
# can be lost: the signal may land while the main thread runs a Python callback from Ray's C++
# core, where an exception is printed and dropped (ray-project/ray#7734 is one such case). Once
# in the test suite a Ctrl-C was lost that way and the job ran on to its last step. The step
# loop checks this flag, so a lost raise still stops the job at the next step.
_INTERRUPTED = threading.Event()


def _interrupt(*_: Any) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def _check_interrupted() -> None:
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


def _get(ray: Any, refs: Any, doing: str) -> Any:
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(refs)
    except RayTaskError as exc:
        raise JobFailed(f"{doing}: {exc.cause!r}" if exc.cause else f"{doing}: {exc}") from exc
    except RayActorError as exc:
        raise JobFailed(f"{doing}: an actor died ({exc})") from exc


# Seconds to wait for the other sides' errors once one side of a collective call has failed.
_COLLECT_ERRORS_S = 5.0


def _get_together(
    ray: Any, refs: list[Any], doing: str, timeout: float, grace: float | None = None
) -> list[Any]:
    """Results of calls that must run together (the ranks of one collective).

    The first failure ends the wait: the other calls would only sit in the collective until
    their own timeout. Their errors are collected for a few seconds, so the message shows every
    side (e.g. the explorer's reason next to the trainer's "cancelled"). Calls still running
    after ``timeout`` plus ``grace`` (default: 10 %, at least 30 s; the group's own timeouts
    should fire first) are a :class:`JobFailed` as well.
    """
    grace = max(30.0, 0.1 * timeout) if grace is None else grace
    deadline = time.monotonic() + timeout + grace
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise JobFailed(
                f"{doing}: no answer within synchronizer.sync_timeout ({timeout:g} s); "
                "a rank of the weight-sync group hangs"
            )
        try:
            _get(ray, ready[0], doing)
        except JobFailed as first:
            messages = [str(first)]
            late = (
                ray.wait(pending, num_returns=len(pending), timeout=_COLLECT_ERRORS_S)[0] if pending else []
            )
            for ref in late:
                try:
                    _get(ray, ref, doing)
                except JobFailed as other:
                    messages.append(str(other).removeprefix(f"{doing}: "))
            raise JobFailed("; ".join(messages)) from first
    return [ray.get(ref) for ref in refs]


def _log(monitor: Any, metrics: dict[str, Any], step: int) -> None:
    monitor.log(
        {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}, step
    )


def total_steps(config: Config) -> int | None:
    """Steps to run: ``buffer.total_steps``, else ``trainer.total_steps``, else until the data ends."""
    total = config.buffer.total_steps or getattr(config.trainer, "total_steps", None)
    return int(total) if total else None


def _eval_due(config: Config, explorer_step: int) -> bool:
    interval = config.explorer.eval_interval
    return bool(interval) and explorer_step > 0 and explorer_step % interval == 0


def _drive(
    ray: Any, config: Config, explorer: Any, trainer: Any, synchronizer: Any, monitors: dict[str, Any]
) -> StageResult:
    """Step explorer and trainer concurrently, syncing weights as the synchronizer decides."""
    explorer_step = _get(ray, explorer.current_step.remote(), "explorer") if explorer else 0
    explorer_version = _get(ray, explorer.model_version.remote(), "explorer") if explorer else 0
    trainer_step = _get(ray, trainer.current_step.remote(), "trainer") if trainer else 0
    total = total_steps(config)
    explore_ref = train_ref = None
    explorer_done = explorer is None
    trainer_done = trainer is None
    last_metrics: dict[str, float] = {}
    start = time.monotonic()

    broadcast = config.synchronizer.sync_method == "nccl" and explorer is not None and trainer is not None
    if broadcast:
        _open_weight_group(ray, config, explorer, trainer)

    if explorer is not None and config.explorer.eval_on_startup and explorer_step == 0:
        _log(monitors["explorer"], _get(ray, explorer.eval.remote(), "explorer eval"), 0)

    while not (explorer_done and trainer_done):
        _check_interrupted()
        if not explorer_done and explore_ref is None:
            if total is not None and explorer_step >= total:
                explorer_done = True
                _get(ray, explorer.finish.remote(), "explorer finish")
            else:
                run = True
                if trainer is not None:
                    decision = synchronizer.explorer_decision(explorer_step, trainer_step, explorer_version)
                    if decision.action == "sync" or (decision.action == "wait" and trainer_done):
                        explorer_version = _sync(ray, config, explorer, trainer)
                    elif decision.action == "wait":
                        run = False  # until the trainer reaches decision.version
                if run:
                    explore_ref = explorer.explore_step.remote()
        if not trainer_done and train_ref is None:
            if total is not None and trainer_step >= total:
                trainer_done = True
            else:
                train_ref = trainer.train_step.remote()
        pending = [r for r in (explore_ref, train_ref) if r is not None]
        if not pending:
            continue
        ready, _ = ray.wait(pending, num_returns=1)
        if explore_ref is not None and explore_ref in ready:
            metrics = _get(ray, explore_ref, "explorer step")
            explore_ref = None
            if metrics is None:  # taskset exhausted
                explorer_done = True
                _get(ray, explorer.finish.remote(), "explorer finish")
            else:
                explorer_step += 1
                _log(monitors["explorer"], metrics, explorer_step)
                last_metrics.update(metrics)
                if _eval_due(config, explorer_step):
                    metrics = _get(ray, explorer.eval.remote(), "explorer eval")
                    _log(monitors["explorer"], metrics, explorer_step)
        if train_ref is not None and train_ref in ready:
            metrics = _get(ray, train_ref, "trainer step")
            train_ref = None
            if metrics is None:  # no more experiences will come
                trainer_done = True
            else:
                trainer_step += 1
                _log(monitors["trainer"], metrics, trainer_step)
                last_metrics.update(metrics)
    final_checkpoint = None
    if trainer is not None:
        final_checkpoint = _get(ray, trainer.finish.remote(), "trainer finish")
    # Evaluate the final weights once more when the last step was not an eval step.
    final_eval_needed = config.explorer.eval_interval and not _eval_due(config, explorer_step)
    if explorer is not None and trainer is not None and final_checkpoint and final_eval_needed:
        _sync(ray, config, explorer, trainer)
        _log(monitors["explorer"], _get(ray, explorer.eval.remote(), "explorer eval"), explorer_step)
    if broadcast:
        # A later stage (new actors) builds a group of its own.
        _get(ray, [explorer.close_weight_group.remote(), trainer.close_weight_group.remote()], "weight sync")
    elapsed = time.monotonic() - start
    print(
        f"[trinity] done: {trainer_step} train steps, {explorer_step} explore steps in {elapsed:.0f}s"
        + (f"; final weights {final_checkpoint}" if final_checkpoint else ""),
        flush=True,
    )
    return StageResult(config.name, trainer_step, explorer_step, final_checkpoint, last_metrics)


def _sync(ray: Any, config: Config, explorer: Any, trainer: Any) -> int:
    """Move the trainer's current weights to the explorer; returns their version (trainer step).

    Calls on one actor run in submission order, so the weights are those after every train
    step submitted so far (never a half-updated model).
    """
    method = config.synchronizer.sync_method
    if method == "nccl":
        return _broadcast_weights(ray, config, explorer, trainer)
    if method == "checkpoint":
        path_and_version = trainer.save_weights.remote()
        return _get(ray, explorer.load_checkpoint.remote(path_and_version), "explorer checkpoint sync")
    elif method == "memory":
        weights_and_version = trainer.get_weights.remote()
        # Passing the ref inside a list keeps Ray from materialising it in the driver.
        return _get(ray, explorer.update_weights.remote([weights_and_version]), "explorer weight sync")
    raise JobFailed(f"synchronizer.sync_method {method!r}: use 'nccl', 'memory' or 'checkpoint'")


def _open_weight_group(ray: Any, config: Config, explorer: Any, trainer: Any) -> None:
    """``sync_method: nccl``: build the group of the trainer (rank 0) and every rollout rank.

    The backend is NCCL when every rank has a GPU of its own, else gloo (logged once, at
    INFO). The trainer opens the store first (for its port); then both sides join together.
    """
    from trinity.sync.nccl import NCCLUnavailableError, choose_backend

    timeout = float(config.synchronizer.sync_timeout)
    trainer_device, engine_devices = _get(
        ray,
        [trainer.weight_sync_device.remote(), explorer.weight_sync_devices.remote()],
        "weight sync set-up",
    )
    devices = [trainer_device, *(d for engine in engine_devices for d in engine)]
    try:
        backend, why = choose_backend(devices)
    except NCCLUnavailableError as exc:
        raise JobFailed(f"weight sync set-up: {exc}") from exc
    logger.info("sync_method nccl: %s", why)
    address, port = _get(
        ray, trainer.open_weight_group.remote(len(devices), backend, timeout), "weight sync set-up"
    )
    _get_together(
        ray,
        [
            trainer.connect_weight_group.remote(),
            explorer.init_weight_group.remote(address, port, len(devices), backend, timeout),
        ],
        f"creating the weight-sync group ({backend}, {len(devices)} ranks)",
        timeout,
    )


def _broadcast_weights(ray: Any, config: Config, explorer: Any, trainer: Any) -> int:
    """One ``nccl`` sync: the metadata through Ray, then the trainer's broadcast and the
    explorer's receive issued together (one waits for the other inside the collective)."""
    # Waits for a train step still running: the snapshot is taken after it.
    metas, version = _get(ray, trainer.prepare_weights.remote(), "trainer weights for the broadcast")
    _get_together(
        ray,
        [trainer.send_weights.remote(), explorer.receive_weights.remote(metas, version)],
        f"weight sync (broadcast of version {version})",
        float(config.synchronizer.sync_timeout),
    )
    return version
