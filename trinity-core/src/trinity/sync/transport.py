"""How a stage moves the trainer's weights to the explorer: one :class:`WeightTransport` per stage.

The launcher builds it with :func:`make_transport` (``synchronizer.sync_method``), calls
:meth:`~WeightTransport.open` once (it returns a line saying what it chose, for the log),
:meth:`~WeightTransport.sync` whenever the :class:`~trinity.sync.Synchronizer` says so (it
returns the version the explorer now holds: the trainer's step) and
:meth:`~WeightTransport.close` at the end of the stage. Each call goes to the trainer and
explorer actors (the ``TrainerActor`` / ``ExplorerActor`` methods named below); a failure is a
:class:`WeightSyncFailed` whose message names every side's error.

- ``memory``: the trainer's packed state dict through Ray's object store (``get_weights`` →
  ``update_weights``); works anywhere, copies the model once per sync.
- ``checkpoint``: the trainer saves a Hugging Face checkpoint, the explorer reloads it
  (``save_weights`` → ``load_checkpoint``).
- ``nccl``: a broadcast from the trainer to every rollout rank over a process group of their
  own (:mod:`trinity.sync.broadcast`; NCCL when every rank has its own GPU, gloo otherwise),
  built at :meth:`~WeightTransport.open` and torn down at :meth:`~WeightTransport.close`.

Calls on one actor run in submission order, so the weights sent are those after every train
step submitted so far (never a half-updated model). Nothing heavy is imported here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

#: Seconds to wait for the other sides' errors once one side of a collective call has failed.
COLLECT_ERRORS_S = 5.0


class WeightSyncFailed(RuntimeError):
    """A weight-sync call of the launcher failed; the message says which and why (every side)."""


def get_result(ray: Any, refs: Any, doing: str, error: type[Exception] = WeightSyncFailed) -> Any:
    """``ray.get`` whose failures (a call that raised, an actor that died) are one ``error``
    saying what was being done and why; the launcher uses it with its own ``JobFailed``."""
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(refs)
    except (RayTaskError, RayActorError) as exc:
        if isinstance(exc, RayTaskError):
            reason = repr(exc.cause) if exc.cause else str(exc)
        else:
            reason = actor_death(exc)
        raise error(f"{doing}: {reason}") from exc


def actor_death(exc: Exception) -> str:
    """Why an actor died, in one line. An actor whose constructor raised: ``an actor died:
    <Class>.__init__ raised <Error>: <message>`` (Ray's message holds the whole traceback; its
    last line is the exception). Any other death: Ray's message in brackets."""
    import re

    text = str(exc)
    if getattr(exc, "_actor_init_failed", False) or "creation task" in text:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        where = re.search(r"ray::([\w:.]+\.__init__)\(\)", text)
        if lines and re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", lines[-1]):
            return f"an actor died: {where.group(1) if where else 'its constructor'} raised {lines[-1]}"
    return f"an actor died ({text})"


def get_together(
    ray: Any, refs: list[Any], doing: str, timeout: float, grace: float | None = None
) -> list[Any]:
    """Results of calls that must run together (the ranks of one collective).

    The first failure ends the wait: the other calls would only sit in the collective until
    their own timeout. Their errors are collected for :data:`COLLECT_ERRORS_S` seconds, so the
    message shows every side (e.g. the explorer's reason next to the trainer's "cancelled").
    Calls still running after ``timeout`` plus ``grace`` (default: 10 %, at least 30 s; the
    group's own timeouts should fire first) are a :class:`WeightSyncFailed` as well.
    """
    grace = max(30.0, 0.1 * timeout) if grace is None else grace
    deadline = time.monotonic() + timeout + grace
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise WeightSyncFailed(
                f"{doing}: no answer within synchronizer.sync_timeout ({timeout:g} s); "
                "a rank of the weight-sync group hangs"
            )
        try:
            get_result(ray, ready[0], doing)
        except WeightSyncFailed as first:
            messages = [str(first)]
            late = ray.wait(pending, num_returns=len(pending), timeout=COLLECT_ERRORS_S)[0] if pending else []
            for ref in late:
                try:
                    get_result(ray, ref, doing)
                except WeightSyncFailed as other:
                    messages.append(str(other).removeprefix(f"{doing}: "))
            raise WeightSyncFailed("; ".join(messages)) from first
    return [ray.get(ref) for ref in refs]


class WeightTransport(ABC):
    """One stage's way of moving weights from ``trainer`` to ``explorer`` (Ray actor handles).

    ``ray`` is the ``ray`` module (or a stand-in); ``timeout_s`` is ``synchronizer.sync_timeout``.
    """

    method: str = ""

    def __init__(self, ray: Any, explorer: Any, trainer: Any, timeout_s: float) -> None:
        self.ray, self.explorer, self.trainer = ray, explorer, trainer
        self.timeout_s = float(timeout_s)

    def open(self) -> str:
        """Prepare for the stage's syncs; returns what was chosen (one line, or ``""``)."""
        return ""

    @abstractmethod
    def sync(self) -> int:
        """Move the trainer's current weights to the explorer; returns their version."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what :meth:`open` set up (a later stage opens a transport of its own)."""


class MemoryTransport(WeightTransport):
    """``sync_method: memory``: the state dict through Ray's object store."""

    method = "memory"

    def sync(self) -> int:
        weights_and_version = self.trainer.get_weights.remote()
        # Passing the ref inside a list keeps Ray from materialising it in the driver.
        return get_result(
            self.ray, self.explorer.update_weights.remote([weights_and_version]), "explorer weight sync"
        )


class CheckpointTransport(WeightTransport):
    """``sync_method: checkpoint``: the explorer reloads the checkpoint the trainer saves."""

    method = "checkpoint"

    def sync(self) -> int:
        path_and_version = self.trainer.save_weights.remote()
        return get_result(
            self.ray, self.explorer.load_checkpoint.remote(path_and_version), "explorer checkpoint sync"
        )


class BroadcastTransport(WeightTransport):
    """``sync_method: nccl``: a broadcast over the group of the trainer (rank 0) and every
    rollout rank, over NCCL when every rank has a GPU of its own, else gloo."""

    method = "nccl"

    def open(self) -> str:
        """Build the group: the trainer opens the store first (for its port), then both sides
        join together. Returns the backend chosen and why."""
        from trinity.sync.group import NCCLUnavailableError, choose_backend

        ray, explorer, trainer = self.ray, self.explorer, self.trainer
        trainer_device, engine_devices = get_result(
            ray,
            [trainer.weight_sync_device.remote(), explorer.weight_sync_devices.remote()],
            "weight sync set-up",
        )
        devices = [trainer_device, *(d for engine in engine_devices for d in engine)]
        try:
            backend, why = choose_backend(devices)
        except NCCLUnavailableError as exc:
            raise WeightSyncFailed(f"weight sync set-up: {exc}") from exc
        spec = get_result(
            ray, trainer.open_weight_group.remote(len(devices), backend, self.timeout_s), "weight sync set-up"
        )
        get_together(
            ray,
            [trainer.connect_weight_group.remote(), explorer.init_weight_group.remote(spec)],
            f"creating the weight-sync group ({backend}, {len(devices)} ranks)",
            self.timeout_s,
        )
        return why

    def sync(self) -> int:
        """The metadata through Ray, then the trainer's broadcast and the explorer's receive
        issued together (one waits for the other inside the collective)."""
        # Waits for a train step still running: the snapshot is taken after it.
        metas, version = get_result(
            self.ray, self.trainer.prepare_weights.remote(), "trainer weights for the broadcast"
        )
        get_together(
            self.ray,
            [self.trainer.send_weights.remote(), self.explorer.receive_weights.remote(metas, version)],
            f"weight sync (broadcast of version {version})",
            self.timeout_s,
        )
        return version

    def close(self) -> None:
        get_result(
            self.ray,
            [self.explorer.close_weight_group.remote(), self.trainer.close_weight_group.remote()],
            "weight sync",
        )


TRANSPORTS: dict[str, type[WeightTransport]] = {
    t.method: t for t in (MemoryTransport, CheckpointTransport, BroadcastTransport)
}


def make_transport(method: str, ray: Any, explorer: Any, trainer: Any, timeout_s: float) -> WeightTransport:
    """The transport of ``synchronizer.sync_method`` ``method`` (not yet opened)."""
    try:
        cls = TRANSPORTS[method]
    except KeyError:
        raise WeightSyncFailed(
            f"synchronizer.sync_method {method!r}: use {', '.join(repr(m) for m in TRANSPORTS)}"
        ) from None
    return cls(ray, explorer, trainer, timeout_s)


__all__ = [
    "COLLECT_ERRORS_S",
    "TRANSPORTS",
    "BroadcastTransport",
    "CheckpointTransport",
    "MemoryTransport",
    "WeightSyncFailed",
    "WeightTransport",
    "get_together",
    "make_transport",
]
