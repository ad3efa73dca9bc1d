"""Where the SQL buffer lives: URLs, the engine's settings, the tables, and the dialect-specific
statements (everything :mod:`trinity.buffer.sql` needs to know about the database itself).

Each buffer ``<name>`` has three tables:

- ``<name>``: one small row per experience with the queryable columns (reward, model version,
  task/run ids, the explorer step that made it, texts), the unique experience id ``uid`` and the read state (``consumed``, and
  who read it when: ``reader_id``, ``read_seq``, ``consumed_step``);
- ``<name>_blobs``: ``id -> Experience.serialize()``. Apart so that claiming a row rewrites a
  ~100-byte record, not the whole multi-kilobyte experience;
- ``<name>_writers``: registered writers, their run, the last step each has ended
  (``ended_step``) and whether they finished (readers use it to tell "nothing yet" from
  "nothing more").

SQLite and PostgreSQL are the databases with a tuned branch (``ON CONFLICT DO NOTHING``,
``FOR UPDATE SKIP LOCKED``); any other SQLAlchemy database with ``INSERT ... RETURNING`` works
through the generic branch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa

DEFAULT_BUSY_TIMEOUT_MS = 60_000

# Columns a table made by an older trinity-core lacks; checked when a buffer is opened.
REQUIRED_COLUMNS = ("uid", "reader_id", "read_seq", "consumed_step")


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


def create_sql_engine(url: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> sa.Engine:
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
        # Checkpoint (and fsync) every 16384 pages (128 MiB) of WAL, not every 1000: experiences
        # are big, and each checkpoint stalls the writer that triggers it.
        cur.execute("PRAGMA wal_autocheckpoint=16384")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writes take the lock up front; pure reads (``read_only`` option) stay deferred so they
        # never queue behind writers (WAL gives them a consistent snapshot).
        mode = "DEFERRED" if conn.get_execution_options().get("read_only") else "IMMEDIATE"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def define_tables(metadata: sa.MetaData, table: str) -> tuple[sa.Table, sa.Table, sa.Table]:
    """``(experiences, blobs, writers)`` of buffer table ``table`` (see the module docstring)."""
    import sqlalchemy as sa

    experiences = sa.Table(
        table,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        # Experience.eid.uid (batch/task/run/step[/suffix]): a redone explorer step writes the
        # same uids again, and the unique index turns those rows into no-ops.
        sa.Column("uid", sa.Text, nullable=False),
        sa.Column("consumed", sa.Integer, nullable=False, default=0),
        sa.Column("priority", sa.Float, nullable=False, default=0.0),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("model_version", sa.Integer, nullable=False, default=0),
        sa.Column("task_id", sa.String(256), nullable=True),
        sa.Column("run_id", sa.Integer, nullable=True),
        # Experience.eid.batch when it is a step number: readers bounded to a step skip later ones.
        sa.Column("explorer_step", sa.Integer, nullable=True),
        sa.Column("prompt_text", sa.Text, nullable=True),
        sa.Column("response_text", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("writer_id", sa.String(64), nullable=True),
        # Who consumed the row: a reader resumed from a checkpoint gives back the rows it read
        # after that checkpoint (``read_seq`` greater than the saved one).
        sa.Column("consumed_at", sa.Float, nullable=True),
        sa.Column("reader_id", sa.String(64), nullable=True),
        sa.Column("read_seq", sa.Integer, nullable=True),
        sa.Column("consumed_step", sa.Integer, nullable=True),
        sa.Index(f"ux_{table}_uid", "uid", unique=True),
        sa.Index(f"ix_{table}_task", "task_id"),
    )
    # Read order over the unread rows only (partial indexes): a claim just deletes its rows
    # from them, instead of moving them within an index on (consumed, ...).
    unread = unread_clause(experiences)
    for name, cols in (
        ("fifo", [experiences.c.id]),
        ("priority", [experiences.c.priority.desc(), experiences.c.id]),
    ):
        sa.Index(f"ix_{table}_{name}", *cols, sqlite_where=unread, postgresql_where=unread)
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
        # The writer's last step whose experiences are all written (BufferWriter.end_step).
        sa.Column("ended_step", sa.Integer, nullable=True),
        # The run it writes for: a new writer of the run takes over from its older ones.
        sa.Column("run", sa.Text, nullable=True),
        # Where ``pid`` runs: a reader on the same host can tell a killed writer from a slow one.
        sa.Column("host", sa.String(255), nullable=True),
    )
    return experiences, blobs, writers


def unread_clause(table: sa.Table) -> Any:
    """``consumed = 0`` with a literal 0: the query planners only use the partial read-order
    indexes for a condition they can match to the index's own ``WHERE`` at prepare time."""
    import sqlalchemy as sa

    return table.c.consumed == sa.literal_column("0")


def check_columns(engine: sa.Engine, table: sa.Table, url: str) -> None:
    """Fail with a clear message when ``table`` exists but was made by an older trinity-core."""
    import sqlalchemy as sa

    have = {c["name"] for c in sa.inspect(engine).get_columns(table.name)}
    missing = [c for c in REQUIRED_COLUMNS if c not in have]
    if missing:
        raise RuntimeError(
            f"SQL buffer table {table.name!r} in {url} was created by an older trinity-core "
            f"(no column {', '.join(missing)}). Point the buffer at a new database file or "
            "another buffer name; the old rows stay readable with `trinity buffer show`."
        )


def check_name_lengths(metadata: sa.MetaData, dialect: sa.Dialect, buffer: str) -> None:
    """Fail with one clear line when the buffer's table or index names (its name plus up to 12
    characters) are longer than the database allows (PostgreSQL: 63 characters; SQLite: no limit)."""
    names = [n for t in metadata.tables.values() for n in (t.name, *(i.name for i in t.indexes)) if n]
    longest = max(names, key=len)
    limit = dialect.max_identifier_length
    if len(longest) > limit:
        allowed = len(buffer) - (len(longest) - limit)
        raise ValueError(
            f"SQL buffer name {buffer!r} ({len(buffer)} characters) is too long for {dialect.name}, whose "
            f"names have at most {limit} characters (the longest the buffer needs, {longest!r}, has "
            f"{len(longest)}): use a buffer name of at most {allowed} characters"
        )


def add_missing_columns(engine: sa.Engine, table: sa.Table, columns: Sequence[tuple[str, str]]) -> None:
    """Add nullable ``columns`` (``(name, SQL type)``) that ``table``, made by an older
    trinity-core, lacks. Old rows stay valid: NULL means "not known" (a writer of no known run
    that never ended a step; an experience whose explorer step is not known, read by any step)."""
    import sqlalchemy as sa

    have = {c["name"] for c in sa.inspect(engine).get_columns(table.name)}
    quoted = engine.dialect.identifier_preparer.quote(table.name)
    for column, kind in columns:
        if column not in have:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {column} {kind}")


# Nullable columns added since a table's first version, per table (see add_missing_columns).
ADDED_EXPERIENCE_COLUMNS = (("explorer_step", "INTEGER"),)
ADDED_WRITER_COLUMNS = (("ended_step", "INTEGER"), ("run", "TEXT"), ("host", "VARCHAR(255)"))


# What a writer stores; the read-state columns start out NULL.
INSERT_COLUMNS = (
    "uid",
    "consumed",
    "priority",
    "reward",
    "model_version",
    "task_id",
    "run_id",
    "explorer_step",
    "prompt_text",
    "response_text",
    "created_at",
    "writer_id",
)


class RowInserter:
    """Inserts experience rows, skipping those whose ``uid`` is already stored.

    ``insert(conn, rows, blobs, first_id)`` returns ``{uid: id}`` of the rows actually
    inserted, inside the caller's transaction. ``rows`` map :data:`INSERT_COLUMNS` to values.
    SQLite needs ``first_id``: the caller holds the write lock and numbers the rows itself
    (``first_id``, ``first_id + 1``...), which spares a ``RETURNING``.
    """

    def __init__(self, table: sa.Table, blobs: sa.Table, dialect: sa.Dialect) -> None:
        import operator

        self.table, self.blobs, self.dialect = table, blobs, dialect
        self._values = operator.itemgetter(*INSERT_COLUMNS)
        if dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert

            # Compiled once and run through the driver with plain tuples: SQLAlchemy's per-row
            # parameter processing would otherwise cost about as much as SQLite's insert.
            stmt = insert(table).on_conflict_do_nothing(index_elements=[table.c.uid])
            self._rows_sql = self._compile(stmt, ("id", *INSERT_COLUMNS))
            self._blobs_sql = self._compile(blobs.insert(), ("id", "blob"))

    def _compile(self, stmt: Any, names: Sequence[str]) -> str:
        import sqlalchemy as sa

        compiled = stmt.values({n: sa.bindparam(n) for n in names}).compile(dialect=self.dialect)
        if tuple(compiled.positiontup or ()) != tuple(names):
            raise AssertionError(f"unexpected parameter order {compiled.positiontup}")
        return str(compiled)

    def insert(
        self, conn: sa.Connection, rows: list[dict[str, Any]], blobs: list[bytes], first_id: int | None = None
    ) -> dict[str, int]:
        """Insert ``rows`` with their ``blobs`` (same order); duplicates by ``uid`` are skipped."""
        import sqlalchemy as sa

        t = self.table
        if self.dialect.name == "sqlite":
            assert first_id is not None, "SQLite inserts are numbered by the caller"
            values = self._values
            result = conn.exec_driver_sql(
                self._rows_sql, [(first_id + k, *values(r)) for k, r in enumerate(rows)]
            )
            last = first_id + len(rows) - 1
            if result.rowcount == len(rows):
                new = {r["uid"]: first_id + k for k, r in enumerate(rows)}
                conn.exec_driver_sql(self._blobs_sql, [(first_id + k, b) for k, b in enumerate(blobs)])
                return new
            # Some uids were stored already: the ids of this range that exist are the new rows.
            new = dict(conn.execute(sa.select(t.c.uid, t.c.id).where(t.c.id.between(first_id, last))).all())
            kept = set(new.values())
            if kept:
                conn.exec_driver_sql(
                    self._blobs_sql, [(first_id + k, b) for k, b in enumerate(blobs) if first_id + k in kept]
                )
            return new
        by_uid = {r["uid"]: b for r, b in zip(rows, blobs)}
        rows = [dict(zip(INSERT_COLUMNS, self._values(r))) for r in rows]
        if self.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert

            stmt = insert(t).on_conflict_do_nothing(index_elements=[t.c.uid])
        else:
            # Generic branch: drop the uids already stored; a concurrent writer of the same uid
            # then fails the unique index (the transaction rolls back, nothing half-written).
            uids = [r["uid"] for r in rows]
            seen = set(conn.execute(sa.select(t.c.uid).where(t.c.uid.in_(uids))).scalars())
            rows = [r for r in rows if r["uid"] not in seen]
            stmt = t.insert()
        if not rows:
            return {}
        new = {uid: i for i, uid in conn.execute(stmt.returning(t.c.id, t.c.uid), rows)}
        if new:
            conn.execute(self.blobs.insert(), [{"id": i, "blob": by_uid[u]} for u, i in new.items()])
        return new


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error worth retrying: an ``OperationalError`` (a locked
    database, a dropped connection, a server restart), not a mistake in the statement or data."""
    import sqlalchemy as sa

    return isinstance(exc, sa.exc.OperationalError)


def retrying(times: int, interval: float, what: str) -> Any:
    """A ``tenacity.Retrying`` that reruns a whole transaction up to ``times`` more times,
    ``interval`` seconds apart, on a transient error (logged); the last error is re-raised.

    Rerunning is safe: a failed transaction was rolled back, and writes skip uids already stored.
    """
    import logging

    import tenacity

    logger = logging.getLogger("trinity.buffer.sql")

    def log(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        first = str(exc).strip().splitlines()[0] if exc and str(exc).strip() else type(exc).__name__
        logger.warning(
            "%s failed (%s); retry %d of %d in %ss", what, first, state.attempt_number, times, interval
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(times + 1),
        wait=tenacity.wait_fixed(interval),
        before_sleep=log,
        reraise=True,
    )
