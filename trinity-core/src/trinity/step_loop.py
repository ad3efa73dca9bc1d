"""The step loop: one stage's explore steps, train steps, weight syncs and evals, in order.

:class:`StepLoop` drives a stage's explorer and trainer actors (either may be absent: an
explore-only or train-only stage of a decoupled pair) until both are done. It decides nothing
about weights itself: whether the explorer runs, waits or syncs is the
:class:`~trinity.sync.Synchronizer`'s answer (and, for an explore-only stage,
:class:`~trinity.sync.explore_job.ExploreJobSync`'s); the loop performs it (actor calls, the
stage's weight transport, the checkpoint folder) and prints through :mod:`trinity.report`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity import report
from trinity.job import ExploreStepResult, JobFailed, StageResult, TrainStepResult
from trinity.monitor.base import histogram_metrics
from trinity.sync.stage_weights import ExplorerJobBroadcast, open_weight_sync, sync_or_fail

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.sync import Synchronizer, WeightTransport

# The launcher's logger: its console lines (``[trinity] INFO trinity.launcher: ...``) stay as they were.
logger = logging.getLogger("trinity.launcher")


def total_steps(config: Config) -> int | None:
    """Steps to run: ``buffer.total_steps``, else ``trainer.total_steps``, else until the data ends."""
    total = config.buffer.total_steps or getattr(config.trainer, "total_steps", None)
    return int(total) if total else None


def sync_method_set_for(config: Config) -> bool:
    """Whether ``synchronizer.sync_method`` is meant for this stage. A stage of a staged job has
    the job's synchronizer (stages cannot set one), which is there for the stages that run
    explorer and trainer together: in a train-only warm-up before them it is no mistake."""
    return not getattr(config, "_sync_for_other_stages", False)


def wait_report_s() -> float:
    """Seconds between the console lines of a wait (``TRINITY_WAIT_REPORT_S``, default 60)."""
    try:
        return max(0.1, float(os.environ.get("TRINITY_WAIT_REPORT_S", "60")))
    except ValueError:
        return 60.0


def get(ray: Any, refs: Any, doing: str) -> Any:
    """``ray.get``; an actor's failure (or death) fails the job, naming ``doing``."""
    from trinity.sync.transport import get_result

    return get_result(ray, refs, doing, JobFailed)


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a monitor plots: numbers (not flags, not text)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _eval_due(config: Config, explorer_step: int) -> bool:
    interval = config.explorer.eval_interval
    return bool(interval) and explorer_step > 0 and explorer_step % interval == 0


class StepLoop:
    """Steps explorer and trainer concurrently, syncing weights as the synchronizer decides.

    Who waits for what in each ``synchronizer.sync_style`` is documented in
    :mod:`trinity.sync.synchronizer`; this loop carries it out. Two rules of its own keep it
    free of deadlocks: a weight sync runs only while neither actor is in a step (each actor runs
    one call at a time, so a sync would queue behind a step), and trainer step ``t`` starts only
    once the explorer finished the step whose experiences it reads (before that it could only
    block in its read, holding up a sync the explorer waits for).

    Explore-only stages (``trainer`` is ``None``) load the newest checkpoint a separate trainer
    job wrote to the job dir at the style's sync points (``sync_method: checkpoint``), or receive
    its broadcasts (``nccl``); train-only stages (``explorer`` is ``None``) save a checkpoint for
    such a job, or broadcast to it, every ``trainer_sync_interval`` steps.

    The console shows one line per explore step whose tasks failed (count and first error), a
    line while anything waits longer than :func:`wait_report_s` (who waits for what), and the
    closing line, which says ``done`` only when the stage trained the steps it was asked for. An
    eval due at explorer step ``N`` runs once the explorer holds the weights of trainer step
    ``N`` (explore-only: at once), and is logged at step ``N`` with the version it measured.

    ``interrupted`` is set by the launcher's signal handler: the loop stops at its next turn
    even when the handler's ``KeyboardInterrupt`` was lost inside a Ray callback.
    """

    def __init__(
        self,
        ray: Any,
        config: Config,
        explorer: Any,
        trainer: Any,
        synchronizer: Synchronizer,
        monitors: dict[str, Any],
        interrupted: threading.Event | None = None,
    ) -> None:
        from trinity.sync.explore_job import ExploreJobSync

        self.ray, self.config = ray, config
        self.explorer, self.trainer = explorer, trainer
        self.synchronizer, self.monitors = synchronizer, monitors
        self.interrupted = interrupted or threading.Event()
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
        self.explore_job = ExploreJobSync(synchronizer, config.synchronizer.sync_timeout)
        self.weights: WeightTransport | None = None
        self.checkpoint_sync = config.synchronizer.sync_method == "checkpoint"
        # A train-only job publishes its weights for an explore job only where one can feed it
        # while it trains: an explore job writes to an sql or queue buffer, while a job reading
        # files (SFT, DPO rows) trains on what they hold and ends. Publishing there would save a
        # checkpoint every sync interval for nobody (the DPO example: one a step, 30 MB for the
        # tiny model); trainer.save_interval still keeps the run's checkpoints.
        exp = config.buffer.trainer_input.experience_buffer
        reads_files = exp is not None and exp.storage_type == "file"
        self.publishes = explorer is None and not reads_files
        if explorer is None and reads_files and self.checkpoint_sync:
            logger.info(
                "train-only job reading files (%s): no weights are published for an explore job "
                "(none can feed it); checkpoints follow trainer.save_interval",
                exp.path,
            )
        self.geometry = config.geometry
        self.explorer_job: ExplorerJobBroadcast | None = None
        if explorer is None and self.cross_job_nccl:
            self.explorer_job = ExplorerJobBroadcast(ray, config, trainer)

    def get(self, ref: Any, doing: str) -> Any:
        return get(self.ray, ref, doing)

    def run(self) -> StageResult:
        ray, config, explorer, trainer = self.ray, self.config, self.explorer, self.trainer
        if explorer is not None:
            self.explorer_step = self.get(explorer.current_step.remote(), "explorer")
            self.explorer_version = self.get(explorer.model_version.remote(), "explorer")
            self.first_explorer_step = self.explorer_step
        if trainer is not None:
            self.trainer_step = self.get(trainer.current_step.remote(), "trainer")
            self.reader_position = self.get(trainer.reader_position.remote(), "trainer")
        self.warn_unused_sync_method()
        total = total_steps(config)
        explore_ref = train_ref = None
        explorer_done, trainer_done = explorer is None, trainer is None
        start = time.monotonic()
        weights = self.weights = open_weight_sync(ray, config, explorer, trainer)
        if explorer is not None and config.explorer.eval_on_startup and self.explorer_step == 0:
            self.eval(0)

        waiting_since = time.monotonic()
        while not (explorer_done and trainer_done):
            if self.interrupted.is_set():
                raise KeyboardInterrupt
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
                    time.sleep(min(1.0, wait_report_s()))
                    if time.monotonic() - waiting_since >= wait_report_s():
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
            ready, _ = ray.wait(pending, num_returns=1, timeout=wait_report_s())
            if not ready:
                self.report_wait(explore_ref, train_ref, explorer_done, time.monotonic() - waiting_since)
                continue
            waiting_since = time.monotonic()
            if explore_ref is not None and explore_ref in ready:
                explored = self.get(explore_ref, "explorer step")
                explore_ref = None
                if explored is None:  # taskset exhausted
                    explorer_done = True
                    self.get(explorer.finish.remote(), "explorer finish")
                else:
                    self.explored(explored)
            if train_ref is not None and train_ref in ready:
                trained = self.get(train_ref, "trainer step")
                train_ref = None
                if trained is None:  # no more experiences will come
                    trainer_done = True
                else:
                    self.trained(trained)
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
            sync_or_fail(weights.close)  # a later stage (new actors) opens a transport of its own
        if self.explorer_job is not None:
            self.explorer_job.close()
        return self.finish(total, final_checkpoint, time.monotonic() - start)

    def warn_unused_sync_method(self) -> None:
        """A one-role stage whose ``sync_method`` moves no weights to the other job: say so."""
        config = self.config
        if (
            (self.explorer is None or self.trainer is None)
            and not self.checkpoint_sync
            and not self.cross_job_nccl
            and sync_method_set_for(config)
        ):
            other = "trainer" if self.trainer is None else "explorer"
            logger.warning(
                "synchronizer.sync_method %s: this %s-only stage exchanges no weights with the %s job "
                "(only sync_method checkpoint does, through %s)",
                config.synchronizer.sync_method,
                "explore" if self.trainer is None else "train",
                other,
                config.checkpoint_job_dir,
            )

    @property
    def cross_job_nccl(self) -> bool:
        """A job of a decoupled pair with ``sync_method: nccl``: the train job broadcasts to the
        explore job's explorer actor (both on one Ray cluster; the config check ensures it)."""
        return self.config.synchronizer.sync_method == "nccl" and (self.explorer is None) != (
            self.trainer is None
        )

    # -- who may start a step ------------------------------------------------------------------

    def explorer_may_run(self, trainer_busy: bool, trainer_done: bool) -> bool:
        """Ask the synchronizer (syncing as it says) whether the explorer starts its next step."""
        self.explorer_wait = None
        if self.trainer is None:
            return self.broadcast_may_run() if self.cross_job_nccl else self.checkpoint_may_run()
        for _ in range(2):  # a sync is followed by one more question
            decision = self.synchronizer.explorer_decision(
                self.explorer_step, self.trainer_step, self.explorer_version, trainer_busy, trainer_done
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
        self.explorer_version = sync_or_fail(self.weights.sync)
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
        job's explorer actor between explore steps. Report each new version; wait while
        :class:`~trinity.sync.explore_job.ExploreJobSync` says so."""
        version = self.get(self.explorer.model_version.remote(), "explorer")
        if version != self.explorer_version:
            self.explorer_version = version
            report.broadcast_received(self.explorer_step, version)
            self.monitors["explorer"].log({"sync/model_version": float(version)}, self.explorer_step)
        answer = self.explore_job.broadcast_step(self.explorer_step, version, now=time.monotonic())
        if answer.action == "wait":
            self.explorer_wait = answer
            return False
        if answer.note == "gives_up":
            report.explores_without_broadcast(
                self.explorer_step, answer.version, self.config.synchronizer.sync_timeout, version
            )
        return True

    def checkpoint_may_run(self) -> bool:
        """Explore-only with ``sync_method: checkpoint``: load the train job's newest checkpoint,
        wait for it, or explore on, as :class:`~trinity.sync.explore_job.ExploreJobSync` says;
        its news (a wait starts, changes, ends without the checkpoint) is a console line."""
        if not self.checkpoint_sync:
            return True
        from trinity.sync.trainer_job import read_trainer_job
        from trinity.trainer.checkpoint import find_latest_checkpoint

        job_dir, step = self.config.checkpoint_job_dir, self.explorer_step
        found = find_latest_checkpoint(job_dir)
        latest, path = found if found else (0, None)
        answer = self.explore_job.checkpoint_step(
            step,
            latest,
            self.explorer_version,
            # A restarted explorer (its first step here, past a sync point) holds the initial weights.
            resumed=0 < step == self.first_explorer_step,
            trainer_job=lambda: read_trainer_job(job_dir),
            now=time.monotonic(),
        )
        if answer.action == "sync":
            self.explorer_version = self.get(
                self.explorer.load_checkpoint.remote((path, latest)), "explorer checkpoint load"
            )
            report.checkpoint_loaded(step, path, self.explorer_version)
            self.monitors["explorer"].log({"sync/model_version": float(self.explorer_version)}, step)
            return True
        target, why = answer.version, answer.reason
        if answer.note in ("gives_up", "goes_on"):
            report.explores_without_checkpoint(
                step, target, job_dir, why, self.explorer_version, waited=answer.note == "gives_up"
            )
        elif answer.note == "wait_starts":
            report.checkpoint_wait_starts(
                step, target, job_dir, why, latest, self.config.synchronizer.sync_timeout
            )
        elif answer.note == "wait_changes":
            report.checkpoint_wait_changes(step, target, why)
        if answer.action == "wait":
            self.explorer_wait = answer
            return False
        return True

    # -- per-step bookkeeping ------------------------------------------------------------------

    def explored(self, result: ExploreStepResult) -> None:
        self.explorer_step += 1
        step, metrics = self.explorer_step, result.metrics
        # Staleness: the experiences of explorer step e are trained by trainer step
        # ceil(e / steps-per-batch), which starts from version (that step - 1); the lag is how
        # many trainer updates the weights that produced them are behind (0 = on-policy).
        version = metrics.get("rollout/model_version", self.explorer_version)
        trained_by = self.geometry.train_step_reading(step)
        metrics["rollout/model_version_lag"] = float(max(0, trained_by - 1 - int(version)))
        self.monitors["explorer"].log(numbers(metrics), step)
        self.last_metrics.update(numbers(metrics))
        if result.failures:
            log_file = Path(self.config.checkpoint_job_dir) / "log" / f"{self.config.explorer.name}.log"
            report.explore_step_failures(step, result.failures, log_file)
        if metrics.get("rollout/num_experiences", 1) == 0:
            self.failed_streak.append(step)
        else:
            self.failed_streak.clear()
        limit = self.config.explorer.max_consecutive_failed_steps
        if limit and len(self.failed_streak) >= limit:
            first, last = self.failed_streak[0], self.failed_streak[-1]
            raise JobFailed(
                f"explore steps {first}-{last} gave no experience ({limit} in a row, "
                f"explorer.max_consecutive_failed_steps): {result.failures or 'every task gave none'}"
            )
        if _eval_due(self.config, step):
            self.pending_evals.append(step)
            if self.trainer is None:
                self.run_due_evals()

    def trained(self, result: TrainStepResult) -> None:
        self.trainer_step += 1
        self.reader_position = result.reader_position
        metrics = result.metrics
        if metrics.get("trainer/empty_step"):
            self.empty_train_steps += 1
        publishes = self.publishes and self.synchronizer.is_publish_step(self.trainer_step)
        if publishes and self.checkpoint_sync:
            # Train-only: publish the weights for the explorer job (sync_method checkpoint).
            path, version = self.get(self.trainer.save_weights.remote(), "trainer checkpoint save")
            logger.info(
                "trainer step %d: saved %s for the explorer job (version %d)",
                self.trainer_step,
                path,
                version,
            )
        if publishes and self.explorer_job is not None:
            self.explorer_job.broadcast(self.trainer_step)
        # Histograms (the trainer-vs-rollout log-prob difference) go to the monitors that plot them.
        self.monitors["trainer"].log({**numbers(metrics), **histogram_metrics(metrics)}, self.trainer_step)
        self.last_metrics.update(numbers(metrics))

    def run_due_evals(self) -> None:
        """Run the evals owed at steps whose weights the explorer now holds."""
        while self.pending_evals and (self.trainer is None or self.explorer_version >= self.pending_evals[0]):
            self.eval(self.pending_evals.pop(0))

    def eval(self, step: int) -> None:
        metrics = self.get(self.explorer.eval.remote(), "explorer eval")
        self.monitors["explorer"].log(numbers(metrics), step)
        # The console bar follows the trainer when there is one: it shows the last eval too.
        for role, monitor in self.monitors.items():
            if role != "explorer":
                for console in getattr(monitor, "monitors", ()):
                    if hasattr(console, "log_eval"):
                        console.log_eval(numbers(metrics), step)

    def report_wait(self, explore_ref: Any, train_ref: Any, explorer_done: bool, seconds: float) -> None:
        """One console line saying who waits for what, while nothing finishes."""
        parts = []
        wait, sync = self.explorer_wait, self.config.synchronizer
        if explore_ref is not None:
            parts.append(f"explorer step {self.explorer_step + 1} is running its tasks")
        elif not explorer_done and self.trainer is None and wait is not None and self.cross_job_nccl:
            parts.append(
                f"the explorer waits for the train job's broadcast of version {wait.version} "
                f"(synchronizer.sync_timeout {sync.sync_timeout}s; holds model "
                f"version {self.explorer_version})"
            )
        elif not explorer_done and self.trainer is None and wait is not None:
            parts.append(
                f"the explorer waits for the trainer job's checkpoint of step {wait.version} in "
                f"{self.config.checkpoint_job_dir} (synchronizer.sync_timeout "
                f"{sync.sync_timeout}s; holds model version {self.explorer_version})"
            )
        elif not explorer_done and self.trainer is not None:
            step = wait.version if wait is not None else self.trainer_step + 1
            parts.append(f"the explorer waits for trainer step {step} to sync weights")
        if train_ref is not None:
            parts.append(
                f"trainer step {self.trainer_step + 1} is running (it trains once the explorer's "
                "experiences for it are written)"
            )
        report.waiting(seconds, parts)

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
        report.stage_ends(summary, short)
        return StageResult(
            self.config.name,
            self.trainer_step,
            self.explorer_step,
            final_checkpoint,
            self.last_metrics,
            "; ".join(short) or None,
        )


__all__ = ["StepLoop", "sync_method_set_for", "total_steps", "wait_report_s"]
