"""Experience sources for the Experiences page: an SQL buffer or a JSON-lines file.

Both page through their rows without loading them all: the SQL source asks the database for
one page of the queryable columns (``LIMIT``/``OFFSET`` over the primary key, no blobs), the
file source keeps an index of line offsets and small summaries that grows as the file does. A
buffer being written is read safely: SQLite in WAL mode gives readers a consistent snapshot
(the studio only ever runs ``SELECT``), and the file source only reads lines that end in a
newline, so a half-written last line is picked up on a later request.

Whole experiences (tokens, logprobs, advantages, masks) are decoded one at a time, when opened.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

PREVIEW_CHARS = 300
_CHUNK_BYTES = 64 << 20  # the longest line a file source reads
_TENSOR_KEYS = ("tokens", "logprobs", "action_mask", "advantages", "returns", "token_level_reward")


@dataclass
class Filters:
    """What the page filters on: a reward range and an explorer step."""

    min_reward: float | None = None
    max_reward: float | None = None
    step: int | None = None

    def match(self, row: dict[str, Any]) -> bool:
        reward = row.get("reward")
        if self.min_reward is not None and (reward is None or reward < self.min_reward):
            return False
        if self.max_reward is not None and (reward is None or reward > self.max_reward):
            return False
        return self.step is None or row.get("explorer_step") == self.step


class SourceError(ValueError):
    """A source that cannot be opened; the message is for people."""


def open_source(source: str, table: str | None = None) -> SQLSource | FileSource:
    """An SQL source for a SQLAlchemy URL or a ``.db``/``.sqlite`` file, a file source for
    ``.jsonl``/``.json`` files (a buffer folder holding ``<name>.jsonl`` works too)."""
    source = source.strip()
    if "://" in source or source.endswith((".db", ".sqlite", ".sqlite3")):
        return SQLSource(source, table)
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith(".jsonl"))
        if len(files) != 1:
            raise SourceError(f"{path} is a folder with {len(files)} .jsonl files; pick one of them")
        path = os.path.join(path, files[0])
    if not os.path.isfile(path):
        raise SourceError(f"no experience file at {path}; give a .jsonl file, a .db file or an SQL URL")
    return FileSource(path)


def _preview(text: Any) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _step_of(batch: Any) -> int | None:
    if isinstance(batch, int):
        return batch
    if isinstance(batch, str) and batch.isdigit():
        return int(batch)
    return None


def detail_from_dict(data: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """What the token view needs from one experience (a ``to_dict``-like mapping)."""
    out: dict[str, Any] = {}
    for key in _TENSOR_KEYS:
        value = data.get(key)
        if hasattr(value, "tolist"):
            value = value.tolist()
        out[key] = value
    eid = data.get("eid") or {}
    out.update(
        prompt_length=data.get("prompt_length"),
        reward=data.get("reward"),
        model_version=data.get("model_version"),
        prompt_text=data.get("prompt_text"),
        response_text=data.get("response_text"),
        eid=eid,
        info=_plain(data.get("info") or {}),
        metrics=_plain(data.get("metrics") or {}),
        messages=_plain(data.get("messages")),
    )
    tokens = out["tokens"] or []
    out["pieces"] = _pieces(tokenizer, tokens) if tokenizer is not None else None
    return out


def _pieces(tokenizer: Any, tokens: list[int]) -> list[str]:
    return [tokenizer.decode([t]) for t in tokens]


def _plain(value: Any) -> Any:
    """JSON-safe copy (tensors and numpy values as lists/numbers, anything else as text)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class SQLSource:
    """An experience table of an SQL buffer (:mod:`trinity.buffer.sql_schema`), read-only."""

    kind = "sql"

    def __init__(self, url: str, table: str | None = None) -> None:
        import sqlalchemy as sa

        from trinity.buffer.sql_schema import normalise_url, table_name_for

        self.url = normalise_url(url)
        if self.url.startswith("sqlite:///"):
            file = self.url[len("sqlite:///") :].split("?")[0]
            if not os.path.isfile(file):
                raise SourceError(f"no SQLite database at {file}")
        # No "begin IMMEDIATE" listener (trinity.buffer's engine has one): pure readers take no
        # write lock, so the studio never stalls a run writing the same buffer.
        args = {"timeout": 10} if self.url.startswith("sqlite") else {}
        self.engine = sa.create_engine(self.url, connect_args=args)
        try:
            names = sa.inspect(self.engine).get_table_names()
        except Exception as exc:
            raise SourceError(f"cannot open {self.url}: {str(exc).splitlines()[0]}") from None
        self.tables = sorted(n for n in names if f"{n}_blobs" in names)
        if table:
            table = table_name_for(table)
        elif len(self.tables) == 1:
            table = self.tables[0]
        if table not in self.tables:
            found = ", ".join(self.tables) or "none"
            raise SourceError(
                f"{self.url} holds buffers {found}; pick one"
                if table is None
                else f"no buffer {table!r} in {self.url}; buffers: {found}"
            )
        self.table_name = table
        meta = sa.MetaData()
        self.table = sa.Table(table, meta, autoload_with=self.engine)
        self.blobs = sa.Table(f"{table}_blobs", meta, autoload_with=self.engine)

    def _where(self, filters: Filters) -> list[Any]:
        t = self.table
        clauses = []
        if filters.min_reward is not None:
            clauses.append(t.c.reward >= filters.min_reward)
        if filters.max_reward is not None:
            clauses.append(t.c.reward <= filters.max_reward)
        if filters.step is not None and "explorer_step" in t.c:
            clauses.append(t.c.explorer_step == filters.step)
        return clauses

    def page(self, offset: int, limit: int, filters: Filters) -> dict[str, Any]:
        """``{"total", "rows"}``: one page of rows in id order, the queryable columns only."""
        import sqlalchemy as sa

        t = self.table
        where = self._where(filters)

        def col(name: str) -> Any:
            return (t.c[name] if name in t.c else sa.null()).label(name)

        stmt = (
            sa.select(
                t.c.id,
                col("task_id"),
                col("run_id"),
                col("model_version"),
                col("reward"),
                col("consumed"),
                col("consumed_step"),
                col("explorer_step"),
                sa.func.substr(t.c.prompt_text, 1, PREVIEW_CHARS).label("prompt"),
                sa.func.substr(t.c.response_text, 1, PREVIEW_CHARS).label("response"),
            )
            .where(*where)
            .order_by(t.c.id)
            .limit(limit)
            .offset(offset)
        )
        count = sa.select(sa.func.count()).select_from(t).where(*where)
        with self.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(stmt)]
            total = conn.execute(count).scalar_one()
        return {"total": total, "rows": rows}

    def item(self, item_id: int, tokenizer: Any = None) -> dict[str, Any]:
        """One whole experience, decoded from its blob."""
        import sqlalchemy as sa

        from trinity.experience import Experience

        with self.engine.connect() as conn:
            blob = conn.execute(sa.select(self.blobs.c.blob).where(self.blobs.c.id == item_id)).scalar()
            row = conn.execute(sa.select(self.table).where(self.table.c.id == item_id)).first()
        if blob is None or row is None:
            raise KeyError(item_id)
        out = detail_from_dict(Experience.deserialize(blob).to_dict(), tokenizer)
        extra = dict(row._mapping)
        out.update(
            id=item_id, consumed_step=extra.get("consumed_step"), explorer_step=extra.get("explorer_step")
        )
        return out

    def export(self, filters: Filters, chunk: int = 256) -> Iterator[str]:
        """JSON lines of every matching experience, read ``chunk`` rows at a time (keyset paging)."""
        import sqlalchemy as sa

        from trinity.buffer.file import experience_to_json
        from trinity.experience import Experience

        t, b = self.table, self.blobs
        last = -1
        while True:
            stmt = (
                sa.select(t.c.id, b.c.blob)
                .join(b, b.c.id == t.c.id)
                .where(t.c.id > last, *self._where(filters))
                .order_by(t.c.id)
                .limit(chunk)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
            if not rows:
                return
            for row in rows:
                yield experience_to_json(Experience.deserialize(row.blob)) + "\n"
            last = rows[-1].id

    def close(self) -> None:
        self.engine.dispose()


class FileSource:
    """A JSON-lines experience file (``trinity debug --output-file``, a ``file`` buffer).

    Row ids are line numbers from 1. The index grows with the file; a file that shrank (was
    rewritten) is indexed again from the start.
    """

    kind = "file"

    def __init__(self, path: str) -> None:
        self.path = path
        self.tables: list[str] = []
        self.table_name = None
        self._offsets: list[int] = []
        self._rows: list[dict[str, Any]] = []
        self._scanned = 0
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        size = os.path.getsize(self.path)
        if size < self._scanned:
            self._offsets, self._rows, self._scanned = [], [], 0
        with open(self.path, "rb") as f:
            f.seek(self._scanned)
            while self._scanned < size:
                # In chunks, so a multi-gigabyte file is never read into memory at once.
                data = f.read(min(_CHUNK_BYTES, size - self._scanned))
                end = data.rfind(b"\n")
                if end < 0:
                    if len(data) < _CHUNK_BYTES:
                        return  # only the start of a line being written
                    raise SourceError(f"{self.path}: a line longer than {_CHUNK_BYTES >> 20} MiB")
                position = self._scanned
                for line in data[: end + 1].split(b"\n")[:-1]:
                    if line.strip():
                        self._offsets.append(position)
                        self._rows.append(self._summary(len(self._rows) + 1, line))
                    position += len(line) + 1
                self._scanned += end + 1
                f.seek(self._scanned)

    @staticmethod
    def _summary(number: int, line: bytes) -> dict[str, Any]:
        try:
            data = json.loads(line)
        except ValueError:
            return {"id": number, "error": "not a JSON line"}
        eid = data.get("eid") or {}
        return {
            "id": number,
            "task_id": eid.get("task"),
            "run_id": eid.get("run"),
            "model_version": data.get("model_version"),
            "reward": data.get("reward"),
            "consumed": None,
            "consumed_step": None,
            "explorer_step": _step_of(eid.get("batch")),
            "prompt": _preview(data.get("prompt_text")),
            "response": _preview(data.get("response_text")),
        }

    def _matching(self, filters: Filters) -> list[dict[str, Any]]:
        with self._lock:
            self._refresh()
            rows = self._rows
        if filters == Filters():
            return rows
        return [r for r in rows if filters.match(r)]

    def page(self, offset: int, limit: int, filters: Filters) -> dict[str, Any]:
        """``{"total", "rows"}``: one page of the file's lines (summaries)."""
        rows = self._matching(filters)
        return {"total": len(rows), "rows": rows[offset : offset + limit]}

    def _line(self, item_id: int) -> bytes:
        with self._lock:
            self._refresh()
            if not 1 <= item_id <= len(self._offsets):
                raise KeyError(item_id)
            start = self._offsets[item_id - 1]
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.readline()

    def item(self, item_id: int, tokenizer: Any = None) -> dict[str, Any]:
        """One whole experience: line ``item_id`` of the file."""
        data = json.loads(self._line(item_id))
        out = detail_from_dict(data, tokenizer)
        out.update(
            id=item_id, consumed_step=None, explorer_step=_step_of((data.get("eid") or {}).get("batch"))
        )
        return out

    def export(self, filters: Filters) -> Iterator[str]:
        """The matching lines as they are in the file."""
        for row in self._matching(filters):
            yield self._line(row["id"]).decode("utf-8").rstrip("\n") + "\n"

    def close(self) -> None:
        pass
