"""``<job dir>/run_status.json``: what the launcher says about a run, for the studio and scripts.

The launcher writes ``running`` (with its pid and host) when a stage starts and ``finished``,
``failed`` or ``interrupted`` (with the reason) when it ends. A run whose file still says
``running`` but whose process is gone (same host) was killed: :func:`read_run_status` reports it
as ``failed``. Light on purpose (no torch / ray): the studio reads it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

FILE = "run_status.json"


def write_run_status(job_dir: str | os.PathLike[str], status: str, reason: str | None = None) -> None:
    """Record ``status`` for the run in ``job_dir`` (atomically; keeps the start time)."""
    path = Path(job_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = _read(path) or {}
    now = time.time()
    record: dict[str, Any] = {
        "status": status,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": previous.get("started", now) if status != "running" else now,
        "updated": now,
    }
    if status != "running":
        record["ended"] = now
    if reason:
        record["reason"] = reason
    # A temporary file of this write's own: the explore and train jobs of a decoupled run share
    # the job dir, and with one fixed name one job's rename took the other's file away.
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record, indent=1))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def read_run_status(job_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's recorded status (``None`` when the launcher wrote none), with a ``running``
    run whose process is gone on this host turned into ``failed``."""
    record = _read(Path(job_dir) / FILE)
    if record is None:
        return None
    if record.get("status") == "running" and record.get("host") == socket.gethostname():
        pid = int(record.get("pid") or 0)
        if pid and not _alive(pid):
            record = {
                **record,
                "status": "failed",
                "reason": f"its process {pid} is gone without finishing (killed?)",
            }
    return record
