"""SQL experience storage (SQLAlchemy 2 Core): durable, shared by processes, read exactly once.

One table per buffer. Each row holds the experience as a binary blob (``Experience.serialize()``)
plus queryable columns (reward, model version, task id, run id, prompt/response text). Readers
*claim* rows by flipping ``consumed`` inside a single ``UPDATE ... RETURNING`` statement run in
one transaction, so two readers (threads, processes, machines) never get the same row:

- SQLite: the transaction starts with ``BEGIN IMMEDIATE`` (takes the write lock up front, so the
  claim never has to upgrade a read lock and cannot dead-lock); WAL lets readers and writers
  overlap, ``busy_timeout`` makes contenders wait instead of failing.
- Other databases (PostgreSQL): the inner ``SELECT`` uses ``FOR UPDATE SKIP LOCKED`` so
  concurrent claimers skip each other's rows instead of blocking.

``consumed`` is persistent, so a reader reopened after a restart continues where reading stopped.
Writers register in a small ``<table>_writers`` table; when every registered writer has called
``finish()`` and no unread row is left, readers raise :class:`BufferExhausted`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import BufferExhausted

if TYPE_CHECKING:
    import sqlalchemy as sa

    from trinity.experience import Experience

logger = logging.getLogger(__name__)

_DEFAULT_BUSY_TIMEOUT_MS = 60_000
_TEXT_LIMIT = 1_000_000
_INIT_LOCK = threading.Lock()  # keep pathological texts from bloating the queryable columns


def table_name_for(name: str | None) -> str:
    """A safe SQL table name derived from a buffer ``name`` (``my-buffer`` -> ``my_buffer``)."""
    cleaned = re.sub(r"\W", "_", name or "experience").strip("_") or "experience"
    return cleaned if not cleaned[0].isdigit() else f"t_{cleaned}"


def normalise_url(path: str) -> str:
    """Accept a SQLAlchemy URL or a bare file path (made into ``sqlite:///<abs path>``)."""
    if "://" in path:
        return path
    return f"sqlite:///{os.path.abspath(path)}"


def _sqlite_file(url: str) -> str | None:
    if not url.startswith("sqlite:///"):
        return None
    file = url[len("sqlite:///") :].split("?")[0]
    return None if file in ("", ":memory:") else file


def create_sql_engine(url: str, busy_timeout_ms: int = _DEFAULT_BUSY_TIMEOUT_MS) -> sa.Engine:
    """An engine configured for concurrent use of one database by many processes."""
    import sqlalchemy as sa

    url = normalise_url(url)
    file = _sqlite_file(url)
    if file is not None:
        os.makedirs(os.path.dirname(os.path.abspath(file)) or ".", exist_ok=True)
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)

    # A pooled connection stays open: closing the last connection of a WAL database checkpoints
    # it, which would cost a checkpoint per write. SQLStorage makes a fresh engine after a fork.
    engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite would otherwise defer it).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # Only takes effect on a new file: an 8 KiB page holds a typical experience blob whole.
        cur.execute("PRAGMA page_size=8192")
        cur.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL survives process crashes (SIGKILL); only an OS crash may lose the last commits.
        cur.execute("PRAGMA synchronous=NORMAL")
        # Checkpoint (and fsync) every ~64 MiB of WAL rather than every 4 MiB: experiences are big.
        cur.execute("PRAGMA wal_autocheckpoint=16384")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writes take the lock up front; pure reads (``read_only`` option) stay deferred so they
        # never queue behind writers (WAL gives them a consistent snapshot).
        mode = "DEFERRED" if conn.get_execution_options().get("read_only") else "IMMEDIATE"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _define_tables(metadata: sa.MetaData, table: str) -> tuple[sa.Table, sa.Table, sa.Table]:
    import sqlalchemy as sa

    experiences = sa.Table(
        table,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("consumed", sa.Integer, nullable=False, default=0),
        sa.Column("priority", sa.Float, nullable=False, default=0.0),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("model_version", sa.Integer, nullable=False, default=0),
        sa.Column("task_id", sa.String(256), nullable=True),
        sa.Column("run_id", sa.Integer, nullable=True),
        sa.Column("prompt_text", sa.Text, nullable=True),
        sa.Column("response_text", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("consumed_at", sa.Float, nullable=True),
        sa.Column("writer_id", sa.String(64), nullable=True),
        # Read order: FIFO scans (consumed, id); priority reads scan (consumed, priority, id).
        sa.Index(f"ix_{table}_fifo", "consumed", "id"),
        sa.Index(f"ix_{table}_priority", "consumed", "priority", "id"),
        sa.Index(f"ix_{table}_task", "task_id"),
    )
    # Blobs live in their own table so that claiming a row (an UPDATE of ``consumed``) rewrites a
    # ~100-byte record instead of the whole multi-kilobyte experience.
    blobs = sa.Table(
        f"{table}_blobs",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("blob", sa.LargeBinary, nullable=False),
    )
    writers = sa.Table(
        f"{table}_writers",
        metadata,
        sa.Column("writer_id", sa.String(64), primary_key=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
    )
    return experiences, blobs, writers


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT]


class SQLStorage:
    """One experience table in a SQL database; picklable (reconnects lazily in each process).

    Args:
        url: SQLAlchemy URL (``sqlite:///buffer.db``, ``postgresql://...``) or a file path.
        table: table name (usually the buffer's ``name``).
        priority_fn: optional ``f(experience) -> float``; rows are then read highest first.
    """

    def __init__(
        self,
        url: str,
        table: str = "experience",
        priority_fn: Callable[[Experience], float] | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.table_name = table_name_for(table)
        self.priority_fn = priority_fn
        self._engine: sa.Engine | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None
        state["_pid"] = None
        state.pop("_tables", None)
        return state

    @property
    def engine(self) -> sa.Engine:
        """The engine for this process (created, and the tables with it, on first use)."""
        if self._engine is None or self._pid != os.getpid():
            with _INIT_LOCK:
                if self._engine is None or self._pid != os.getpid():
                    self._connect()
        return self._engine  # type: ignore[return-value]

    def _connect(self) -> None:
        import sqlalchemy as sa

        engine = create_sql_engine(self.url)
        metadata = sa.MetaData()
        self._tables = _define_tables(metadata, self.table_name)
        # Under BEGIN IMMEDIATE, concurrent creators serialise; "already exists" can still come
        # from a creator on another engine that won the race, so retry the check.
        for attempt in range(5):
            try:
                metadata.create_all(engine, checkfirst=True)
                break
            except sa.exc.OperationalError as exc:
                if "already exists" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))
        self._engine, self._pid = engine, os.getpid()

    @property
    def table(self) -> sa.Table:
        """The experience table (queryable columns)."""
        self.engine  # noqa: B018 - connects and defines the tables
        return self._tables[0]

    @property
    def blobs(self) -> sa.Table:
        """``<table>_blobs``: id -> serialised experience."""
        self.engine  # noqa: B018
        return self._tables[1]

    @property
    def writers(self) -> sa.Table:
        """``<table>_writers``: registered writers and whether they finished."""
        self.engine  # noqa: B018
        return self._tables[2]

    # -- writing ---------------------------------------------------------------------------

    def register_writer(self) -> str:
        """Record a new writer; returns its id (pass it to :meth:`finish_writer`)."""
        writer_id = uuid.uuid4().hex
        with self.engine.begin() as conn:
            conn.execute(
                self.writers.insert(), {"writer_id": writer_id, "started_at": time.time(), "pid": os.getpid()}
            )
        return writer_id

    def finish_writer(self, writer_id: str) -> None:
        """Mark a writer done (readers may then see the buffer as exhausted)."""
        with self.engine.begin() as conn:
            conn.execute(
                self.writers.update()
                .where(self.writers.c.writer_id == writer_id)
                .values(finished_at=time.time())
            )

    def rows_for(self, experiences: Sequence[Experience], writer_id: str | None = None) -> list[dict]:
        """Column values for ``experiences`` (the blob plus the queryable columns)."""
        now = time.time()
        rows = []
        for exp in experiences:
            rows.append(
                {
                    "consumed": 0,
                    "priority": float(self.priority_fn(exp)) if self.priority_fn else 0.0,
                    "reward": None if exp.reward is None else float(exp.reward),
                    "model_version": int(exp.model_version),
                    "task_id": str(exp.eid.tid),
                    "run_id": int(exp.eid.run),
                    "prompt_text": _clip(exp.prompt_text),
                    "response_text": _clip(exp.response_text),
                    "created_at": now,
                    "consumed_at": None,
                    "writer_id": writer_id,
                    "blob": exp.serialize(),  # split off into the blob table by insert_rows
                }
            )
        return rows

    def insert_rows(self, rows: list[dict]) -> list[int]:
        """Insert prepared rows (from :meth:`rows_for`) in one transaction, all or nothing.

        Returns the new row ids in the order of ``rows``.
        """
        if not rows:
            return []
        import sqlalchemy as sa

        blobs = [row.pop("blob") for row in rows]
        t = self.table
        with self.engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                # BEGIN IMMEDIATE holds the only write lock, so nobody can take these ids
                # between max(id) and the insert; plain executemany is ~2x faster than RETURNING.
                first = (conn.execute(sa.select(sa.func.max(t.c.id))).scalar() or 0) + 1
                ids = list(range(first, first + len(rows)))
                for i, row in zip(ids, rows):
                    row["id"] = i
                conn.execute(t.insert(), rows)
            else:
                stmt = t.insert().returning(t.c.id, sort_by_parameter_order=True)
                ids = [r[0] for r in conn.execute(stmt, rows)]
            conn.execute(self.blobs.insert(), [{"id": i, "blob": b} for i, b in zip(ids, blobs)])
        return ids

    def write(self, experiences: Sequence[Experience], writer_id: str | None = None) -> None:
        """Append ``experiences`` in one transaction: after a crash either all are stored or none."""
        self.insert_rows(self.rows_for(experiences, writer_id))

    # -- reading ---------------------------------------------------------------------------

    def _order(self, order: str) -> list[Any]:
        t = self.table
        if order not in ("fifo", "priority"):
            raise ValueError(f"unknown read order {order!r}; use 'fifo' or 'priority'")
        return [t.c.id] if order == "fifo" else [t.c.priority.desc(), t.c.id]

    def fetch_blobs(self, ids: Sequence[int]) -> dict[int, bytes]:
        """``{id: blob}`` for the given rows."""
        import sqlalchemy as sa

        out: dict[int, bytes] = {}
        b = self.blobs
        with self.engine.connect().execution_options(read_only=True) as conn:
            # Chunks stay under every database's bound-parameter limit.
            for start in range(0, len(ids), 5000):
                chunk = list(ids[start : start + 5000])
                out.update(
                    (r[0], r[1]) for r in conn.execute(sa.select(b.c.id, b.c.blob).where(b.c.id.in_(chunk)))
                )
        return out

    def claim(self, limit: int, order: str = "fifo") -> list[tuple[int, bytes]]:
        """Atomically mark up to ``limit`` unread rows consumed and return ``(id, blob)`` pairs
        in read order. Safe against concurrent claimers: each row is returned once."""
        import sqlalchemy as sa

        if limit <= 0:
            return []
        t = self.table
        pick = sa.select(t.c.id).where(t.c.consumed == 0).order_by(*self._order(order)).limit(limit)
        if self.engine.dialect.name != "sqlite":
            pick = pick.with_for_update(skip_locked=True)
        stmt = (
            t.update()
            .where(t.c.id.in_(pick.scalar_subquery()))
            .values(consumed=1, consumed_at=time.time())
            .returning(t.c.id, t.c.priority)
        )
        with self.engine.begin() as conn:
            rows = conn.execute(stmt).all()
        if not rows:
            return []
        # RETURNING order is unspecified; restore the read order.
        if order == "fifo":
            rows.sort(key=lambda r: r[0])
        else:
            rows.sort(key=lambda r: (-r[1], r[0]))
        # The rows are ours now, so their blobs are read outside the write transaction.
        blobs = self.fetch_blobs([r[0] for r in rows])
        return [(r[0], blobs[r[0]]) for r in rows]

    def claim_ids(self, ids: Sequence[int]) -> None:
        """Mark the given rows consumed (used by the queue actor that already holds them)."""
        if not ids:
            return
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(t.update().where(t.c.id.in_(list(ids))).values(consumed=1, consumed_at=time.time()))

    def unread(self, order: str = "fifo", limit: int | None = None) -> list[tuple[int, bytes]]:
        """Unread rows without claiming them (the queue actor reloads these after a restart)."""
        import sqlalchemy as sa

        t = self.table
        stmt = sa.select(t.c.id).where(t.c.consumed == 0).order_by(*self._order(order))
        if limit is not None:
            stmt = stmt.limit(limit)
        with self.engine.connect().execution_options(read_only=True) as conn:
            ids = list(conn.execute(stmt).scalars())
        blobs = self.fetch_blobs(ids)
        return [(i, blobs[i]) for i in ids]

    def counts(self) -> dict[str, int]:
        """``{"total", "unread", "writers", "open_writers"}``."""
        import sqlalchemy as sa

        t, w = self.table, self.writers
        with self.engine.connect().execution_options(read_only=True) as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            unread = conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.consumed == 0)
            ).scalar_one()
            writers = conn.execute(sa.select(sa.func.count()).select_from(w)).scalar_one()
            open_writers = conn.execute(
                sa.select(sa.func.count()).select_from(w).where(w.c.finished_at.is_(None))
            ).scalar_one()
        return {"total": total, "unread": unread, "writers": writers, "open_writers": open_writers}

    def exhausted(self) -> bool:
        """True when writers were registered, all have finished, and nothing is left unread."""
        c = self.counts()
        return c["writers"] > 0 and c["open_writers"] == 0 and c["unread"] == 0


class SQLWriter:
    """:class:`~trinity.buffer.base.BufferWriter` for ``storage_type: sql``."""

    def __init__(self, storage: SQLStorage) -> None:
        self.storage = storage
        self._writer_id: str | None = None

    def write(self, experiences: Sequence[Experience]) -> None:
        """Store ``experiences`` in one transaction."""
        if self._writer_id is None:
            self._writer_id = self.storage.register_writer()
        self.storage.write(experiences, self._writer_id)

    def finish(self) -> None:
        """Tell readers this writer is done (registers it first if it never wrote)."""
        if self._writer_id is None:
            self._writer_id = self.storage.register_writer()
        self.storage.finish_writer(self._writer_id)


class SQLReader:
    """:class:`~trinity.buffer.base.BufferReader` for ``storage_type: sql``.

    ``read`` polls the table (backing off up to ``poll_interval`` seconds) until ``batch_size``
    rows are claimed or ``timeout`` (default ``max_read_timeout``) passes.
    """

    def __init__(
        self,
        storage: SQLStorage,
        *,
        order: str = "fifo",
        max_read_timeout: float | None = 1800.0,
        poll_interval: float = 0.2,
    ) -> None:
        self.storage = storage
        self.order = order
        self.max_read_timeout = max_read_timeout
        self.poll_interval = poll_interval
        self.rows_read = 0

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Claim and return up to ``batch_size`` experiences (see the class docstring)."""
        from trinity.experience import Experience

        timeout = self.max_read_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[tuple[int, bytes]] = []
        wait = 0.005
        while True:
            got.extend(self.storage.claim(batch_size - len(got), self.order))
            if len(got) >= batch_size:
                break
            if not got and self.storage.exhausted():
                raise BufferExhausted(f"SQL buffer {self.storage.table_name!r}: all writers finished")
            if got and self.storage.exhausted():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            wait = min(wait * 2, self.poll_interval)
        self.rows_read += len(got)
        return [Experience.deserialize(blob) for _, blob in got]

    def state_dict(self) -> dict[str, Any]:
        """The position lives in the database (``consumed``); kept here for monitoring only."""
        return {"rows_read": self.rows_read}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: unread rows are exactly the ones not yet claimed."""
        self.rows_read = int(state.get("rows_read", 0))
