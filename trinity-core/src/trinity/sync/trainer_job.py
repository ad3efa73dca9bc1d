"""Whether a train job of a decoupled pair runs: its heartbeat file in the shared job folder.

An explore job (``mode: explore``, ``sync_method: checkpoint``) sees its train job only through
the job folder both share. The newest checkpoint there says how far the trainer got, but not
whether one runs at all: before the trainer's first save, "no checkpoint yet" looks the same
as "no train job" (explore-then-train, where nothing will ever come). So a train-only stage
keeps ``<job dir>/trainer_job.json`` while it runs (:class:`TrainerHeartbeat`): its pid, host
and the time of its last refresh, rewritten every :data:`REFRESH_S` seconds and removed when
the stage ends, however it ends short of a SIGKILL. :func:`read_trainer_job` tells the explore
job what the file shows, and :func:`checkpoint_wait` what to do about it.

Why a file and not the buffer: the checkpoints the explorer waits for are in this folder, so
both jobs can always reach it, whatever the buffer is (a queue actor on a shared cluster, an
SQL table); and a reader of a buffer is not registered anywhere (only writers are), while the
buffer's writer table is the explorer's own.

A trainer killed by SIGKILL leaves the file behind. A refresh older than :data:`STALE_S` (or,
on the same host, its pid no longer running, which tells at once) marks it ``gone``; the explorer then waits
:data:`GONE_GRACE_S` seconds more for a restarted train job (the grace a trainer gives a killed
explorer, :data:`trinity.buffer.base.GONE_WRITER_GRACE_S`), and no longer after that. Hosts
are assumed to agree on the time within a few seconds (NTP).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trinity.buffer.base import GONE_WRITER_GRACE_S, pid_alive

#: The heartbeat file, in the job folder (``config.checkpoint_job_dir``).
FILE = "trainer_job.json"

#: Seconds between two refreshes of the heartbeat.
REFRESH_S = 5.0

#: A heartbeat not refreshed for this long is a train job that is gone: the only sign from
#: another host, where its pid cannot be checked (six refreshes missed, so a busy machine is
#: no false alarm).
STALE_S = 30.0

#: Seconds an explorer still waits for a restarted train job once the last one is gone.
GONE_GRACE_S = GONE_WRITER_GRACE_S

State = Literal["running", "gone", "none"]


@dataclass(frozen=True)
class TrainerJob:
    """What the job folder shows of a train job: ``running`` (a fresh heartbeat), ``gone``
    (killed: its heartbeat stayed behind; ``gone_for`` seconds since its last refresh) or
    ``none`` (no heartbeat: none started, or it ended). ``who`` is ``pid N on HOST``."""

    state: State
    who: str = ""
    gone_for: float = 0.0


def _record(pid: int | None = None, host: str | None = None, started: float | None = None) -> dict:
    now = time.time()
    return {
        "pid": pid or os.getpid(),
        "host": host or socket.gethostname(),
        "started": started or now,
        "updated": now,
    }


def _write(path: Path, record: dict) -> None:
    # A temporary file of its own, then a rename: a reader never sees half a record.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
    os.replace(tmp, path)


class TrainerHeartbeat:
    """``with TrainerHeartbeat(job_dir):`` keeps ``<job_dir>/trainer_job.json`` fresh (a daemon
    thread rewrites it every ``refresh_s`` seconds) and removes it on leaving, if it is still
    this process's. A refresh that fails (a full or vanished disk) is retried at the next one."""

    def __init__(self, job_dir: str | os.PathLike[str], refresh_s: float = REFRESH_S) -> None:
        self.path = Path(job_dir) / FILE
        self.refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.time()

    def beat(self) -> None:
        """Write the heartbeat now."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write(self.path, _record(started=self._started))

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            with contextlib.suppress(OSError):
                self.beat()

    def __enter__(self) -> TrainerHeartbeat:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="trainer-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_s + 5)
        record = _read(self.path)
        if (
            record is not None
            and record.get("pid") == os.getpid()
            and record.get("host") == socket.gethostname()
        ):
            with contextlib.suppress(OSError):  # a restarted train job's file is not ours to remove
                self.path.unlink()


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_trainer_job(job_dir: str | os.PathLike[str], now: float | None = None) -> TrainerJob:
    """What ``<job_dir>/trainer_job.json`` shows (see :class:`TrainerJob`)."""
    record = _read(Path(job_dir) / FILE)
    if record is None:
        return TrainerJob("none")
    now = time.time() if now is None else now
    pid, host = int(record.get("pid") or 0), str(record.get("host") or "")
    age = max(0.0, now - float(record.get("updated") or 0.0))
    who = f"pid {pid} on {host}"
    if (host == socket.gethostname() and pid and not pid_alive(pid)) or age > STALE_S:
        return TrainerJob("gone", who, age)
    return TrainerJob("running", who)


@dataclass(frozen=True)
class CheckpointWait:
    """:func:`checkpoint_wait`'s answer: ``wait`` (and poll again) or ``go_on`` (explore with
    the weights held); ``why`` says which, for the console."""

    action: Literal["wait", "go_on"]
    why: str


def checkpoint_wait(trainer: TrainerJob, waited_s: float, sync_timeout: float) -> CheckpointWait:
    """Whether an explore job waits (longer) for a checkpoint it needs, which is not there yet:
    while a train job runs, up to ``sync_timeout`` seconds (``waited_s`` so far); while the one
    that ran is gone, :data:`GONE_GRACE_S` more seconds for a restarted one (within
    ``sync_timeout`` too); without a train job, not at all (nothing would ever come)."""
    if trainer.state == "none":
        return CheckpointWait("go_on", "no train job runs (none started, or it ended)")
    if waited_s >= sync_timeout:
        return CheckpointWait("go_on", f"waited {sync_timeout:g}s (synchronizer.sync_timeout)")
    if trainer.state == "gone":
        if trainer.gone_for >= GONE_GRACE_S:
            return CheckpointWait(
                "go_on",
                f"the train job ({trainer.who}) is gone without finishing (killed?) and none took "
                f"over in {GONE_GRACE_S:g}s",
            )
        return CheckpointWait(
            "wait",
            f"the train job ({trainer.who}) is gone (killed?); waiting up to "
            f"{min(GONE_GRACE_S, sync_timeout):g}s for a restarted one",
        )
    return CheckpointWait("wait", f"the train job runs ({trainer.who})")


__all__ = [
    "FILE",
    "GONE_GRACE_S",
    "REFRESH_S",
    "STALE_S",
    "CheckpointWait",
    "TrainerHeartbeat",
    "TrainerJob",
    "checkpoint_wait",
    "read_trainer_job",
]
