"""Ray orchestration of a job: stages, modes, actors, the job folder and interrupts.

``run(config)`` runs every stage in sequence (each starting from the previous stage's
weights) and returns a process exit code. Per stage it connects to Ray (``cluster.ray_address``
or a local Ray started with this machine's CPUs), starts the actors the mode needs, hands them
to the step loop (:mod:`trinity.step_loop`) and always shuts them down: on success, on Ctrl-C
and when an actor dies. What a job's parts hand each other (exit codes, :class:`JobFailed`,
:class:`StageResult`) is in :mod:`trinity.job`; its console lines are in :mod:`trinity.report`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity import report

# Each stage is resolved anew from the user's keys (config.resolve is the one place that derives).
from trinity.config.resolve import stage_configs, start_from
from trinity.job import EXIT_FAILED, EXIT_OK, JobFailed, StageResult
from trinity.step_loop import StepLoop, get, numbers, total_steps

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.stage_actors import StageActors

logger = logging.getLogger("trinity.launcher")


def run(config: Config) -> int:
    """Run all stages of ``config``; return the process exit code (:mod:`trinity.job`)."""
    from trinity.stage_actors import StageActors

    report.setup_driver_logging()
    previous_checkpoint: str | None = None
    stages = stage_configs(config)
    # A stage's actors serve the next stage too where it wants them as they are.
    actors = StageActors()
    try:
        for index, stage in enumerate(stages):
            if previous_checkpoint is not None:
                # Each stage starts from the weights the previous one ended with.
                stage = start_from(stage, previous_checkpoint)
            label = stage.name if len(stages) > 1 else config.name
            report.stage_starts(index, len(stages), label, stage.mode)
            actors.next_stage = stages[index + 1] if index + 1 < len(stages) else None
            try:
                result = run_stage(stage, more_stages=index + 1 < len(stages), actors=actors)
            except KeyboardInterrupt as exc:
                report.interrupted(exc)
                return 128 + _stop_signal  # EXIT_INTERRUPTED (130) for Ctrl-C, 143 for SIGTERM
            except JobFailed as exc:
                report.job_failed(exc)
                return EXIT_FAILED
            if result.shortfall:
                if index + 1 < len(stages):
                    report.later_stages_not_run()
                return EXIT_FAILED
            previous_checkpoint = result.final_checkpoint or previous_checkpoint
        return EXIT_OK
    finally:
        _shutdown_ray(actors)


def _shutdown_ray(actors: StageActors) -> None:
    """Stop (or leave) the Ray the job's stages ran on, if a stage kept it for the next one,
    with any actors kept for a stage that did not run."""
    import sys

    ray = sys.modules.get("ray")  # never imported: nothing to stop (and keep `run` light)
    if ray is not None and ray.is_initialized():
        actors.kill_kept(ray)
        ray.shutdown()


def _init_ray(config: Config) -> Any:
    """Connect to Ray for ``config`` (:func:`trinity.cluster.connect`); a cluster that cannot be
    used fails the job with its one-line reason."""
    from trinity.cluster import ClusterError, connect

    try:
        return connect(config)
    except ClusterError as exc:
        raise JobFailed(str(exc)) from None


def run_stage(config: Config, *, more_stages: bool = False, actors: StageActors | None = None) -> StageResult:
    """Run one stage (one resolved config) to completion, recording its status in
    ``<job dir>/run_status.json`` (:mod:`trinity.run_status`). ``more_stages``: a later stage
    of the job follows, and may reuse the Ray this one started (:func:`trinity.cluster.end_stage`).
    ``actors``: the job's :class:`~trinity.stage_actors.StageActors` (what the previous stage
    kept, and what the next one wants); by default the stage starts and kills its own."""
    from trinity.run_status import write_run_status
    from trinity.trainer.checkpoint import apply_continue_rule

    renamed = apply_continue_rule(config)
    if renamed is not config:
        # Trinity-RFT's rule: without continue_from_checkpoint an existing run is never overwritten.
        report.renamed(config.job_dir, renamed.name)
        config = renamed
    start = _Start()
    if config.mode == "bench":
        # It evaluates another run's folder: that run's status stands.
        return _run_stage(config, start, more_stages, actors)
    job_dir = config.checkpoint_job_dir
    created = _first_missing(job_dir, config.checkpoint_root_dir)
    write_run_status(job_dir, "running")
    save_config(config)
    try:
        with _trainer_job_heartbeat(config):
            result = _run_stage(config, start, more_stages, actors)
    except KeyboardInterrupt as exc:
        write_run_status(job_dir, "interrupted", f"stopped by {_stop_signal.name}")
        _remove_unstarted(config, created, start, exc)
        raise
    except BaseException as exc:
        write_run_status(job_dir, "failed", str(exc).split("\n")[0] or type(exc).__name__)
        _remove_unstarted(config, created, start, exc)
        raise
    write_run_status(job_dir, "failed" if result.shortfall else "finished", result.shortfall)
    return result


def _trainer_job_heartbeat(config: Config) -> contextlib.AbstractContextManager[Any]:
    """A train-only stage keeps ``<job dir>/trainer_job.json`` fresh while it runs: the sign
    by which an explore job of the same run knows that the checkpoints it needs will come
    (:mod:`trinity.sync.trainer_job`). Other stages write none."""
    from trinity.placement import runs

    if runs(config, "trainer") and not runs(config, "explorer"):
        from trinity.sync.trainer_job import TrainerHeartbeat

        return TrainerHeartbeat(config.checkpoint_job_dir)
    return contextlib.nullcontext()


#: The resolved config a run was started with, in its job folder (``config.<mode>.yaml`` for the
#: explore / serve job of a decoupled pair, which shares the folder with its train job).
CONFIG_FILE = "config.yaml"


def config_file_name(mode: str) -> str:
    """The name of the resolved config's file in the job folder, for a stage of ``mode``."""
    return f"config.{mode}.yaml" if mode in ("explore", "serve") else CONFIG_FILE


def save_config(config: Config) -> None:
    """Write the resolved config (what ``trinity run --dry-run`` prints) into the job folder,
    so the run keeps what produced it (the studio's Runs page shows it)."""
    path = Path(config.checkpoint_job_dir) / config_file_name(config.mode)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(
            f"# The resolved config of this run, written by `trinity run` at its start ({time.strftime('%Y-%m-%d %H:%M:%S')}).\n"
            + config.to_yaml()
        )
        os.replace(tmp, path)
    except OSError as exc:  # the run does not depend on it
        logger.warning("could not save the run's config to %s: %s", path, exc)


@dataclass
class _Start:
    """How far a stage's start got: ``actors_ready`` once its actors are up (from then on it
    has logs and results worth keeping, whatever happens)."""

    actors_ready: bool = False


def _first_missing(job_dir: str, root: str | None) -> Path | None:
    """The outermost folder of ``job_dir``'s path (below ``root``) that does not exist yet:
    what this start creates. ``None`` when ``job_dir`` exists."""
    path = Path(job_dir).absolute()
    if path.exists():
        return None
    top = Path(root).absolute() if root else None
    missing = path
    while missing.parent != missing and not missing.parent.exists() and missing.parent != top:
        missing = missing.parent
    return missing


def _remove_unstarted(config: Config, created: Path | None, start: _Start, exc: BaseException) -> None:
    """A start that failed (or was stopped) before its actors were up leaves nothing to keep:
    remove the folder it created, so failed attempts do not pile up as empty runs (each retry
    with ``continue_from_checkpoint: false`` would get a new timestamped folder). What was
    removed is a note on ``exc``, printed after the failure's own line."""
    import shutil

    from trinity.run_status import read_run_status

    job_dir = Path(config.checkpoint_job_dir)
    if created is None or start.actors_ready or not job_dir.is_dir():
        return
    status = read_run_status(job_dir) or {}
    if status.get("pid") != os.getpid() or any(job_dir.glob("global_step_*")):
        return  # another job (the other side of a decoupled pair) uses the folder now
    if any(job_dir.glob("annotation/*.db")):
        # People's labels, given while the task pipeline waited: the next start resumes from them.
        exc.add_note(f"{job_dir} kept: it holds the labels given so far (annotation/)")
        return
    shutil.rmtree(job_dir, ignore_errors=True)
    folder = job_dir.parent
    while folder != created.parent and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()  # the empty parents this start made (project, name of a staged job)
        folder = folder.parent
    exc.add_note(f"{job_dir} removed: this start stopped before its actors were up (nothing to keep)")


def _run_stage(
    config: Config, start: _Start | None = None, more_stages: bool = False, actors: StageActors | None = None
) -> StageResult:
    from trinity.buffer.factory import check_buffer_is_free
    from trinity.cluster import end_stage
    from trinity.config.pipelines import trains_on_pipeline_output
    from trinity.monitor import get_monitor, get_monitors
    from trinity.placement import cpu_shares, runs
    from trinity.stage_actors import ROLES, StageActors, actor_options, kill_actors
    from trinity.sync import Synchronizer

    if (runs(config, "explorer") and config.mode not in ("bench", "serve")) or trains_on_pipeline_output(
        config
    ):
        from trinity.data.tasks import apply_task_pipeline
        from trinity.serving.auxiliary import ServedModels

        try:
            # Before any actor starts: the pipeline's output is the explorer's taskset (or the
            # dataset an SFT/DPO train job reads); the auxiliary models its operators ask for are
            # served here and stopped afterwards.
            with ServedModels(config.explorer.auxiliary_models) as served:
                config = apply_task_pipeline(config, served)
        except (ValueError, OSError) as exc:
            raise JobFailed(f"data_processor.task_pipeline: {exc}") from None
    if runs(config, "explorer") and config.mode != "bench":
        try:
            check_buffer_is_free(config, config.buffer.cache_dir)
        except ValueError as exc:
            raise JobFailed(str(exc)) from None
    ray = _init_ray(config)
    job_dir = Path(config.checkpoint_job_dir)
    (job_dir / "log").mkdir(parents=True, exist_ok=True)
    start = start or _Start()
    if config.mode == "serve":  # no step loop: serves until stopped (trinity.serving.serve)
        from trinity.serving.serve import run_serve

        start.actors_ready = True  # it starts its own; what it logs is worth keeping
        return run_serve(config)
    synchronizer = Synchronizer.from_config(config.synchronizer)
    total = total_steps(config)
    # One run per role, as Trinity-RFT logs them (the "_explorer" / "_trainer" runs).
    monitors = {role: get_monitors(config, role, total) for role in ("explorer", "trainer")}
    if "console" not in config.monitor.monitor_types():
        # The console progress bar is always on, following the role that paces the job.
        role = "trainer" if runs(config, "trainer") else "explorer"
        monitors[role].monitors.append(get_monitor("console", config, role, total))
    actors = actors or StageActors()
    started: dict[str, tuple[Any, dict[str, Any]]] = {}  # role -> (actor, its Ray options)
    result: StageResult | None = None
    gpus = 0.0
    loop: StepLoop | None = None
    interrupted = False
    _INTERRUPTED.clear()
    _stopped_by(signal.SIGINT)
    previous_handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    queue_job = None
    try:
        queue_job = _join_queue(config)
        gpus = ray.cluster_resources().get("GPU", 0)
        # A user's OMP_NUM_THREADS travels to the actors (above) and wins over our share.
        shares = {} if "OMP_NUM_THREADS" in os.environ else cpu_shares(config, gpus)
        up = []
        for role in ROLES:
            if runs(config, role):
                actor, options, ready = actors.start(
                    ray, config, role, actor_options(config, role, gpus), shares.get(role)
                )
                started[role] = (actor, options)
                up.append(ready)
        explorer, trainer = (started[role][0] if role in started else None for role in ROLES)
        # Construction errors surface here, with the actor named.
        get(ray, up, "starting actors")
        start.actors_ready = True
        if config.mode == "bench":
            metrics = get(ray, explorer.benchmark.remote(), "explorer benchmark")
            monitors["explorer"].log(numbers(metrics), 0)
            result = StageResult(config.name, 0, 0, None, metrics)
            return result
        loop = StepLoop(ray, config, explorer, trainer, synchronizer, monitors, _INTERRUPTED)
        result = loop.run()
        return result
    except KeyboardInterrupt:
        interrupted = True
        raise
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
        # A stage that ended well may hand its actors to the next (trinity.stage_actors).
        ended_well = result is not None and not result.shortfall
        killed = kill_actors(
            ray,
            [
                (actor, options)
                for role, (actor, options) in started.items()
                if not (ended_well and actors.keep(config, role, actor, options, gpus))
            ],
        )
        if interrupted and loop is not None and loop.reader_position:
            _release_unfinished_reads(config, loop.reader_position)
        if queue_job is not None:
            _leave_queue(config, queue_job)
        end_stage(ray, config, more_stages, actor_names=killed)


def _join_queue(config: Config) -> str | None:
    """Record this job as a user of its ``queue`` buffer; returns the job's id (``None``: no
    queue). The queue is a detached actor: see :func:`trinity.buffer.factory.leave_queue`."""
    import uuid

    from trinity.buffer.factory import join_queue, start_queue
    from trinity.config.resolve import joins_cluster

    if not joins_cluster(config):
        # A Ray of this job's own: its end removes every actor anyway. Start the queue now, so
        # that its process starts while the explorer and trainer load their models.
        if config.mode in ("both", "explore", "train", "colocate"):
            start_queue(config)
        return None
    job_id = uuid.uuid4().hex
    return job_id if join_queue(config, job_id) else None


def _leave_queue(config: Config, job_id: str) -> None:
    """This job no longer uses its queue (the last job to leave removes it)."""
    from trinity.buffer.factory import leave_queue

    try:
        line = leave_queue(config, job_id)
    except Exception as exc:  # the job is ending anyway: say so, do not mask its outcome
        report.queue_not_released(exc)
        return
    if line:
        report.queue_left(line)


def _release_unfinished_reads(config: Config, position: dict[str, Any]) -> None:
    """After an interrupt: make the experiences the trainer read for the step it did not
    finish unread again (they were never trained on)."""
    from trinity.buffer.factory import release_reads_after

    try:
        released = release_reads_after(config, position)
    except Exception as exc:  # the job is stopping anyway: say so, do not mask the interrupt
        report.reads_not_given_back(exc)
        return
    if released:
        report.reads_given_back(released)


# Set by Ctrl-C / SIGTERM during a stage. The handler also raises KeyboardInterrupt, but a raise
# can be lost: the signal may land while the main thread runs a Python callback from Ray's C++
# core, where an exception is printed and dropped (ray-project/ray#7734 is one such case). Once
# in the test suite a Ctrl-C was lost that way and the job ran on to its last step. The step
# loop (StepLoop's ``interrupted``) checks this flag, so a lost raise still stops the job at
# the next step.
_INTERRUPTED = threading.Event()


# The signal that stopped the stage: recorded in run_status.json and the exit code (128 + it).
# SIGINT also stands for a KeyboardInterrupt raised before the handlers were installed.
_stop_signal = signal.SIGINT


def _stopped_by(signum: int) -> None:
    global _stop_signal
    _stop_signal = signal.Signals(signum)


def _interrupt(signum: int = signal.SIGINT, *_: Any) -> None:
    _stopped_by(signum)
    _INTERRUPTED.set()
    raise KeyboardInterrupt
