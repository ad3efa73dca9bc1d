"""The weight-sync process group: the trainer (rank 0) and every rollout rank, over NCCL or gloo.

:class:`GroupSpec` is what a rank needs to join (the trainer's store address, the group size,
the backend and the timeout); it travels unchanged from the trainer through the launcher, the
explorer, its engines and vLLM's workers (in wire form across ``collective_rpc``). The group is
built straight from a ``TCPStore`` (its master on the trainer's node, on a free port) and a
``PrefixStore`` — never through ``torch.distributed.init_process_group``, so a default group the
trainer already uses (FSDP) is left alone.

Backend (:func:`choose_backend`): NCCL when every rank is on its own CUDA device, gloo
otherwise — the same code path on CPU, with the tensors staged in host memory. Every wait is
bounded by ``synchronizer.sync_timeout``; a peer that never joins or stops answering gives a
:class:`WeightSyncError` naming the rank and the timeout. With NCCL, torch's watchdog may end
the process on a timed-out collective instead (the launcher then reports the dead actor).

torch is imported inside functions: the launcher imports this package.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

GLOO = "gloo"
NCCL = "nccl"
BACKENDS = (GLOO, NCCL)
#: Environment variable forcing the backend (``nccl`` or ``gloo``) instead of choosing it.
BACKEND_ENV = "TRINITY_WEIGHT_SYNC_BACKEND"
DEFAULT_GROUP_NAME = "rollout_weight_sync"


class NCCLUnavailableError(RuntimeError):
    """The NCCL backend was asked for where it cannot work (a rank without its own GPU)."""


class WeightSyncError(RuntimeError):
    """The weight-sync group could not be formed, timed out, or its ranks disagreed."""


@dataclass(frozen=True)
class GroupSpec:
    """How to join one weight-sync group: rank 0's store, the group's size, backend and timeout
    (``synchronizer.sync_timeout``). Each rollout rank adds its own rank."""

    master_addr: str
    master_port: int
    world_size: int
    backend: str
    timeout_s: float
    group_name: str = DEFAULT_GROUP_NAME

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"weight-sync backend {self.backend!r}: use one of {BACKENDS}")
        if self.world_size < 1:
            raise ValueError(f"weight-sync group of {self.world_size} ranks")

    def to_wire(self) -> dict[str, Any]:
        """Plain values: what crosses vLLM's ``collective_rpc`` (msgpack)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, item: GroupSpec | Mapping[str, Any]) -> GroupSpec:
        if isinstance(item, GroupSpec):
            return item
        return cls(
            str(item["master_addr"]),
            int(item["master_port"]),
            int(item["world_size"]),
            str(item["backend"]),
            float(item["timeout_s"]),
            str(item.get("group_name", DEFAULT_GROUP_NAME)),
        )


# -- devices and backend -------------------------------------------------------------------------


def describe_device(device: Any = None) -> str:
    """``"cpu"``, or ``"cuda:<uuid>"`` for a CUDA device (the UUID tells whether two ranks share
    a GPU, which NCCL does not allow)."""
    import torch

    if device is None:
        return "cpu"
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"cuda:{uuid if uuid is not None else index}"


def choose_backend(devices: Sequence[str], requested: str | None = None) -> tuple[str, str]:
    """``(backend, why)`` for a group whose rank ``i`` is on ``devices[i]`` (trainer first).

    NCCL when every rank has a CUDA device of its own, else gloo (weights staged through host
    memory). ``requested`` (``nccl``/``gloo``; default ``$TRINITY_WEIGHT_SYNC_BACKEND``)
    forces one; NCCL forced where a rank is on CPU or shares a GPU is an
    :class:`NCCLUnavailableError`.
    """
    requested = (requested if requested is not None else os.environ.get(BACKEND_ENV, "")).strip().lower()
    if requested not in ("", "auto", *BACKENDS):
        raise NCCLUnavailableError(f"${BACKEND_ENV} is {requested!r}; use nccl, gloo or auto")
    names = ["trainer"] + [f"rollout rank {i}" for i in range(1, len(devices))]
    on_cpu = [n for n, d in zip(names, devices) if not d.startswith("cuda")]
    shared: dict[str, list[str]] = {}
    for n, d in zip(names, devices):
        if d.startswith("cuda"):
            shared.setdefault(d, []).append(n)
    shared = {d: ns for d, ns in shared.items() if len(ns) > 1}
    problem = ""
    if on_cpu:
        problem = f"{', '.join(on_cpu)} on CPU" if len(on_cpu) < len(devices) else "no CUDA device"
    elif shared:
        problem = "; ".join(f"{' and '.join(ns)} share GPU {d[5:]}" for d, ns in shared.items())
    if requested == NCCL:
        if problem:
            raise NCCLUnavailableError(
                f"${BACKEND_ENV}=nccl, but the NCCL backend needs every rank of the weight-sync group "
                f"on a GPU of its own ({problem}). Unset it to broadcast over gloo, or use "
                "synchronizer.sync_method 'memory'."
            )
        return NCCL, f"broadcasting over nccl (forced by ${BACKEND_ENV}) to {len(devices) - 1} rank(s)"
    if requested == GLOO:
        return GLOO, f"broadcasting over gloo (forced by ${BACKEND_ENV}) to {len(devices) - 1} rank(s)"
    if problem:
        return GLOO, f"{problem}, broadcasting over gloo to {len(devices) - 1} rank(s)"
    return NCCL, f"every rank on its own GPU, broadcasting over nccl to {len(devices) - 1} rank(s)"


def use_device(device: Any) -> None:
    """Make ``device`` this thread's current CUDA device (NCCL collectives run on it); a
    device without an index, or a CPU one, leaves the current device as it is."""
    import torch

    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def node_ip() -> str:
    """This node's IP as Ray sees it (``127.0.0.1`` without Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # pragma: no cover - ray is a core dependency; no route gives loopback
        return "127.0.0.1"


# -- the group -----------------------------------------------------------------------------------


class WeightSyncGroup:
    """One rank's membership of the weight-sync group: a store plus a gloo or NCCL backend.

    Rank 0 calls :meth:`create_master` (binds the store on a free port; :attr:`spec` is what
    the other ranks need) and then :meth:`connect`; the others call :meth:`join`, which connects.
    Every rank's :meth:`connect` blocks until all ``world_size`` ranks are there (or raises
    :class:`WeightSyncError` after ``timeout_s``), so ranks must be started concurrently.
    """

    def __init__(self, store: Any, spec: GroupSpec, rank: int, host: str | None = None) -> None:
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"weight-sync rank {rank} is outside a group of {spec.world_size}")
        self.store = store
        self.spec = spec
        self.rank = rank
        self.world_size = spec.world_size
        self.backend = spec.backend
        self.timeout_s = float(spec.timeout_s)
        self.host = host
        self.pg: Any = None

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def create_master(
        cls,
        world_size: int,
        backend: str,
        timeout_s: float,
        *,
        group_name: str = DEFAULT_GROUP_NAME,
        host: str | None = None,
        port: int = 0,
    ) -> WeightSyncGroup:
        """Rank 0: start the store on ``host`` (default: this node's IP), port 0 = a free one."""
        import torch.distributed as dist

        host = host or node_ip()
        spec = GroupSpec(host, port, world_size, backend, timeout_s, group_name)  # checks the values
        store = dist.TCPStore(host, port, world_size, True, _timedelta(timeout_s), wait_for_workers=False)
        return cls(store, dataclasses.replace(spec, master_port=store.port), 0, host)

    @classmethod
    def join(cls, spec: GroupSpec, rank: int, *, host: str | None = None) -> WeightSyncGroup:
        """Rank ``rank`` (>= 1): connect to rank 0's store and form the group (blocks)."""
        import torch.distributed as dist

        if rank < 1:
            raise ValueError(f"join is for ranks >= 1 (rank 0 is the trainer), got {rank}")
        start = time.monotonic()
        try:
            store = dist.TCPStore(
                spec.master_addr, spec.master_port, spec.world_size, False, _timedelta(spec.timeout_s)
            )
        except Exception as exc:
            raise WeightSyncError(
                f"weight-sync rank {rank}/{spec.world_size}: could not reach the trainer's store at "
                f"{spec.master_addr}:{spec.master_port} within {spec.timeout_s:g} s "
                f"(synchronizer.sync_timeout): {exc}"
            ) from exc
        group = cls(store, spec, rank, host)
        group.connect(started=start)
        return group

    @property
    def address(self) -> tuple[str, int]:
        return self.spec.master_addr, self.spec.master_port

    @property
    def device(self) -> torch.device:
        """Where this rank's collective buffers live: the current CUDA device for NCCL, else CPU."""
        import torch

        if self.backend == NCCL:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def connect(self, started: float | None = None) -> None:
        """Build the backend and check that every rank is there (blocks until they all are)."""
        import torch
        import torch.distributed as dist

        started = time.monotonic() if started is None else started
        prefixed = dist.PrefixStore(self.spec.group_name, self.store)
        timeout = _timedelta(self.timeout_s)
        try:
            if self.backend == NCCL:
                if not dist.is_nccl_available() or not torch.cuda.is_available():
                    raise NCCLUnavailableError(
                        f"weight-sync rank {self.rank}: the NCCL backend needs CUDA and a torch "
                        "built with NCCL"
                    )
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                options.is_high_priority_stream = False
                self.pg = dist.ProcessGroupNCCL(prefixed, self.rank, self.world_size, options)
            else:
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                options._devices = [_gloo_device(self.host)]
                self.pg = dist.ProcessGroupGloo(prefixed, self.rank, self.world_size, options)
            # NCCL connects lazily and gloo only checked the store: one all-reduce proves that all
            # ranks are in the same group (and makes NCCL build its communicator now).
            hello = torch.ones(1, dtype=torch.int64, device=self.device)
            self.allreduce(hello, "the joining all-reduce")
        except NCCLUnavailableError:
            raise
        except Exception as exc:
            self.close()
            raise WeightSyncError(
                f"weight-sync group ({self.backend}, {self.world_size} ranks, store "
                f"{self.spec.master_addr}:{self.spec.master_port}): rank {self.rank} did not see every "
                f"other rank join within synchronizer.sync_timeout = {self.timeout_s:g} s; did every "
                f"rollout engine join the group? ({type(exc).__name__}: {_short(exc)})"
            ) from exc
        if int(hello.item()) != self.world_size:
            raise WeightSyncError(
                f"weight-sync group: {int(hello.item())} ranks answered, expected {self.world_size}"
            )
        logger.info(
            "weight-sync group ready: rank %d of %d over %s (%s:%d) in %.1f s",
            self.rank,
            self.world_size,
            self.backend,
            self.spec.master_addr,
            self.spec.master_port,
            time.monotonic() - started,
        )

    # -- collectives -----------------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, what: str = "tensor") -> None:
        """Broadcast ``tensor`` (contiguous, on :attr:`device`) from rank 0, in place."""
        import torch.distributed as dist

        self._require()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        self._wait(self.pg.broadcast([tensor], options), f"broadcast of {what}")

    def allreduce(self, tensor: torch.Tensor, what: str) -> None:
        """Sum ``tensor`` over every rank, in place."""
        import torch.distributed as dist

        self._require()
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        self._wait(self.pg.allreduce([tensor], options), what)

    def _wait(self, work: Any, what: str) -> None:
        try:
            work.wait()
        except Exception as exc:
            raise WeightSyncError(
                f"weight sync ({self.backend}, rank {self.rank} of {self.world_size}): {what} failed or "
                f"timed out (synchronizer.sync_timeout = {self.timeout_s:g} s); a peer left the group "
                f"or stopped answering ({type(exc).__name__}: {_short(exc)})"
            ) from exc

    def close(self) -> None:
        """Leave the group and drop the store (rank 0's store stops listening)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            shutdown = getattr(pg, "shutdown", None) if self.backend == NCCL else None
            if shutdown is not None:
                try:
                    shutdown()
                except Exception as exc:  # pragma: no cover - best effort at teardown
                    logger.warning("weight-sync group shutdown: %s", exc)
            del pg
        self.store = None

    @property
    def closed(self) -> bool:
        return self.store is None

    def _require(self) -> None:
        if self.pg is None:
            raise WeightSyncError(
                f"weight-sync rank {self.rank}: the group is not connected"
                + (" (it was closed)" if self.closed else "")
            )


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def _gloo_device(host: str | None) -> Any:
    import torch.distributed as dist

    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=host or node_ip())


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + " ..."


__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "GroupSpec",
    "NCCLUnavailableError",
    "WeightSyncError",
    "WeightSyncGroup",
    "choose_backend",
    "describe_device",
    "use_device",
]
