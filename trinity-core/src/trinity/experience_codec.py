"""Binary format of :class:`~trinity.experience.Experience` (``serialize`` / ``deserialize``).

The SQL and queue buffers move every experience through this format twice (write, read), so it is
built for speed: the tensors are copied as raw bytes, and only the small non-tensor fields
(texts, reward, ``eid``, ``info``...) are pickled. Layout::

    b"TRXP" | version (1 byte) | 3 pad bytes | meta length (uint32, little endian)
    meta: pickle of (fields: dict, tensors: tuple of (name, dtype, stored dtype, shape, offset))
    payload: each tensor's bytes, in the order of ``tensors``, starting at 8-byte boundaries

``int64`` tensors whose values fit in ``int32`` (token ids, masks) are stored as ``int32`` and
widened back on load: the round trip is exact and a 512-token rollout shrinks by a third, which
is I/O that every commit and every read saves. Blobs in the older format (a pickled dict) are
still read. Pickle means: trusted storage only.
"""

from __future__ import annotations

import pickle
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.experience import Experience

MAGIC = b"TRXP"
VERSION = 1
_HEADER = struct.Struct("<4sB3xI")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# dtypes numpy lacks travel as same-sized integers and are viewed back on load.
_VIEW_AS = {"bfloat16": "int16"}


def _to_numpy(tensor: Any) -> tuple[Any, str, str]:
    """``(array to store, dtype name, stored dtype name)`` for a tensor.

    numpy rather than torch ops, and dtype names from torch (``str(ndarray.dtype)`` alone
    costs 5 µs): at tens of thousands of experiences per second every microsecond shows.
    """
    np = _modules()[0]
    t = tensor
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    name = str(t.dtype)[6:]  # "torch.int64" -> "int64"
    stored = name
    if name in _VIEW_AS:
        stored = _VIEW_AS[name]
        t = t.view(_dtype(stored))
    arr = t.numpy()
    if name == "int64" and arr.size and arr.min() >= _INT32_MIN and arr.max() <= _INT32_MAX:
        arr, stored = arr.astype(np.int32), "int32"
    if not arr.flags.c_contiguous:  # views and transposes; astype keeps a Fortran layout
        arr = np.ascontiguousarray(arr)
    return arr, name, stored


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def encode(exp: Experience, tensor_fields: tuple[str, ...], plain_fields: tuple[str, ...]) -> bytes:
    """``exp`` in the binary format (``tensor_fields`` go to the payload, the rest to meta)."""
    fields: dict[str, Any] = {}
    for name in plain_fields:
        value = getattr(exp, name)
        if name == "eid":
            e = value
            fields[name] = (e.batch, e.task, e.run, e.step, e.suffix)
        elif value is not None:
            fields[name] = value
    specs = []
    chunks: list[Any] = []
    offset = 0
    for name in tensor_fields:
        value = getattr(exp, name)
        if value is None:
            continue
        stored, dtype_name, stored_name = _to_numpy(value)
        pad = -offset % 8
        if pad:
            chunks.append(b"\0" * pad)
            offset += pad
        specs.append((name, dtype_name, stored_name, stored.shape, offset))
        chunks.append(stored.data)  # a buffer view: join copies it once, straight into the blob
        offset += stored.nbytes
    meta = pickle.dumps((fields, tuple(specs)), protocol=5)
    return b"".join([_HEADER.pack(MAGIC, VERSION, len(meta)), meta, *chunks])


def decode(blob: bytes) -> dict[str, Any]:
    """The keyword arguments of ``Experience(...)`` encoded in ``blob`` (``eid`` as a tuple)."""
    np, torch = _modules()
    magic, version, meta_len = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise ValueError("not an Experience blob (bad magic)")
    if version != VERSION:
        raise ValueError(
            f"Experience blob format version {version} is newer than this trinity-core reads "
            f"({VERSION}); upgrade trinity-core"
        )
    start = _HEADER.size + meta_len
    fields, specs = pickle.loads(blob[_HEADER.size : start])
    if specs:
        # One writable copy of the payload that the tensors view (torch warns about read-only
        # buffers, and one copy for all costs less than one per tensor).
        payload = bytearray(blob[start:])
        for name, dtype_name, stored_name, shape, offset in specs:
            count = 1
            for n in shape:
                count *= n
            arr = np.frombuffer(payload, stored_name, count, offset)
            if len(shape) != 1:
                arr = arr.reshape(shape)
            if stored_name != dtype_name and dtype_name not in _VIEW_AS:
                arr = arr.astype(dtype_name)
            t = torch.from_numpy(arr)
            if dtype_name in _VIEW_AS:
                t = t.view(_dtype(dtype_name))
            fields[name] = t
    return fields


_MODULES: tuple[Any, Any] | None = None


def _modules() -> tuple[Any, Any]:
    """``(numpy, torch)``, imported on first use (the core imports neither at start-up)."""
    global _MODULES
    if _MODULES is None:
        import numpy
        import torch

        _MODULES = (numpy, torch)
    return _MODULES
