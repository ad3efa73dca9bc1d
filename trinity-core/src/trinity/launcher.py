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

# Each stage is resolved anew from the user's keys (config.resolve is the one place that derives).
from trinity.config.resolve import stage_configs, start_from

if TYPE_CHECKING:
    from collections.abc import Callable

    from trinity.config import Config
    from trinity.sync import WeightTransport

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
    shortfall: str | None = None  # what the stage did not do that it was asked to


def run(config: Config) -> int:
    """Run all stages of ``config``; return the process exit code."""
    _setup_driver_logging()
    previous_checkpoint: str | None = None
    stages = stage_configs(config)
    for index, stage in enumerate(stages):
        if previous_checkpoint is not None:
            # Each stage starts from the weights the previous one ended with.
            stage = start_from(stage, previous_checkpoint)
        label = stage.name if len(stages) > 1 else config.name
        print(f"[trinity] stage {index + 1}/{len(stages)}: {label} (mode {stage.mode})", flush=True)
        try:
            result = run_stage(stage)
        except KeyboardInterrupt as exc:
            print("[trinity] interrupted; actors stopped.", file=sys.stderr)
            _print_notes(exc)
            return 128 + _stop_signal  # EXIT_INTERRUPTED (130) for Ctrl-C, 143 for SIGTERM
        except JobFailed as exc:
            print(f"[trinity] job failed: {exc}", file=sys.stderr)
            _print_notes(exc)
            return EXIT_FAILED
        if result.shortfall:
            if index + 1 < len(stages):
                print("[trinity] later stages not run: this one fell short", file=sys.stderr)
            return EXIT_FAILED
        previous_checkpoint = result.final_checkpoint or previous_checkpoint
    return EXIT_OK


def _print_notes(exc: BaseException) -> None:
    for note in getattr(exc, "__notes__", ()):
        print(f"[trinity] {note}", file=sys.stderr, flush=True)


def _setup_driver_logging() -> None:
    if not logging.getLogger("trinity").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[trinity] %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("trinity").addHandler(handler)
        logging.getLogger("trinity").setLevel(logging.INFO)


def _init_ray(config: Config) -> Any:
    """Connect to Ray for ``config`` (:func:`trinity.cluster.connect`); a cluster that cannot be
    used fails the job with its one-line reason."""
    from trinity.cluster import ClusterError, connect

    try:
        return connect(config)
    except ClusterError as exc:
        raise JobFailed(str(exc)) from None


def run_stage(config: Config) -> StageResult:
    """Run one stage (one resolved config) to completion, recording its status in
    ``<job dir>/run_status.json`` (:mod:`trinity.run_status`)."""
    from trinity.run_status import write_run_status
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
    start = _Start()
    if config.mode == "bench":
        return _run_stage(config, start)  # it evaluates another run's folder: that run's status stands
    job_dir = config.checkpoint_job_dir
    created = _first_missing(job_dir, config.checkpoint_root_dir)
    write_run_status(job_dir, "running")
    save_config(config)
    try:
        with _trainer_job_heartbeat(config):
            result = _run_stage(config, start)
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
    shutil.rmtree(job_dir, ignore_errors=True)
    folder = job_dir.parent
    while folder != created.parent and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()  # the empty parents this start made (project, name of a staged job)
        folder = folder.parent
    exc.add_note(f"{job_dir} removed: this start stopped before its actors were up (nothing to keep)")


def _run_stage(config: Config, start: _Start | None = None) -> StageResult:
    from trinity.actors import ExplorerActor, TrainerActor
    from trinity.buffer.factory import check_buffer_is_free
    from trinity.monitor import get_monitor, get_monitors
    from trinity.placement import actor_resources, cpu_shares, runs
    from trinity.sync import Synchronizer

    if runs(config, "explorer") and config.mode not in ("bench", "serve"):
        from trinity.data.tasks import apply_task_pipeline
        from trinity.serving.auxiliary import ServedModels

        try:
            # Before any actor starts: the pipeline's output is the explorer's taskset; the
            # auxiliary models its operators ask for are served here and stopped afterwards.
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
    actors: list[Any] = []
    loop: _StepLoop | None = None
    interrupted = False
    _INTERRUPTED.clear()
    _stopped_by(signal.SIGINT)
    previous_handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    queue_job = None
    try:
        explorer = trainer = None
        queue_job = _join_queue(config)
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
        start.actors_ready = True
        if config.mode == "bench":
            metrics = _get(ray, explorer.benchmark.remote(), "explorer benchmark")
            _log(monitors["explorer"], metrics, 0)
            return StageResult(config.name, 0, 0, None, metrics)
        loop = _StepLoop(ray, config, explorer, trainer, synchronizer, monitors)
        return loop.run()
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
        for actor in actors:
            with contextlib.suppress(Exception):  # the actor may already be gone
                ray.kill(actor)
        if interrupted and loop is not None and loop.reader_position:
            _release_unfinished_reads(config, loop.reader_position)
        if queue_job is not None:
            _leave_queue(config, queue_job)
        ray.shutdown()


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
        print(f"[trinity] could not release the queue buffer: {exc}", file=sys.stderr)
        return
    if line:
        print(f"[trinity] {line}", flush=True)


def _release_unfinished_reads(config: Config, position: dict[str, Any]) -> None:
    """After an interrupt: make the experiences the trainer read for the step it did not
    finish unread again (they were never trained on)."""
    from trinity.buffer.factory import release_reads_after

    try:
        released = release_reads_after(config, position)
    except Exception as exc:  # the job is stopping anyway: say so, do not mask the interrupt
        print(f"[trinity] could not give back the unfinished step's experiences: {exc}", file=sys.stderr)
        return
    if released:
        print(f"[trinity] {released} experiences read for the unfinished train step are unread again")


# Set by Ctrl-C / SIGTERM during a stage. The handler also raises KeyboardInterrupt, but a raise
# can be lost: the signal may land while the main thread runs a Python callback from Ray's C++
# core, where an exception is printed and dropped (ray-project/ray#7734 is one such case). Once
# in the test suite a Ctrl-C was lost that way and the job ran on to its last step. The step
# loop checks this flag, so a lost raise still stops the job at the next step.
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


def _check_interrupted() -> None:
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


def _get(ray: Any, refs: Any, doing: str) -> Any:
    from trinity.sync.transport import get_result

    return get_result(ray, refs, doing, JobFailed)


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics (a step's result may also carry a failure line or a reader state)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _log(monitor: Any, metrics: dict[str, Any], step: int) -> None:
    monitor.log(_numbers(metrics), step)


def total_steps(config: Config) -> int | None:
    """Steps to run: ``buffer.total_steps``, else ``trainer.total_steps``, else until the data ends."""
    total = config.buffer.total_steps or getattr(config.trainer, "total_steps", None)
    return int(total) if total else None


def _eval_due(config: Config, explorer_step: int) -> bool:
    interval = config.explorer.eval_interval
    return bool(interval) and explorer_step > 0 and explorer_step % interval == 0


def _wait_report_s() -> float:
    """Seconds between the console lines of a wait (``TRINITY_WAIT_REPORT_S``, default 60)."""
    try:
        return max(0.1, float(os.environ.get("TRINITY_WAIT_REPORT_S", "60")))
    except ValueError:
        return 60.0


# Key of the trainer actor's buffer read position in a step's result (a dict, never logged).
READER_POSITION_KEY = "_reader_position"


class _StepLoop:
    """Steps explorer and trainer concurrently, syncing weights as the synchronizer decides.

    Who waits for what in each ``synchronizer.sync_style`` is documented in
    :mod:`trinity.sync.synchronizer`; this loop carries it out. Two rules of its own keep it
    free of deadlocks: a weight sync runs only while neither actor is in a step (each actor runs
    one call at a time, so a sync would queue behind a step), and trainer step ``t`` starts only
    once the explorer finished the step whose experiences it reads (before that it could only
    block in its read, holding up a sync the explorer waits for).

    Explore-only stages (``trainer`` is ``None``) load the newest checkpoint a separate trainer
    job wrote to the job dir at the style's sync points (``sync_method: checkpoint``); train-only
    stages (``explorer`` is ``None``) save one for such a job every ``trainer_sync_interval``
    steps.

    Everything the console shows about a running stage comes from here: one line per explore
    step whose tasks failed (count and first error), a line while anything waits longer than
    :func:`_wait_report_s` (who waits for what), and the closing line, which says ``done`` only
    when the stage trained the steps it was asked for. An eval due at explorer step ``N`` runs
    once the explorer holds the weights of trainer step ``N`` (explore-only: at once), and is
    logged at step ``N`` with the version it measured (``eval/model_version``).
    """

    def __init__(
        self,
        ray: Any,
        config: Config,
        explorer: Any,
        trainer: Any,
        synchronizer: Any,
        monitors: dict[str, Any],
    ) -> None:
        self.ray, self.config = ray, config
        self.explorer, self.trainer = explorer, trainer
        self.synchronizer, self.monitors = synchronizer, monitors
        self.explorer_step = self.explorer_version = self.trainer_step = 0
        self.first_explorer_step = 0  # where this stage's explorer started (> 0: resumed)
        self.empty_train_steps = 0
        self.failed_streak: list[int] = []
        self.pending_evals: list[int] = []
        self.last_metrics: dict[str, float] = {}
        # The trainer's buffer position after its last finished step: rows read after it are
        # given back when the job is interrupted mid-step.
        self.reader_position: dict[str, Any] | None = None
        # What the explorer waits for when it is between steps and not running (a decision).
        self.explorer_wait: Any = None
        # Explore-only: when each needed checkpoint was first waited for; targets given up on.
        self.checkpoint_wait_since: dict[int, float] = {}
        self.checkpoint_given_up: set[int] = set()
        # The reasons already said for exploring on without a wait; what the last wait waited on.
        self.said_go_on: set[str] = set()
        self.checkpoint_wait_why = ""
        self.weights: WeightTransport | None = None
        self.checkpoint_sync = config.synchronizer.sync_method == "checkpoint"
        self.geometry = config.geometry
        # Train-only with sync_method nccl (both jobs on one Ray cluster): the broadcast group
        # with the explorer job's explorer actor, found by name in the run's namespace.
        self.peer_sync: WeightTransport | None = None
        # "not found" (not looked for yet), "waiting" (said so once), "open" or "gone" (that job ended)
        self.peer_state = "not found"

    def get(self, ref: Any, doing: str) -> Any:
        return _get(self.ray, ref, doing)

    def run(self) -> StageResult:
        ray, config, explorer, trainer = self.ray, self.config, self.explorer, self.trainer
        if explorer is not None:
            self.explorer_step = self.get(explorer.current_step.remote(), "explorer")
            self.explorer_version = self.get(explorer.model_version.remote(), "explorer")
            self.first_explorer_step = self.explorer_step
        if trainer is not None:
            self.trainer_step = self.get(trainer.current_step.remote(), "trainer")
            self.reader_position = self.get(trainer.reader_position.remote(), "trainer")
        if (
            (explorer is None or trainer is None)
            and not self.checkpoint_sync
            and not self.cross_job_nccl
            and sync_method_set_for(config)
        ):
            other = "trainer" if trainer is None else "explorer"
            logger.warning(
                "synchronizer.sync_method %s: this %s-only stage exchanges no weights with the %s job "
                "(only sync_method checkpoint does, through %s)",
                config.synchronizer.sync_method,
                "explore" if trainer is None else "train",
                other,
                config.checkpoint_job_dir,
            )
        total = total_steps(config)
        explore_ref = train_ref = None
        explorer_done, trainer_done = explorer is None, trainer is None
        start = time.monotonic()
        weights = self.weights = _open_weight_sync(ray, config, explorer, trainer)
        if explorer is not None and config.explorer.eval_on_startup and self.explorer_step == 0:
            self.eval(0)

        waiting_since = time.monotonic()
        while not (explorer_done and trainer_done):
            _check_interrupted()
            if not explorer_done and explore_ref is None:
                if total is not None and self.explorer_step >= total:
                    explorer_done = True
                    self.get(explorer.finish.remote(), "explorer finish")
                else:
                    run = self.explorer_may_run(train_ref is not None, trainer_done)
                    self.run_due_evals()
                    if run:
                        explore_ref = explorer.explore_step.remote()
            if not trainer_done and train_ref is None:
                if total is not None and self.trainer_step >= total:
                    trainer_done = True
                elif self.trainer_may_run(explorer_done):
                    train_ref = trainer.train_step.remote()
            pending = [r for r in (explore_ref, train_ref) if r is not None]
            if not pending:
                if trainer is None and self.explorer_wait is not None:
                    # Explore-only: poll for the other job's checkpoint (or broadcast).
                    time.sleep(min(1.0, _wait_report_s()))
                    if time.monotonic() - waiting_since >= _wait_report_s():
                        self.report_wait(None, None, explorer_done, time.monotonic() - waiting_since)
                        waiting_since = time.monotonic()
                    continue
                if not (explorer_done and trainer_done):
                    raise JobFailed(
                        f"explorer (step {self.explorer_step}) and trainer (step {self.trainer_step}) wait "
                        f"for each other: {getattr(self.explorer_wait, 'reason', 'no reason')}; one train "
                        "step takes more explore steps than the synchronizer lets the explorer run "
                        "ahead (raise synchronizer.sync_offset)"
                    )
                continue
            ready, _ = ray.wait(pending, num_returns=1, timeout=_wait_report_s())
            if not ready:
                self.report_wait(explore_ref, train_ref, explorer_done, time.monotonic() - waiting_since)
                continue
            waiting_since = time.monotonic()
            if explore_ref is not None and explore_ref in ready:
                metrics = self.get(explore_ref, "explorer step")
                explore_ref = None
                if metrics is None:  # taskset exhausted
                    explorer_done = True
                    self.get(explorer.finish.remote(), "explorer finish")
                else:
                    self.explored(metrics)
            if train_ref is not None and train_ref in ready:
                metrics = self.get(train_ref, "trainer step")
                train_ref = None
                if metrics is None:  # no more experiences will come
                    trainer_done = True
                else:
                    self.trained(metrics)
        final_checkpoint = None
        if trainer is not None:
            final_checkpoint = self.get(trainer.finish.remote(), "trainer finish")
        # Evaluate the final weights when an eval is still owed, or the last step had none.
        final_eval = config.explorer.eval_interval and (
            self.pending_evals or not _eval_due(config, self.explorer_step)
        )
        if weights is not None and final_checkpoint and final_eval:
            self.sync_weights("final")
            self.pending_evals.clear()
            self.eval(self.explorer_step)
        if weights is not None:
            _sync(weights.close)  # a later stage (new actors) opens a transport of its own
        if self.peer_sync is not None:
            with contextlib.suppress(Exception):  # the explorer job may have ended first
                self.peer_sync.close()
        return self.finish(total, final_checkpoint, time.monotonic() - start)

    @property
    def cross_job_nccl(self) -> bool:
        """A job of a decoupled pair with ``sync_method: nccl``: the train job broadcasts to the
        explore job's explorer actor (both on one Ray cluster; the config check ensures it)."""
        return self.config.synchronizer.sync_method == "nccl" and (self.explorer is None) != (
            self.trainer is None
        )

    def broadcast_to_explorer_job(self) -> None:
        """Train-only, ``sync_method: nccl``: broadcast the current weights to the explorer job's
        explorer actor (the broadcast waits for its explore step in flight). Before that job's
        actor exists, and after it ended, the weights are not sent (said once each)."""
        from trinity.sync import WeightSyncFailed
        from trinity.sync.transport import BroadcastTransport

        config, sync = self.config, self.config.synchronizer
        if self.peer_state == "gone":
            return
        if self.peer_sync is None:
            try:
                peer = self.ray.get_actor(config.explorer.name, namespace=config.ray_namespace)
            except ValueError:
                if self.peer_state == "not found":
                    print(
                        f"[trinity] trainer step {self.trainer_step}: no explorer job of this run on the "
                        f"cluster yet (actor {config.explorer.name!r} in namespace {config.ray_namespace!r}); "
                        "weights are broadcast once it is there",
                        flush=True,
                    )
                    self.peer_state = "waiting"
                return
            transport = BroadcastTransport(self.ray, peer, self.trainer, sync.sync_timeout)
            try:
                why = transport.open()
            except WeightSyncFailed as exc:
                raise JobFailed(f"weight sync with the explorer job: {exc}") from exc
            logger.info("sync_method nccl with the explorer job: %s", why)
            self.peer_sync, self.peer_state = transport, "open"
        try:
            version = self.peer_sync.sync()
        except WeightSyncFailed as exc:
            if "an actor died" not in str(exc):
                raise JobFailed(f"weight sync with the explorer job: {exc}") from exc
            self.peer_state, self.peer_sync = "gone", None
            print(
                f"[trinity] trainer step {self.trainer_step}: the explorer job has ended; no more weights "
                "are sent",
                flush=True,
            )
            return
        print(
            f"[trinity] trainer step {self.trainer_step}: broadcast version {version} to the explorer job",
            flush=True,
        )

    # -- who may start a step ------------------------------------------------------------------

    def explorer_may_run(self, trainer_busy: bool, trainer_done: bool) -> bool:
        """Ask the synchronizer (syncing as it says) whether the explorer starts its next step."""
        self.explorer_wait = None
        if self.trainer is None:
            return self.broadcast_may_run() if self.cross_job_nccl else self.checkpoint_may_run()
        if trainer_done:
            # No more versions will come: load the last one once, never wait.
            if self.trainer_step > self.explorer_version:
                self.sync_weights("the trainer finished")
            return True
        for _ in range(2):  # a sync is followed by one more question
            decision = self.synchronizer.explorer_decision(
                self.explorer_step, self.trainer_step, self.explorer_version, trainer_busy
            )
            if decision.action == "sync":
                self.sync_weights(decision.reason)
                continue
            if decision.action == "wait":
                self.explorer_wait = decision
                return False
            return True
        return True

    def trainer_may_run(self, explorer_done: bool) -> bool:
        """Trainer step ``t + 1`` starts once the explore step it reads has finished (or no more
        will come), unless the synchronizer holds the trainer (``trainer_driven``). Started
        earlier it would only sit in its read, and a trainer in a step cannot sync."""
        if self.explorer is None or explorer_done:
            return True
        needed = self.geometry.explore_steps_through(self.trainer_step + 1)
        if self.explorer_step < needed:
            return False
        return not self.synchronizer.trainer_holds(self.trainer_step, self.explorer_version)

    def sync_weights(self, why: str) -> None:
        """Move the trainer's current weights to the explorer (both are between steps)."""
        before = self.explorer_version
        self.explorer_version = _sync(self.weights.sync)
        # Debug: on-policy this happens every step, and the console's progress line says enough.
        logger.debug(
            "synced weights version %d -> %d (explorer step %d, trainer step %d): %s",
            before,
            self.explorer_version,
            self.explorer_step,
            self.trainer_step,
            why,
        )

    def broadcast_may_run(self) -> bool:
        """Explore-only with ``sync_method: nccl``: the train job broadcasts its weights into this
        job's explorer actor between explore steps. Report each new version; in ``fixed`` style
        wait at sync steps for the needed one, at most ``synchronizer.sync_timeout`` seconds."""
        from trinity.sync.synchronizer import SyncDecision

        version = self.get(self.explorer.model_version.remote(), "explorer")
        if version != self.explorer_version:
            self.explorer_version = version
            print(
                f"[trinity] explorer step {self.explorer_step}: holds the train job's broadcast weights "
                f"(model version {version})",
                flush=True,
            )
            self.monitors["explorer"].log({"sync/model_version": float(version)}, self.explorer_step)
        sync = self.synchronizer
        if sync.sync_style != "fixed" or not sync.is_sync_step(self.explorer_step):
            return True
        target = self.explorer_step - sync.sync_offset
        if version >= target or target in self.checkpoint_given_up:
            return True
        since = self.checkpoint_wait_since.setdefault(target, time.monotonic())
        timeout = self.config.synchronizer.sync_timeout
        if time.monotonic() - since < timeout:
            self.explorer_wait = SyncDecision("wait", target, f"sync step: needs version {target}")
            return False
        self.checkpoint_given_up.add(target)
        print(
            f"[trinity] explorer step {self.explorer_step}: no broadcast of version {target} from the train "
            f"job after {timeout}s (synchronizer.sync_timeout); exploring on with model version {version}",
            file=sys.stderr,
            flush=True,
        )
        return True

    def checkpoint_may_run(self) -> bool:
        """Explore-only: load the other job's newest checkpoint at the style's sync points. In
        ``fixed`` style a sync step waits for the checkpoint it needs while a train job of this
        run is running (its heartbeat in the job dir, :mod:`trinity.sync.trainer_job`), at most
        ``synchronizer.sync_timeout`` seconds; a train job that is gone (killed) is given
        :data:`~trinity.sync.trainer_job.GONE_GRACE_S` to be restarted. Without a train job it
        never waits (explore-then-train: nothing would come). A wait starts with one console
        line saying what it waits for, another when that changes, and one when it ends without
        the checkpoint."""
        if not self.checkpoint_sync:
            return True
        from trinity.sync.trainer_job import checkpoint_wait, read_trainer_job
        from trinity.trainer.checkpoint import find_latest_checkpoint

        job_dir = self.config.checkpoint_job_dir
        found = find_latest_checkpoint(job_dir)
        latest, path = found if found else (0, None)
        # A restarted explorer (its first step here, past a sync point) holds the initial weights.
        resumed = 0 < self.explorer_step == self.first_explorer_step
        decision = self.synchronizer.checkpoint_decision(
            self.explorer_step, latest, self.explorer_version, resumed=resumed
        )
        if decision.action == "sync":
            self.checkpoint_wait_since.pop(decision.version, None)
            self.explorer_version = self.get(
                self.explorer.load_checkpoint.remote((path, latest)), "explorer checkpoint load"
            )
            print(
                f"[trinity] explorer step {self.explorer_step}: loaded the trainer job's checkpoint "
                f"{path} (model version {self.explorer_version})",
                flush=True,
            )
            self.monitors["explorer"].log(
                {"sync/model_version": float(self.explorer_version)}, self.explorer_step
            )
            return True
        if decision.action != "wait" or decision.version in self.checkpoint_given_up:
            return True
        target, step = decision.version, self.explorer_step
        timeout = self.config.synchronizer.sync_timeout
        since = self.checkpoint_wait_since.get(target)
        waited = 0.0 if since is None else time.monotonic() - since
        trainer = read_trainer_job(job_dir)
        verdict = checkpoint_wait(trainer, waited, timeout)
        if verdict.action == "go_on":
            self.checkpoint_given_up.add(target)
            self.checkpoint_wait_since.pop(target, None)
            if since is not None or trainer.state not in self.said_go_on:
                # Said at the end of every wait; without one, once per reason (an explore job
                # on its own would say it at every sync step).
                self.said_go_on.add(trainer.state)
                print(
                    f"[trinity] explorer step {step}: no checkpoint of trainer step {target} in "
                    f"{job_dir}: {verdict.why}; exploring on with model version {self.explorer_version}",
                    file=sys.stderr if since is not None else sys.stdout,
                    flush=True,
                )
            return True
        if since is None:
            self.checkpoint_wait_since[target] = time.monotonic()
            print(
                f"[trinity] explorer step {step}: waits for the trainer job's checkpoint of step "
                f"{target} in {job_dir} ({verdict.why}; newest is step {latest}; at most "
                f"{timeout}s, synchronizer.sync_timeout)",
                flush=True,
            )
        elif verdict.why != self.checkpoint_wait_why:
            print(
                f"[trinity] explorer step {step}: still waits for the checkpoint of trainer step "
                f"{target}: {verdict.why}",
                flush=True,
            )
        self.checkpoint_wait_why = verdict.why
        self.explorer_wait = decision
        return False

    # -- per-step bookkeeping ------------------------------------------------------------------

    def explored(self, metrics: dict[str, Any]) -> None:
        from trinity.explorer.explorer import FAILURES_KEY

        self.explorer_step += 1
        step = self.explorer_step
        # Staleness: the experiences of explorer step e are trained by trainer step
        # ceil(e / steps-per-batch), which starts from version (that step - 1); the lag is how
        # many trainer updates the weights that produced them are behind (0 = on-policy).
        version = metrics.get("rollout/model_version", self.explorer_version)
        trained_by = self.geometry.train_step_reading(step)
        metrics["rollout/model_version_lag"] = float(max(0, trained_by - 1 - int(version)))
        _log(self.monitors["explorer"], metrics, step)
        self.last_metrics.update(_numbers(metrics))
        report = metrics.get(FAILURES_KEY)
        if report:
            log_file = Path(self.config.checkpoint_job_dir) / "log" / f"{self.config.explorer.name}.log"
            print(f"[trinity] explorer step {step}: {report} (tracebacks in {log_file})", flush=True)
        if metrics.get("rollout/num_experiences", 1) == 0:
            self.failed_streak.append(step)
        else:
            self.failed_streak.clear()
        limit = self.config.explorer.max_consecutive_failed_steps
        if limit and len(self.failed_streak) >= limit:
            first, last = self.failed_streak[0], self.failed_streak[-1]
            raise JobFailed(
                f"explore steps {first}-{last} gave no experience ({limit} in a row, "
                f"explorer.max_consecutive_failed_steps): {report or 'every task gave none'}"
            )
        if _eval_due(self.config, step):
            self.pending_evals.append(step)
            if self.trainer is None:
                self.run_due_evals()

    def trained(self, metrics: dict[str, Any]) -> None:
        self.trainer_step += 1
        self.reader_position = metrics.pop(READER_POSITION_KEY, self.reader_position)
        if metrics.get("trainer/empty_step"):
            self.empty_train_steps += 1
        if (
            self.explorer is None
            and self.checkpoint_sync
            and self.synchronizer.is_publish_step(self.trainer_step)
        ):
            # Train-only: publish the weights for the explorer job (sync_method checkpoint).
            path, version = self.get(self.trainer.save_weights.remote(), "trainer checkpoint save")
            logger.info(
                "trainer step %d: saved %s for the explorer job (version %d)",
                self.trainer_step,
                path,
                version,
            )
        if (
            self.explorer is None
            and self.cross_job_nccl
            and self.synchronizer.is_publish_step(self.trainer_step)
        ):
            self.broadcast_to_explorer_job()
        _log(self.monitors["trainer"], metrics, self.trainer_step)
        self.last_metrics.update(_numbers(metrics))

    def run_due_evals(self) -> None:
        """Run the evals owed at steps whose weights the explorer now holds."""
        while self.pending_evals and (self.trainer is None or self.explorer_version >= self.pending_evals[0]):
            self.eval(self.pending_evals.pop(0))

    def eval(self, step: int) -> None:
        metrics = self.get(self.explorer.eval.remote(), "explorer eval")
        _log(self.monitors["explorer"], metrics, step)
        # The console bar follows the trainer when there is one: it shows the last eval too.
        for role, monitor in self.monitors.items():
            if role != "explorer":
                for console in getattr(monitor, "monitors", ()):
                    if hasattr(console, "log_eval"):
                        console.log_eval(_numbers(metrics), step)

    def report_wait(self, explore_ref: Any, train_ref: Any, explorer_done: bool, seconds: float) -> None:
        """One console line saying who waits for what, while nothing finishes."""
        parts = []
        wait = self.explorer_wait
        if explore_ref is not None:
            parts.append(f"explorer step {self.explorer_step + 1} is running its tasks")
        elif not explorer_done and self.trainer is None and wait is not None and self.cross_job_nccl:
            parts.append(
                f"the explorer waits for the train job's broadcast of version {wait.version} "
                f"(synchronizer.sync_timeout {self.config.synchronizer.sync_timeout}s; holds model "
                f"version {self.explorer_version})"
            )
        elif not explorer_done and self.trainer is None and wait is not None:
            parts.append(
                f"the explorer waits for the trainer job's checkpoint of step {wait.version} in "
                f"{self.config.checkpoint_job_dir} (synchronizer.sync_timeout "
                f"{self.config.synchronizer.sync_timeout}s; holds model version {self.explorer_version})"
            )
        elif not explorer_done and self.trainer is not None:
            step = wait.version if wait is not None else self.trainer_step + 1
            parts.append(f"the explorer waits for trainer step {step} to sync weights")
        if train_ref is not None:
            parts.append(
                f"trainer step {self.trainer_step + 1} is running (it trains once the explorer's "
                "experiences for it are written)"
            )
        print(f"[trinity] waiting {seconds:.0f}s: " + "; ".join(parts), flush=True)

    def finish(self, total: int | None, final_checkpoint: str | None, elapsed: float) -> StageResult:
        """The closing line: ``done`` only when the trainer trained every step asked for."""
        short = []
        if self.trainer is not None:
            asked = (
                total if total is not None else (self.explorer_step if self.explorer is not None else None)
            )
            if asked is not None and self.trainer_step < asked:
                short.append(
                    f"the trainer stopped after {self.trainer_step} of {asked} steps (no more experiences)"
                )
            if self.empty_train_steps:
                short.append(
                    f"{self.empty_train_steps} of {self.trainer_step} train steps had no experience "
                    "(every task of their explore step failed)"
                )
        summary = f"{self.trainer_step} train steps, {self.explorer_step} explore steps in {elapsed:.0f}s" + (
            f"; final weights {final_checkpoint}" if final_checkpoint else ""
        )
        from trinity.monitor.console import end_progress_bars

        end_progress_bars()  # the closing line comes after the bar's final state, on its own line
        if short:
            print(f"[trinity] finished short: {'; '.join(short)}. {summary}", file=sys.stderr, flush=True)
        else:
            print(f"[trinity] done: {summary}", flush=True)
        return StageResult(
            self.config.name,
            self.trainer_step,
            self.explorer_step,
            final_checkpoint,
            self.last_metrics,
            "; ".join(short) or None,
        )


def sync_method_set_for(config: Config) -> bool:
    """Whether ``synchronizer.sync_method`` is meant for this stage. A stage of a staged job has
    the job's synchronizer (stages cannot set one), which is there for the stages that run
    explorer and trainer together: in a train-only warm-up before them it is no mistake."""
    return not getattr(config, "_sync_for_other_stages", False)


def _open_weight_sync(ray: Any, config: Config, explorer: Any, trainer: Any) -> WeightTransport | None:
    """The stage's weight transport (``synchronizer.sync_method``), opened; ``None`` unless the
    stage runs both explorer and trainer. What it chose (``nccl``: the backend) is logged once."""
    if explorer is None or trainer is None:
        return None
    from trinity.sync import make_transport

    sync = config.synchronizer
    transport = _sync(make_transport, sync.sync_method, ray, explorer, trainer, sync.sync_timeout)
    chosen = _sync(transport.open)
    if chosen:
        logger.info("sync_method %s: %s", transport.method, chosen)
    return transport


def _sync(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``: a weight transport's ``open`` / ``sync`` / ``close``; its failure (which
    names every side's error) fails the job."""
    from trinity.sync import WeightSyncFailed

    try:
        return call(*args)
    except WeightSyncFailed as exc:
        raise JobFailed(str(exc)) from exc
