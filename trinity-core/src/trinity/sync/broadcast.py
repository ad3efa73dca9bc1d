"""Weights by collective broadcast over the weight-sync group (``synchronizer.sync_method: nccl``,
which runs over NCCL on GPUs and over gloo otherwise; see :mod:`trinity.sync.group`).

The trainer holds a :class:`WeightSender` (rank 0); each rollout rank (a transformers engine,
a vLLM worker) holds a :class:`WeightReceiver`, joined with the :class:`~trinity.sync.group.GroupSpec`
the sender hands out. Each sync: the sender packs the weights (:func:`flatten_state_dict`: tied
tensors once, as ``aliases``) and the small metadata (name, dtype, shape, aliases) reaches the
receivers through Ray; then :func:`send_weights` on rank 0 and :func:`receive_weights` on every
other rank run together. Both first agree on a digest of the metadata and the version
(:func:`handshake`: a broadcast plus an all-reduce of per-rank status, so a mismatch or a
receiver that refuses the weights fails every rank at once instead of hanging), then every
tensor is broadcast from rank 0 as raw bytes in metadata order; receivers allocate an empty
tensor per entry, receive into it and hand batches of ``(name, tensor)`` to a loader (the
transformers engine copies into its parameters; vLLM workers call ``model.load_weights``).

torch is imported inside functions.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trinity.sync.group import (
    DEFAULT_GROUP_NAME,
    NCCL,
    GroupSpec,
    WeightSyncError,
    WeightSyncGroup,
    use_device,
)
from trinity.sync.memory import same_memory_key

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: Bytes of received tensors handed to a loader at once (bounds a receiver's extra memory).
DEFAULT_LOAD_BATCH_BYTES = 256 << 20

# Status codes each rank contributes to the handshake's all-reduce.
_OK, _DIGEST_MISMATCH, _REFUSED = 0, 1, 2


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
        key = same_memory_key(tensor)
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


def handshake(
    group: WeightSyncGroup, metas: Sequence[TensorMeta], version: int, problem: str | None = None
) -> None:
    """All ranks agree on the metadata and version before any weight moves.

    Rank 0 broadcasts its digest; each receiver compares it with its own, or reports
    ``problem`` (weights it cannot load); an all-reduce of per-rank status then tells every
    rank, so all fail together with :class:`WeightSyncError` instead of some hanging.
    """
    import torch

    own = metadata_digest(metas, version)
    digest = torch.tensor(own, dtype=torch.int64, device=group.device)
    group.broadcast(digest, "the metadata digest")
    theirs = [int(v) for v in digest.tolist()]
    status = torch.zeros(group.world_size, dtype=torch.int64, device=group.device)
    code = _OK
    if group.rank != 0 and theirs != own:
        code = _DIGEST_MISMATCH
    elif problem:
        code = _REFUSED
    status[group.rank] = code
    group.allreduce(status, "the handshake")
    codes = {r: int(c) for r, c in enumerate(status.tolist()) if c}
    if not codes:
        return
    if code == _DIGEST_MISMATCH:
        raise WeightSyncError(
            f"weight sync rank {group.rank}: the metadata it was given does not match the trainer's "
            f"(version, tensors, bytes, crc: trainer {theirs}, here {own}); nothing was loaded"
        )
    if code == _REFUSED:
        raise WeightSyncError(f"weight sync rank {group.rank} refused the weights: {problem}")
    described = ", ".join(
        f"rank {r} " + ("got different metadata" if c == _DIGEST_MISMATCH else "refused the weights")
        for r, c in sorted(codes.items())
    )
    raise WeightSyncError(f"weight sync of version {version} cancelled on rank {group.rank}: {described}")


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
    handshake(group, metas, version)
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
    handshake(group, metas, version, problem)
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


# -- the two sides -------------------------------------------------------------------------------


class WeightSender:
    """The trainer's side (rank 0), held by the trainer actor for a stage.

    Creating it opens the group's store (on ``device``'s CUDA device for NCCL); :attr:`spec`
    is what every receiver joins with. :meth:`prepare` snapshots the weights and returns the
    metadata for the explorer; :meth:`send` broadcasts that snapshot (the launcher issues it
    together with the explorer's receive). Calls on one actor run in order, so no train step
    can slip in between.
    """

    def __init__(
        self,
        world_size: int,
        backend: str,
        timeout_s: float,
        group_name: str = DEFAULT_GROUP_NAME,
        *,
        device: Any = None,
    ) -> None:
        if backend == NCCL:
            use_device(device)
        self.group = WeightSyncGroup.create_master(world_size, backend, timeout_s, group_name=group_name)
        self._pending: tuple[list[TensorMeta], list[torch.Tensor], int] | None = None

    @property
    def spec(self) -> GroupSpec:
        return self.group.spec

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


class WeightReceiver:
    """A rollout rank's side: a transformers engine or a vLLM worker holds one.

    :meth:`join` makes it rank ``rank`` of the group ``spec`` describes (leaving any group it
    was in; on ``device``'s CUDA device for NCCL; blocks until every rank is there);
    :meth:`receive` takes part in one broadcast; :meth:`close` leaves (a later stage joins a
    new group). ``who`` names the holder in the error of a receive without a group.
    """

    def __init__(self, who: str = "this rank") -> None:
        self.who = who
        self.group: WeightSyncGroup | None = None

    def join(self, spec: GroupSpec | Mapping[str, Any], rank: int, device: Any = None) -> None:
        spec = GroupSpec.from_wire(spec)
        self.close()
        if spec.backend == NCCL:
            use_device(device)
        self.group = WeightSyncGroup.join(spec, rank)

    def receive(
        self, metas: Iterable[TensorMeta | Sequence[Any]], version: int, load: Any, **options: Any
    ) -> dict[str, float]:
        """:func:`receive_weights` on this rank's group (``options``: ``problem``, ``batch_bytes``)."""
        if self.group is None:
            raise WeightSyncError(f"{self.who} has not joined a weight-sync group")
        return receive_weights(self.group, metas, version, load, **options)

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()


__all__ = [
    "TensorMeta",
    "WeightReceiver",
    "WeightSender",
    "flatten_state_dict",
    "handshake",
    "metadata_digest",
    "parse_metas",
    "receive_weights",
    "send_weights",
]
