"""SQL experience storage (SQLAlchemy 2 Core): durable, shared by processes, read exactly once.

Each row holds the experience as a binary blob (``Experience.serialize()``) plus queryable
columns; the tables and dialect details are in :mod:`trinity.buffer.sql_schema`, the
reader/writer objects the trainer and explorer use in :mod:`trinity.buffer.sql_io`.

- **Writes** are one transaction per batch (all or nothing). Every row carries its experience
  id (``eid.uid``) under a unique index, and rows whose uid is already stored are skipped
  (``ON CONFLICT DO NOTHING``): an explorer step redone after a crash does not store its
  experiences twice.
- **Reads** *claim* rows by flipping ``consumed`` in a single ``UPDATE ... RETURNING`` run in one
  transaction, so two readers (threads, processes, machines) never get the same row. SQLite:
  ``BEGIN IMMEDIATE`` takes the write lock up front (a claim never upgrades a read lock, so it
  cannot dead-lock), WAL lets readers and writers overlap, ``busy_timeout`` makes contenders
  wait. PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets concurrent claimers skip each other's rows.
- **Resume**: a claim records the reader and its read sequence number, so a trainer restarted
  from a checkpoint can give back the rows it consumed after that checkpoint
  (:meth:`SQLStorage.release`): those were trained on by steps whose weights were lost.
- **Steps**: a writer records the last step whose experiences it has all written
  (``end_step``); a reader expecting that step stops waiting for a full batch once every
  writer has ended it and nothing is unread (tasks that failed leave the batch short).
- **Runs**: a writer prefixes its uids with its run (``<project>/<name>[/<stage>]:``), so a new
  run never collides with the ids of an earlier one; :meth:`SQLStorage.unread_of_other_runs`
  lets a new run refuse a buffer whose unread rows another run left.
- **End**: writers register in ``<table>_writers``; when every registered writer has called
  ``finish()`` and no unread row is left, readers raise :class:`BufferExhausted`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import gone_processes, pid_alive
from trinity.buffer.sql_io import SQLReader, SQLWriter, unique_uids
from trinity.buffer.sql_schema import (
    ADDED_EXPERIENCE_COLUMNS,
    ADDED_WRITER_COLUMNS,
    RowInserter,
    add_missing_columns,
    check_columns,
    check_name_lengths,
    create_sql_engine,
    define_tables,
    normalise_url,
    retrying,
    table_name_for,
    unread_clause,
)

if TYPE_CHECKING:
    import sqlalchemy as sa

    from trinity.experience import Experience

__all__ = ["SQLReader", "SQLStorage", "SQLWriter", "normalise_url", "table_name_for"]

_TEXT_LIMIT = 1_000_000  # keep pathological texts from bloating the queryable columns
_TASK_ID_LIMIT = 256  # the declared length of the task_id column (PostgreSQL enforces it)
_INIT_LOCK = threading.Lock()


def _clip(text: str | None, limit: int = _TEXT_LIMIT) -> str | None:
    """``text`` as a queryable column stores it: at most ``limit`` characters, NUL characters
    replaced by U+FFFD (PostgreSQL's text types cannot hold NUL; a model can emit one). The
    blob keeps the exact experience."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[:limit]


class SQLStorage:
    """One experience table in a SQL database; picklable (reconnects lazily in each process).

    Args:
        url: SQLAlchemy URL (``sqlite:///buffer.db``, ``postgresql://...``) or a file path.
        table: table name (usually the buffer's ``name``).
        priority_fn: optional ``f(experience) -> float``; rows are then read highest first.
        max_retry_times / max_retry_interval: a write, claim or writer update that fails with a
            transient database error (``OperationalError``: locked, disconnected) is rerun this
            many more times, this many seconds apart (the buffer's keys of the same names).
    """

    def __init__(
        self,
        url: str,
        table: str = "experience",
        priority_fn: Callable[[Experience], float] | None = None,
        *,
        max_retry_times: int = 3,
        max_retry_interval: float = 1.0,
    ) -> None:
        self.url = normalise_url(url)
        self.table_name = table_name_for(table)
        self.priority_fn = priority_fn
        self.max_retry_times = max_retry_times
        self.max_retry_interval = max_retry_interval
        self._engine: sa.Engine | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None
        state["_pid"] = None
        state.pop("_tables", None)
        state.pop("_inserter", None)
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
        import tenacity

        engine = create_sql_engine(self.url)
        metadata = sa.MetaData()
        tables = define_tables(metadata, self.table_name)
        check_name_lengths(metadata, engine.dialect, self.table_name)

        def create() -> None:
            metadata.create_all(engine, checkfirst=True)
            check_columns(engine, tables[0], self.url)
            add_missing_columns(engine, tables[0], ADDED_EXPERIENCE_COLUMNS)
            add_missing_columns(engine, tables[2], ADDED_WRITER_COLUMNS)

        # Processes opening a new buffer at once (an explorer and a trainer job) all see no table
        # and create it; the losers fail once the winner commits, so they look again (quickly:
        # the winner is done). SQLite says "already exists"; PostgreSQL says so for a table or a
        # column, or fails a catalog's unique index ("duplicate key value ... pg_type_...").
        # Any other transient error waits like every other statement.
        race = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda e: (
                    isinstance(e, sa.exc.DBAPIError)
                    and ("already exists" in str(e) or "duplicate key" in str(e))
                )
            ),
            stop=tenacity.stop_after_attempt(5),
            wait=tenacity.wait_incrementing(0.05, 0.05),
            reraise=True,
        )
        self._retry(lambda: race(create), "creating the tables")
        self._tables = tables
        self._inserter = RowInserter(tables[0], tables[1], engine.dialect)
        self._engine, self._pid = engine, os.getpid()

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()`` (one whole transaction), rerun on transient database errors."""
        where = f"SQL buffer {self.table_name!r}: {what}"
        return retrying(self.max_retry_times, self.max_retry_interval, where)(fn)

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

    def register_writer(self, run: str | None = None) -> str:
        """Record a new writer; returns its id (pass it to :meth:`finish_writer`).

        A run has one writer at a time: the open writers an earlier process of ``run`` left
        (an explorer killed before it could finish) are marked finished, or readers would
        wait on their steps forever. So are the open writers of any run whose process on this
        host is gone: a job that failed or was killed never finished its writer, and a later
        run on the same buffer would wait for that writer's steps until ``max_read_timeout``.
        """
        import sqlalchemy as sa

        writer_id = uuid.uuid4().hex
        now = time.time()
        host = socket.gethostname()
        w = self.writers

        def register() -> None:
            with self.engine.begin() as conn:
                if run is not None:
                    conn.execute(
                        w.update().where(w.c.run == run, w.c.finished_at.is_(None)).values(finished_at=now)
                    )
                open_here = conn.execute(
                    sa.select(w.c.writer_id, w.c.pid).where(w.c.finished_at.is_(None), w.c.host == host)
                ).all()
                gone = [wid for wid, pid in open_here if pid and not pid_alive(pid)]
                if gone:
                    conn.execute(w.update().where(w.c.writer_id.in_(gone)).values(finished_at=now))
                conn.execute(
                    w.insert(),
                    {
                        "writer_id": writer_id,
                        "started_at": now,
                        "pid": os.getpid(),
                        "run": run,
                        "host": socket.gethostname(),
                    },
                )

        self._retry(register, "registering a writer")
        return writer_id

    def finish_writer(self, writer_id: str) -> None:
        """Mark a writer done (readers may then see the buffer as exhausted)."""
        w = self.writers

        def finish() -> None:
            with self.engine.begin() as conn:
                conn.execute(w.update().where(w.c.writer_id == writer_id).values(finished_at=time.time()))

        self._retry(finish, "finishing a writer")

    def end_step(self, writer_id: str, step: int) -> None:
        """Record that ``writer_id`` has written every experience of its steps up to ``step``
        (a writer's steps only go up)."""
        w = self.writers

        def end() -> None:
            with self.engine.begin() as conn:
                conn.execute(w.update().where(w.c.writer_id == writer_id).values(ended_step=step))

        self._retry(end, f"ending step {step}")

    def steps_ended(self, step: int) -> bool:
        """True when writers are registered and each one still writing has ended ``step``."""
        import sqlalchemy as sa

        w = self.writers
        behind = (w.c.finished_at.is_(None)) & (w.c.ended_step.is_(None) | (w.c.ended_step < step))
        with self.engine.connect().execution_options(read_only=True) as conn:
            writers = conn.execute(sa.select(sa.func.count()).select_from(w)).scalar_one()
            lagging = conn.execute(sa.select(sa.func.count()).select_from(w).where(behind)).scalar_one()
        return writers > 0 and lagging == 0

    def gone_writers(self) -> tuple[int, list[str]]:
        """``(open writers, descriptions of those whose process is gone)``: an open writer
        on this host whose pid no longer runs was killed before it could finish. Writers on
        other hosts are never reported gone (their processes cannot be seen from here)."""
        import sqlalchemy as sa

        w = self.writers
        with self.engine.connect().execution_options(read_only=True) as conn:
            rows = conn.execute(sa.select(w.c.pid, w.c.host).where(w.c.finished_at.is_(None))).all()
        return len(rows), gone_processes(rows)

    def unread_of_other_runs(self, run: str) -> tuple[int, str | None]:
        """``(count, one uid)`` of the unread rows not written by run ``run`` (uid prefix)."""
        import sqlalchemy as sa

        t = self.table
        prefix = f"{run}:"
        # substr, not LIKE: SQLite's LIKE ignores case, and run names are case-sensitive.
        other = unread_clause(t) & (sa.func.substr(t.c.uid, 1, len(prefix)) != prefix)
        with self.engine.connect().execution_options(read_only=True) as conn:
            count, example = conn.execute(sa.select(sa.func.count(), sa.func.min(t.c.uid)).where(other)).one()
        return int(count), example

    def rows_for(
        self,
        experiences: Sequence[Experience],
        writer_id: str | None = None,
        uids: Sequence[str] | None = None,
    ) -> list[dict]:
        """Column values for ``experiences``: the queryable columns plus ``"blob"``.

        ``uids`` (default: :func:`~trinity.buffer.sql_io.unique_uids` of ``experiences``) are the dedup keys.
        """
        now = time.time()
        prio = self.priority_fn
        return [
            {
                "uid": _clip(uid, len(uid)),
                "consumed": 0,
                "priority": float(prio(exp)) if prio else 0.0,
                "reward": None if exp.reward is None else float(exp.reward),
                "model_version": int(exp.model_version),
                "task_id": _clip(str(exp.eid.tid), _TASK_ID_LIMIT),
                "run_id": int(exp.eid.run),
                "explorer_step": exp.eid.explorer_step,
                "prompt_text": _clip(exp.prompt_text),
                "response_text": _clip(exp.response_text),
                "created_at": now,
                "writer_id": writer_id,
                "blob": exp.serialize(),
            }
            for exp, uid in zip(experiences, uids or unique_uids(experiences))
        ]

    def insert_rows(self, rows: list[dict]) -> list[int | None]:
        """Insert prepared rows (from :meth:`rows_for`) in one transaction, all or nothing.

        Returns each row's new id, in the order of ``rows``; ``None`` for a row skipped because
        its ``uid`` was stored already. ``rows`` are left unchanged.
        """
        if not rows:
            return []

        def insert() -> dict[str, int]:
            with self.engine.begin() as conn:
                return self._insert(conn, rows)

        new = self._retry(insert, f"writing {len(rows)} rows")
        return [new.get(row["uid"]) for row in rows]

    def _insert(self, conn: sa.Connection, rows: list[dict]) -> dict[str, int]:
        """Insert ``rows`` inside ``conn``'s transaction; ``{uid: id}`` of those stored."""
        import sqlalchemy as sa

        first = None
        if conn.dialect.name == "sqlite":
            # BEGIN IMMEDIATE holds the only write lock, so nobody can take ids between max(id)
            # and the insert, and no RETURNING is needed to learn them.
            t = self.table
            first = (conn.execute(sa.select(sa.func.max(t.c.id))).scalar() or 0) + 1
        return self._inserter.insert(conn, rows, [row["blob"] for row in rows], first)

    def write(
        self,
        experiences: Sequence[Experience],
        writer_id: str | None = None,
        uids: Sequence[str] | None = None,
    ) -> int:
        """Append ``experiences`` in one transaction (after a crash: all stored or none).

        Returns how many were stored; the others had a ``uid`` that was stored already.
        """
        if not experiences:
            return 0
        # Serialised before the transaction: the write lock is held only for the inserts.
        rows = self.rows_for(experiences, writer_id, uids)

        def insert() -> int:
            with self.engine.begin() as conn:
                return len(self._insert(conn, rows))

        return self._retry(insert, f"writing {len(rows)} experiences")

    # -- reading ---------------------------------------------------------------------------

    def _order(self, order: str) -> list[Any]:
        t = self.table
        if order not in ("fifo", "priority"):
            raise ValueError(f"unknown read order {order!r}; use 'fifo' or 'priority'")
        return [t.c.id] if order == "fifo" else [t.c.priority.desc(), t.c.id]

    def _by_id(self, column: Any, ids: Sequence[int]) -> dict[int, Any]:
        """``{id: column value}`` for the given rows of the table ``column`` belongs to."""
        import sqlalchemy as sa

        out: dict[int, Any] = {}
        id_column = column.table.c.id
        with self.engine.connect().execution_options(read_only=True) as conn:
            # Chunks stay under every database's bound-parameter limit.
            for start in range(0, len(ids), 5000):
                chunk = list(ids[start : start + 5000])
                out.update(conn.execute(sa.select(id_column, column).where(id_column.in_(chunk))).all())
        return out

    def fetch_blobs(self, ids: Sequence[int]) -> dict[int, bytes]:
        """``{id: blob}`` for the given rows."""
        return self._by_id(self.blobs.c.blob, ids)

    def explorer_steps(self, ids: Sequence[int]) -> dict[int, int | None]:
        """``{id: explorer_step}`` for the given rows (``None``: not known)."""
        return self._by_id(self.table.c.explorer_step, ids)

    def _consumed_by(self, reader_id: str | None, read_seq: int | None, step: int | None) -> dict:
        return {
            "consumed": 1,
            "consumed_at": time.time(),
            "reader_id": reader_id,
            "read_seq": read_seq,
            "consumed_step": step,
        }

    def claim(
        self,
        limit: int,
        order: str = "fifo",
        *,
        reader_id: str | None = None,
        read_seq: int | None = None,
        step: int | None = None,
        max_step: int | None = None,
    ) -> list[tuple[int, bytes]]:
        """Atomically mark up to ``limit`` unread rows consumed and return ``(id, blob)`` pairs
        in read order. Safe against concurrent claimers: each row is returned once.

        ``reader_id``/``read_seq`` record who claimed the rows (see :meth:`release`); ``step``
        is stored as ``consumed_step`` for inspection. With ``max_step``, rows of later
        explorer steps are left unread (rows whose step is not known are not held back).
        """
        import sqlalchemy as sa

        if limit <= 0:
            return []
        t = self.table
        pick = sa.select(t.c.id).where(unread_clause(t))
        if max_step is not None:
            pick = pick.where(sa.or_(t.c.explorer_step.is_(None), t.c.explorer_step <= int(max_step)))
        pick = pick.order_by(*self._order(order)).limit(limit)
        if self.engine.dialect.name != "sqlite":
            pick = pick.with_for_update(skip_locked=True)
        stmt = (
            t.update()
            .where(t.c.id.in_(pick.scalar_subquery()))
            .values(**self._consumed_by(reader_id, read_seq, step))
            .returning(t.c.id, t.c.priority)
        )

        def claim() -> list[Any]:
            with self.engine.begin() as conn:
                return conn.execute(stmt).all()

        rows = self._retry(claim, f"claiming up to {limit} rows")
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

    def claim_ids(
        self, ids: Sequence[int], *, reader_id: str | None = None, read_seq: int | None = None
    ) -> None:
        """Mark the given rows consumed (used by the queue actor that already holds them)."""
        if not ids:
            return
        t = self.table
        stmt = t.update().where(t.c.id.in_(list(ids))).values(**self._consumed_by(reader_id, read_seq, None))

        def claim() -> None:
            with self.engine.begin() as conn:
                conn.execute(stmt)

        self._retry(claim, f"claiming {len(ids)} rows")

    def release(self, reader_id: str, after_seq: int) -> list[int]:
        """Make the rows that ``reader_id`` claimed with a read sequence number above
        ``after_seq`` unread again; returns their ids in read (FIFO) order."""
        t = self.table
        stmt = (
            t.update()
            .where(t.c.reader_id == reader_id, t.c.read_seq > after_seq, t.c.consumed == 1)
            .values(consumed=0, consumed_at=None, reader_id=None, read_seq=None, consumed_step=None)
            .returning(t.c.id)
        )

        def release() -> list[int]:
            with self.engine.begin() as conn:
                return sorted(conn.execute(stmt).scalars())

        return self._retry(release, "releasing rows")

    def unread(self, order: str = "fifo", limit: int | None = None) -> list[tuple[int, bytes, int | None]]:
        """Unread rows without claiming them, as ``(id, blob, explorer_step)`` (the queue actor
        reloads these after a restart)."""
        import sqlalchemy as sa

        t = self.table
        stmt = sa.select(t.c.id, t.c.explorer_step).where(unread_clause(t)).order_by(*self._order(order))
        if limit is not None:
            stmt = stmt.limit(limit)
        with self.engine.connect().execution_options(read_only=True) as conn:
            rows = conn.execute(stmt).all()
        blobs = self.fetch_blobs([i for i, _ in rows])
        return [(i, blobs[i], step) for i, step in rows]

    def counts(self) -> dict[str, int]:
        """``{"total", "unread", "writers", "open_writers"}``."""
        import sqlalchemy as sa

        t, w = self.table, self.writers
        with self.engine.connect().execution_options(read_only=True) as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            unread = conn.execute(
                sa.select(sa.func.count()).select_from(t).where(unread_clause(t))
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
