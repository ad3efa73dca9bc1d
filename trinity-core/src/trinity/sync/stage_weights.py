"""A stage's weight transport as the step loop uses it: opened for the stage
(:func:`open_weight_sync`), each call failing the job in one line when it fails
(:func:`sync_or_fail`), and a train-only stage's broadcast to its explore job's explorer
(:class:`ExplorerJobBroadcast`). When to sync is the :class:`~trinity.sync.Synchronizer`'s
decision; this is how."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from trinity import report
from trinity.job import JobFailed

if TYPE_CHECKING:
    from collections.abc import Callable

    from trinity.config import Config
    from trinity.sync import WeightTransport

# The launcher's logger: its console lines (``[trinity] INFO trinity.launcher: ...``) stay as they were.
logger = logging.getLogger("trinity.launcher")


class ExplorerJobBroadcast:
    """A train-only stage's broadcast to its explore job's explorer actor (``sync_method: nccl``
    across a decoupled pair, both jobs on one Ray cluster; the actor is found by name in the
    run's namespace). Before that job's actor exists, and after it ended, the weights are not
    sent (said once each)."""

    def __init__(self, ray: Any, config: Config, trainer: Any) -> None:
        self.ray, self.config, self.trainer = ray, config, trainer
        self.transport: WeightTransport | None = None
        # "not found" (not looked for yet), "waiting" (said so once), "open" or "gone" (that job ended)
        self.state = "not found"

    def broadcast(self, trainer_step: int) -> None:
        """Broadcast the trainer's current weights (the broadcast waits for the explore job's
        step in flight)."""
        from trinity.sync import WeightSyncFailed
        from trinity.sync.transport import BroadcastTransport

        config = self.config
        if self.state == "gone":
            return
        if self.transport is None:
            try:
                peer = self.ray.get_actor(config.explorer.name, namespace=config.ray_namespace)
            except ValueError:
                if self.state == "not found":
                    report.no_explorer_job_yet(trainer_step, config.explorer.name, config.ray_namespace)
                    self.state = "waiting"
                return
            transport = BroadcastTransport(self.ray, peer, self.trainer, config.synchronizer.sync_timeout)
            try:
                why = transport.open()
            except WeightSyncFailed as exc:
                raise JobFailed(f"weight sync with the explorer job: {exc}") from exc
            logger.info("sync_method nccl with the explorer job: %s", why)
            self.transport, self.state = transport, "open"
        try:
            version = self.transport.sync()
        except WeightSyncFailed as exc:
            if "an actor died" not in str(exc):
                raise JobFailed(f"weight sync with the explorer job: {exc}") from exc
            self.state, self.transport = "gone", None
            report.explorer_job_ended(trainer_step)
            return
        report.broadcast_sent(trainer_step, version)

    def close(self) -> None:
        if self.transport is not None:
            with contextlib.suppress(Exception):  # the explorer job may have ended first
                self.transport.close()


def open_weight_sync(ray: Any, config: Config, explorer: Any, trainer: Any) -> WeightTransport | None:
    """The stage's weight transport (``synchronizer.sync_method``), opened; ``None`` unless the
    stage runs both explorer and trainer. What it chose (``nccl``: the backend) is logged once."""
    if explorer is None or trainer is None:
        return None
    from trinity.sync import make_transport

    sync = config.synchronizer
    transport = sync_or_fail(make_transport, sync.sync_method, ray, explorer, trainer, sync.sync_timeout)
    chosen = sync_or_fail(transport.open)
    if chosen:
        logger.info("sync_method %s: %s", transport.method, chosen)
    return transport


def sync_or_fail(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``: a weight transport's ``open`` / ``sync`` / ``close``; its failure (which
    names every side's error) fails the job."""
    from trinity.sync import WeightSyncFailed

    try:
        return call(*args)
    except WeightSyncFailed as exc:
        raise JobFailed(str(exc)) from exc


__all__ = ["ExplorerJobBroadcast", "open_weight_sync", "sync_or_fail"]
