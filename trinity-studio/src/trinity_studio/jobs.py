"""Jobs launched from the studio: ``trinity run --config FILE`` subprocesses.

Output (stdout and stderr together) goes to a log file next to the saved config, so the page
reads it from any offset and a studio restart loses nothing but the process handle. Stop sends
SIGINT, which the launcher turns into a clean shutdown of its actors (as Ctrl-C would).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """One ``trinity run`` process started by the studio."""

    id: int
    config_file: str
    log_file: str
    job_dir: str
    process: subprocess.Popen = field(repr=False)
    started: float = field(default_factory=time.time)

    @property
    def status(self) -> str:
        code = self.process.poll()
        if code is None:
            return "running"
        return "finished" if code == 0 else "failed"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "config_file": self.config_file,
            "log_file": self.log_file,
            "job_dir": self.job_dir,
            "pid": self.process.pid,
            "status": self.status,
            "exit_code": self.process.poll(),
            "started": self.started,
        }


class JobManager:
    """Starts, lists and stops the studio's jobs."""

    def __init__(self, command: list[str] | None = None) -> None:
        # The config file is appended; tests substitute a stand-in for `trinity run`.
        self.command = command or [sys.executable, "-m", "trinity.cli", "run", "--config"]
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, config_file: str, job_dir: str, extra_args: list[str] | None = None) -> Job:
        """Run ``trinity run --config config_file`` in the background."""
        log_file = os.path.splitext(config_file)[0] + ".log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log_file, "wb") as out:
            process = subprocess.Popen(
                [*self.command, config_file, *(extra_args or [])],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # The studio's own folder, as for `trinity run` typed there: relative paths in the
                # config mean what the page's validation took them to mean.
                cwd=None,
                start_new_session=True,  # Ctrl-C on the studio's terminal does not reach the job
            )
        with self._lock:
            job = Job(next(self._ids), config_file, log_file, job_dir, process)
            self._jobs[job.id] = job
        return job

    def get(self, job_id: int) -> Job:
        with self._lock:
            return self._jobs[job_id]

    def all(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def statuses(self) -> dict[str, str]:
        """``{job_dir: status}`` of every job, the latest one per folder."""
        return {job.job_dir: job.status for job in sorted(self.all(), key=lambda j: j.id)}

    def stop(self, job_id: int) -> Job:
        """Send SIGINT (the launcher's clean shutdown) to a running job."""
        job = self.get(job_id)
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGINT)
        return job

    def output(self, job_id: int, offset: int = 0, limit: int = 1 << 20) -> tuple[str, int]:
        """Text of the job's output from byte ``offset``, and the offset to ask for next."""
        job = self.get(job_id)
        try:
            with open(job.log_file, "rb") as f:
                f.seek(offset)
                data = f.read(limit)
        except OSError:
            return "", offset
        return data.decode("utf-8", "replace"), offset + len(data)
