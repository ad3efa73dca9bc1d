"""Every ``[trinity] ...`` line a job prints on the console, in one place.

The launcher (:mod:`trinity.launcher`) and its step loop (:mod:`trinity.step_loop`) decide
*when* something is worth a line; the wording is here. Lines about a problem (a failure, a
stage that fell short, a wait given up) go to stderr, the rest to stdout. The progress bar is
a monitor of its own (:mod:`trinity.monitor.console`); the closing line waits for it to end.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

PREFIX = "[trinity]"


def say(text: str, *, problem: bool = False) -> None:
    """Print one console line (stderr when it is about a problem)."""
    print(f"{PREFIX} {text}", file=sys.stderr if problem else sys.stdout, flush=True)


def setup_driver_logging() -> None:
    """Log records of the ``trinity`` loggers, and warnings of the installed plugins' packages
    (:func:`job_loggers`), in the driver process go to stderr, prefixed too."""
    if not logging.getLogger("trinity").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PREFIX} %(levelname)s %(name)s: %(message)s"))
        for name in job_loggers():
            logging.getLogger(name).addHandler(handler)
            # The plugins' warnings; their progress lines stay in the actors' log files.
            logging.getLogger(name).setLevel(logging.INFO if name == "trinity" else logging.WARNING)


def job_loggers() -> list[str]:
    """The loggers whose records a job keeps (its console, each actor's log file): ``trinity``,
    and the top-level package of every installed plugin (entry points of group ``trinity``) and
    module of every ``--plugin-dir`` folder, whose modules log under their own names
    (``logging.getLogger(__name__)``: ``trinity_math.judge``, ...), outside ``trinity``."""
    from importlib.metadata import entry_points

    from trinity.plugins import get_manager

    names = {ep.value.split(":")[0].split(".")[0] for ep in entry_points(group="trinity")}
    for folder in get_manager().plugin_dirs:
        names.update(path.stem for path in folder.glob("*.py"))
        names.update(path.parent.name for path in folder.glob("*/__init__.py"))
    names.discard("trinity")
    return ["trinity", *sorted(names)]


# -- the job and its stages --------------------------------------------------------------------


def stage_starts(index: int, count: int, label: str, mode: str) -> None:
    say(f"stage {index + 1}/{count}: {label} (mode {mode})")


def renamed(job_dir: str, name: str) -> None:
    say(f"{job_dir} exists and continue_from_checkpoint is false: running as {name!r}")


def interrupted(exc: BaseException) -> None:
    say("interrupted; actors stopped.", problem=True)
    notes(exc)


def job_failed(exc: BaseException) -> None:
    say(f"job failed: {exc}", problem=True)
    notes(exc)


def notes(exc: BaseException) -> None:
    """The notes added to a failure (what was cleaned up after it), after its own line."""
    for note in getattr(exc, "__notes__", ()):
        say(str(note), problem=True)


def later_stages_not_run() -> None:
    say("later stages not run: this one fell short", problem=True)


def queue_not_released(exc: BaseException) -> None:
    say(f"could not release the queue buffer: {exc}", problem=True)


def queue_left(line: str) -> None:
    say(line)


def reads_not_given_back(exc: BaseException) -> None:
    say(f"could not give back the unfinished step's experiences: {exc}", problem=True)


def reads_given_back(count: int) -> None:
    say(f"{count} experiences read for the unfinished train step are unread again")


# -- explore steps ------------------------------------------------------------------------------


def explore_step_failures(step: int, failures: str, log_file: Any) -> None:
    say(f"explorer step {step}: {failures} (tracebacks in {log_file})")


def checkpoint_loaded(step: int, path: str | None, version: int) -> None:
    say(f"explorer step {step}: loaded the trainer job's checkpoint {path} (model version {version})")


def checkpoint_wait_starts(
    step: int, target: int, job_dir: str, why: str, latest: int, timeout: float
) -> None:
    say(
        f"explorer step {step}: waits for the trainer job's checkpoint of step {target} in {job_dir} "
        f"({why}; newest is step {latest}; at most {timeout}s, synchronizer.sync_timeout)"
    )


def checkpoint_wait_changes(step: int, target: int, why: str) -> None:
    say(f"explorer step {step}: still waits for the checkpoint of trainer step {target}: {why}")


def explores_without_checkpoint(
    step: int, target: int, job_dir: str, why: str, version: int, *, waited: bool
) -> None:
    """Explores on without the checkpoint a sync step needed: a problem after a wait; a fact
    (said once per reason) when there was nothing to wait for."""
    say(
        f"explorer step {step}: no checkpoint of trainer step {target} in {job_dir}: {why}; "
        f"exploring on with model version {version}",
        problem=waited,
    )


def broadcast_received(step: int, version: int) -> None:
    say(f"explorer step {step}: holds the train job's broadcast weights (model version {version})")


def explores_without_broadcast(step: int, target: int, timeout: float, version: int) -> None:
    say(
        f"explorer step {step}: no broadcast of version {target} from the train job after {timeout}s "
        f"(synchronizer.sync_timeout); exploring on with model version {version}",
        problem=True,
    )


# -- the train job's broadcast to the explore job (sync_method nccl) ----------------------------


def no_explorer_job_yet(step: int, actor: str, namespace: str) -> None:
    say(
        f"trainer step {step}: no explorer job of this run on the cluster yet (actor {actor!r} in "
        f"namespace {namespace!r}); weights are broadcast once it is there"
    )


def explorer_job_ended(step: int) -> None:
    say(f"trainer step {step}: the explorer job has ended; no more weights are sent")


def broadcast_sent(step: int, version: int) -> None:
    say(f"trainer step {step}: broadcast version {version} to the explorer job")


# -- waits and the end of a stage ---------------------------------------------------------------


def waiting(seconds: float, parts: Iterable[str]) -> None:
    """While nothing finishes: who waits for what (one part per actor)."""
    say(f"waiting {seconds:.0f}s: " + "; ".join(parts))


def stage_ends(summary: str, short: list[str]) -> None:
    """The closing line: ``done`` only when the stage did all it was asked to."""
    if short:
        say(f"finished short: {'; '.join(short)}. {summary}", problem=True)
    else:
        say(f"done: {summary}")
