"""File experience storage: JSON lines, for debugging and for ``explore`` mode output.

One experience per line (``Experience.to_dict`` with tensors as lists, images' bytes as
base64), human-readable and easy
to load with ``datasets`` or pandas. Appends take an exclusive ``flock`` so several writer
processes can share one file without interleaving lines.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import BufferExhausted, ReaderBase, WriterBase

if TYPE_CHECKING:
    from trinity.experience import Experience


def experience_file(path: str, name: str = "experience") -> str:
    """The jsonl file for a buffer: ``path`` itself when it names a ``.jsonl``/``.json`` file,
    else ``<path>/<name>.jsonl``."""
    if path.endswith((".jsonl", ".json")):
        return path
    return os.path.join(path, f"{name}.jsonl")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):  # an image's encoded bytes (Experience.images)
        return base64.b64encode(value).decode("ascii")
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def experience_to_json(exp: Experience) -> str:
    """One JSON line for ``exp``."""
    return json.dumps(_jsonable(exp.to_dict()), ensure_ascii=False)


def experience_from_json(line: str) -> Experience:
    """Inverse of :func:`experience_to_json` (tensors come back from lists)."""
    from trinity.experience import Experience

    data = json.loads(line)
    if data.get("images"):
        data["images"] = [base64.b64decode(im) for im in data["images"]]
    return Experience.from_dict(data)


class FileWriter(WriterBase):
    """:class:`~trinity.buffer.base.BufferWriter` appending JSON lines to one file."""

    def __init__(self, path: str, name: str = "experience") -> None:
        self.file = experience_file(path, name)
        os.makedirs(os.path.dirname(os.path.abspath(self.file)), exist_ok=True)

    def write(self, experiences: Sequence[Experience]) -> None:
        """Append ``experiences`` (one locked write, flushed and fsync'ed)."""
        import fcntl

        payload = "".join(experience_to_json(e) + "\n" for e in experiences)
        with open(self.file, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def finish(self) -> None:
        """Nothing to do: every write is already durable."""


class FileReader(ReaderBase):
    """:class:`~trinity.buffer.base.BufferReader` over a jsonl experience file.

    Reads sequentially; the position (line number) is the state. A line that does not parse is
    an error naming the file and line (experience files are machine-written, so that is a bug or
    a truncated file, not data to skip silently).
    """

    def __init__(self, path: str, name: str = "experience") -> None:
        self.file = experience_file(path, name)
        self.line = 0

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """The next ``batch_size`` experiences; :class:`BufferExhausted` at the end of the file."""
        if not os.path.exists(self.file):
            raise FileNotFoundError(f"experience file {self.file} does not exist")
        out: list[Experience] = []
        with open(self.file, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh):
                if lineno < self.line:
                    continue
                if len(out) >= batch_size:
                    break
                if not line.endswith("\n"):
                    break  # a writer is mid-append; read it next time
                try:
                    out.append(experience_from_json(line))
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{self.file}:{lineno + 1}: not a valid experience: {exc}") from exc
                self.line = lineno + 1
        if not out:
            raise BufferExhausted(f"{self.file}: no more experiences after line {self.line}")
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"line": <lines consumed>}``."""
        return {"line": self.line}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the saved line."""
        self.line = int(state.get("line", 0))
