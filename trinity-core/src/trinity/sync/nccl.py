"""Weight sync by collective broadcast (``synchronizer.sync_method: nccl``).

At stage start the launcher builds one process group spanning the trainer (rank 0) and every
rollout worker (ranks ``1..N``): each engine reports the devices of its ranks (one for a
``transformers`` engine, one per vLLM worker), the explorer hands out rank offsets in engine
order, and the group is built straight from a ``TCPStore`` (its master on the trainer's node,
on a free port) and a ``PrefixStore`` — never through ``torch.distributed.init_process_group``,
so a default group the trainer already uses (FSDP) is left alone. It is torn down at stage end.

Each sync: the trainer packs its weights (:func:`flatten_state_dict`: tied tensors once, as
``aliases``) and the launcher passes the small metadata (name, dtype, shape, aliases) to the
explorer through Ray; then :func:`send_weights` on rank 0 and :func:`receive_weights` on every
other rank run together. Both first agree on a digest of the metadata and the version
(a broadcast plus an all-reduce of per-rank status, so a mismatch or a receiver that refuses the
weights fails every rank at once instead of hanging), then every tensor is broadcast from rank 0
as raw bytes in metadata order; receivers allocate an empty tensor per entry, receive into it
and hand batches of ``(name, tensor)`` to a loader (the transformers engine copies into its
parameters; vLLM workers call ``model.load_weights``).

Backend (:func:`choose_backend`): NCCL when every rank is on its own CUDA device, gloo
otherwise — the same code path on CPU, with the tensors staged in host memory. Every wait is
bounded by ``synchronizer.sync_timeout``; a peer that never joins or stops answering gives a
:class:`WeightSyncError` naming the rank and the timeout. With NCCL, torch's watchdog may end
the process on a timed-out collective instead (the launcher then reports the dead actor).

torch is imported inside functions: this module is imported by the launcher.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
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
#: Bytes of received tensors handed to a loader at once (bounds a receiver's extra memory).
DEFAULT_LOAD_BATCH_BYTES = 256 << 20

# Status codes each rank contributes to the handshake's all-reduce.
_OK, _DIGEST_MISMATCH, _REFUSED = 0, 1, 2


class NCCLUnavailableError(RuntimeError):
    """The NCCL backend was asked for where it cannot work (a rank without its own GPU)."""


class WeightSyncError(RuntimeError):
    """The weight-sync group could not be formed, timed out, or its ranks disagreed."""


# -- metadata ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """One broadcast tensor: its name, dtype (``"bfloat16"``), shape and the other names it
    carries (tied weights are sent once)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    def torch_dtype(self) -> torch.dtype:
        import torch

        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise WeightSyncError(f"weight metadata of {self.name!r}: unknown dtype {self.dtype!r}")
        return dtype

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype().itemsize

    def to_wire(self) -> list[Any]:
        """Plain lists and strings: what crosses Ray and vLLM's ``collective_rpc`` (msgpack)."""
        return [self.name, self.dtype, list(self.shape), list(self.aliases)]

    @classmethod
    def from_wire(cls, item: TensorMeta | Sequence[Any]) -> TensorMeta:
        if isinstance(item, TensorMeta):
            return item
        name, dtype, shape, *rest = item
        aliases = tuple(rest[0]) if rest else ()
        return cls(str(name), str(dtype), tuple(int(s) for s in shape), tuple(str(a) for a in aliases))


def parse_metas(metas: Iterable[TensorMeta | Sequence[Any]]) -> list[TensorMeta]:
    """:class:`TensorMeta` objects from metadata in wire form (or already parsed)."""
    return [TensorMeta.from_wire(m) for m in metas]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flatten_state_dict(state_dict: Mapping[str, torch.Tensor]) -> tuple[list[TensorMeta], list[torch.Tensor]]:
    """Metadata and contiguous tensors to broadcast for ``state_dict``, in its order.

    Entries that are views of the same memory with the same shape, strides and dtype (tied
    embeddings) are sent once, the later names becoming ``aliases`` of the first.
    """
    metas: list[TensorMeta] = []
    tensors: list[torch.Tensor] = []
    first: dict[tuple[Any, ...], int] = {}
    aliases: dict[int, list[str]] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in first and tensor.numel() > 0:
            aliases[first[key]].append(name)
            continue
        first[key] = len(metas)
        aliases[len(metas)] = []
        metas.append(TensorMeta(name, _dtype_name(tensor.dtype), tuple(tensor.shape)))
        tensors.append(tensor.contiguous())
    metas = [TensorMeta(m.name, m.dtype, m.shape, tuple(aliases[i])) for i, m in enumerate(metas)]
    return metas, tensors


def metadata_digest(metas: Sequence[TensorMeta], version: int) -> list[int]:
    """``[version, tensor count, total bytes, crc32 of names/dtypes/shapes]`` — what every rank
    must agree on before the tensors are broadcast."""
    text = "\n".join(f"{','.join(m.names)}|{m.dtype}|{'x'.join(map(str, m.shape))}" for m in metas)
    return [int(version), len(metas), sum(m.nbytes for m in metas), zlib.crc32(text.encode())]


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

    Rank 0 calls :meth:`create_master` (binds the store on a free port; :attr:`address` is what
    the other ranks need) and then :meth:`connect`; the others call :meth:`join`, which connects.
    Every rank's :meth:`connect` blocks until all ``world_size`` ranks are there (or raises
    :class:`WeightSyncError` after ``timeout_s``), so ranks must be started concurrently.
    """

    def __init__(
        self,
        store: Any,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        group_name: str = DEFAULT_GROUP_NAME,
        host: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"weight-sync backend {backend!r}: use one of {BACKENDS}")
        if not 0 <= rank < world_size:
            raise ValueError(f"weight-sync rank {rank} is outside a group of {world_size}")
        self.store = store
        self.master_addr = master_addr
        self.master_port = int(master_port)
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.group_name = group_name
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
        store = dist.TCPStore(host, port, world_size, True, _timedelta(timeout_s), wait_for_workers=False)
        return cls(store, host, store.port, 0, world_size, backend, timeout_s, group_name, host)

    @classmethod
    def join(
        cls,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        *,
        group_name: str = DEFAULT_GROUP_NAME,
        host: str | None = None,
    ) -> WeightSyncGroup:
        """Rank ``rank`` (>= 1): connect to rank 0's store and form the group (blocks)."""
        import torch.distributed as dist

        if rank < 1:
            raise ValueError(f"join is for ranks >= 1 (rank 0 is the trainer), got {rank}")
        start = time.monotonic()
        try:
            store = dist.TCPStore(master_addr, int(master_port), world_size, False, _timedelta(timeout_s))
        except Exception as exc:
            raise WeightSyncError(
                f"weight-sync rank {rank}/{world_size}: could not reach the trainer's store at "
                f"{master_addr}:{master_port} within {timeout_s:g} s (synchronizer.sync_timeout): {exc}"
            ) from exc
        group = cls(store, master_addr, master_port, rank, world_size, backend, timeout_s, group_name, host)
        group.connect(started=start)
        return group

    @property
    def address(self) -> tuple[str, int]:
        return self.master_addr, self.master_port

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
        prefixed = dist.PrefixStore(self.group_name, self.store)
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
            self._allreduce(hello, "the joining all-reduce")
        except NCCLUnavailableError:
            raise
        except Exception as exc:
            self.close()
            raise WeightSyncError(
                f"weight-sync group ({self.backend}, {self.world_size} ranks, store "
                f"{self.master_addr}:{self.master_port}): rank {self.rank} did not see every other rank "
                f"join within synchronizer.sync_timeout = {self.timeout_s:g} s; did every rollout engine "
                f"join the group? ({type(exc).__name__}: {_short(exc)})"
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
            self.master_addr,
            self.master_port,
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

    def _allreduce(self, tensor: torch.Tensor, what: str) -> None:
        import torch.distributed as dist

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

    def handshake(self, metas: Sequence[TensorMeta], version: int, problem: str | None = None) -> None:
        """All ranks agree on the metadata and version before any weight moves.

        Rank 0 broadcasts its digest; each receiver compares it with its own, or reports
        ``problem`` (weights it cannot load); an all-reduce of per-rank status then tells every
        rank, so all fail together with :class:`WeightSyncError` instead of some hanging.
        """
        import torch

        self._require()
        own = metadata_digest(metas, version)
        digest = torch.tensor(own, dtype=torch.int64, device=self.device)
        self.broadcast(digest, "the metadata digest")
        theirs = [int(v) for v in digest.tolist()]
        status = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
        code = _OK
        if self.rank != 0 and theirs != own:
            code = _DIGEST_MISMATCH
        elif problem:
            code = _REFUSED
        status[self.rank] = code
        self._allreduce(status, "the handshake")
        codes = {r: int(c) for r, c in enumerate(status.tolist()) if c}
        if not codes:
            return
        if code == _DIGEST_MISMATCH:
            raise WeightSyncError(
                f"weight sync rank {self.rank}: the metadata it was given does not match the trainer's "
                f"(version, tensors, bytes, crc: trainer {theirs}, here {own}); nothing was loaded"
            )
        if code == _REFUSED:
            raise WeightSyncError(f"weight sync rank {self.rank} refused the weights: {problem}")
        described = ", ".join(
            f"rank {r} " + ("got different metadata" if c == _DIGEST_MISMATCH else "refused the weights")
            for r, c in sorted(codes.items())
        )
        raise WeightSyncError(f"weight sync of version {version} cancelled on rank {self.rank}: {described}")

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


# -- one sync ------------------------------------------------------------------------------------


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's memory as a flat uint8 tensor: the broadcast is dtype-agnostic and bitwise."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


def send_weights(
    group: WeightSyncGroup,
    metas: Sequence[TensorMeta],
    tensors: Sequence[torch.Tensor],
    version: int,
) -> dict[str, float]:
    """Rank 0: broadcast ``tensors`` (described by ``metas``) as ``version``; returns stats."""
    import torch

    if group.rank != 0:
        raise ValueError(f"send_weights runs on rank 0 (the trainer), not rank {group.rank}")
    if len(metas) != len(tensors):
        raise ValueError(f"send_weights: {len(metas)} metadata entries for {len(tensors)} tensors")
    start = time.monotonic()
    group.handshake(metas, version)
    device = group.device
    sent = 0
    for meta, tensor in zip(metas, tensors):
        if meta.numel == 0:
            continue
        tensor = tensor.detach().to(device).contiguous()
        group.broadcast(_as_bytes(tensor), meta.name)
        sent += tensor.numel() * tensor.element_size()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"bytes": float(sent), "tensors": float(len(metas)), "seconds": time.monotonic() - start}


def receive_weights(
    group: WeightSyncGroup,
    metas: Iterable[TensorMeta | Sequence[Any]],
    version: int,
    load: Callable[[list[tuple[str, torch.Tensor]]], Any],
    *,
    problem: str | None = None,
    batch_bytes: int = DEFAULT_LOAD_BATCH_BYTES,
) -> dict[str, float]:
    """A receiving rank: take part in every broadcast of ``version`` and hand the tensors to
    ``load`` in batches of about ``batch_bytes`` (tied names each get the same tensor).

    ``problem`` (a reason this rank cannot load these weights) cancels the sync on every rank
    during the handshake. If ``load`` fails, the remaining broadcasts are still received (so the
    trainer is not left waiting) and the error is raised at the end.
    """
    import torch

    metas = parse_metas(metas)
    start = time.monotonic()
    group.handshake(metas, version, problem)
    device = group.device
    batch: list[tuple[str, torch.Tensor]] = []
    pending = 0
    received = 0
    failure: BaseException | None = None

    def flush() -> None:
        nonlocal batch, pending, failure
        if batch and failure is None:
            try:
                load(batch)
            except Exception as exc:
                failure = exc
        batch, pending = [], 0

    for meta in metas:
        tensor = torch.empty(meta.shape, dtype=meta.torch_dtype(), device=device)
        if meta.numel:
            group.broadcast(_as_bytes(tensor), meta.name)
        received += meta.nbytes
        batch.extend((name, tensor) for name in meta.names)
        pending += meta.nbytes
        if pending >= batch_bytes:
            flush()
    flush()
    if failure is not None:
        raise WeightSyncError(
            f"weight sync rank {group.rank}: loading version {version} failed: {failure}"
        ) from failure
    return {"bytes": float(received), "tensors": float(len(metas)), "seconds": time.monotonic() - start}


class WeightSender:
    """The trainer's side (rank 0), held by the trainer actor for a stage.

    :meth:`prepare` snapshots the weights and returns the metadata for the explorer;
    :meth:`send` broadcasts that snapshot (the launcher issues it together with the explorer's
    receive). Calls on one actor run in order, so no train step can slip in between.
    """

    def __init__(self, world_size: int, backend: str, timeout_s: float, group_name: str = DEFAULT_GROUP_NAME):
        self.group = WeightSyncGroup.create_master(world_size, backend, timeout_s, group_name=group_name)
        self._pending: tuple[list[TensorMeta], list[torch.Tensor], int] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.group.address

    def connect(self) -> None:
        self.group.connect()

    def prepare(self, state_dict: Mapping[str, torch.Tensor], version: int) -> list[list[Any]]:
        metas, tensors = flatten_state_dict(state_dict)
        self._pending = (metas, tensors, version)
        return [m.to_wire() for m in metas]

    def send(self) -> dict[str, float]:
        if self._pending is None:
            raise WeightSyncError("weight sync: send() without prepare() (no weights snapshot)")
        metas, tensors, version = self._pending
        self._pending = None
        stats = send_weights(self.group, metas, tensors, version)
        logger.info(
            "sent weights version %d over %s: %d tensors, %.1f MB in %.2f s",
            version,
            self.group.backend,
            len(metas),
            stats["bytes"] / 1e6,
            stats["seconds"],
        )
        return stats

    def close(self) -> None:
        self._pending = None
        self.group.close()


__all__ = [
    "BACKEND_ENV",
    "NCCLUnavailableError",
    "TensorMeta",
    "WeightSender",
    "WeightSyncError",
    "WeightSyncGroup",
    "choose_backend",
    "describe_device",
    "flatten_state_dict",
    "metadata_digest",
    "parse_metas",
    "receive_weights",
    "send_weights",
    "use_device",
]
