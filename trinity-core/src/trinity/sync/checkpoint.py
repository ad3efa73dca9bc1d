"""Weight sync from disk (``synchronizer.sync_method: checkpoint``).

The trainer saves Hugging Face checkpoints under ``<job_dir>/global_step_N/``; the explorer
asks its engines to reload the newest one with ``load_checkpoint(path, version)``. It is the
method for ``explore`` / ``train`` running as separate processes, and for ``bench``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from trinity.trainer.checkpoint import find_latest_checkpoint


def latest_weights(job_dir: str | os.PathLike, newer_than: int = -1) -> tuple[int, str] | None:
    """``(step, path)`` of the newest complete checkpoint if its step is above ``newer_than``."""
    found = find_latest_checkpoint(job_dir)
    if found is None or found[0] <= newer_than:
        return None
    return found


def wait_for_weights(
    job_dir: str | os.PathLike, min_step: int, timeout: float, poll_interval: float = 1.0
) -> tuple[int, str]:
    """Block until a checkpoint with step >= ``min_step`` exists; ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = find_latest_checkpoint(job_dir)
        if found is not None and found[0] >= min_step:
            return found
        if time.monotonic() >= deadline:
            have = "none" if found is None else f"step {found[0]}"
            raise TimeoutError(
                f"no checkpoint of step >= {min_step} appeared in {os.fspath(job_dir)} within {timeout:g} s "
                f"(newest: {have}); is the trainer running? Raise synchronizer.sync_timeout if it is slow"
            )
        time.sleep(poll_interval)


def sync_from_checkpoint(engine: Any, job_dir: str | os.PathLike, current_version: int = -1) -> int | None:
    """Make ``engine`` load the newest checkpoint if it is newer than ``current_version``.

    ``engine`` has ``load_checkpoint(path, version)`` (a Ray actor handle works too: the call is
    then awaited). Returns the new version, or ``None`` when there was nothing newer.
    """
    found = latest_weights(job_dir, current_version)
    if found is None:
        return None
    step, path = found
    method = engine.load_checkpoint
    if hasattr(method, "remote"):
        import ray

        ray.get(method.remote(path, step))
    else:
        method(path, step)
    return step


__all__ = ["latest_weights", "sync_from_checkpoint", "wait_for_weights"]
