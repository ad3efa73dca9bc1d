"""Experience buffer throughput: ``sql`` and ``queue`` against two SQLAlchemy baselines, same run.

    python benchmarks/buffer.py [--n 20000] [--batch 256] [--tokens 512] [--repeat 3]
                                [--upstream-n 20000] [--no-queue]

Each experience has ``--tokens`` tokens (half prompt, half response, with logprobs), like a
512-token rollout. "write" is serialise + store; "read" is claim + deserialise; "write+read" is
n / (write time + read time). Every storage gets the same experiences, batch size and order of
work (all batches written, then all read back, ``--batch`` at a time).

Rows compared (ratios are against the first):

- **batched Core (executemany)**: what a competent user writes with plain SQLAlchemy Core, the
  reference for "vs batched". One table with the same queryable columns and the same blob
  (``Experience.serialize()``); each write batch is one ``conn.execute(table.insert(), rows)``
  (an executemany) in one transaction; each read batch is, in one transaction, ``SELECT id,
  blob ... WHERE consumed = 0 ORDER BY id LIMIT batch`` (index on ``consumed``) plus one
  ``UPDATE ... SET consumed = 1 WHERE id IN (...)``, then deserialise. The SQLite file has the
  same settings as the sql storage's (WAL, ``synchronous=NORMAL``, 8 KiB pages, the same
  checkpoint interval, checked and printed), so the ratio measures the storage's code, not its
  PRAGMAs.
- **upstream-style ORM**: the access pattern of upstream Trinity-RFT's ``SQLExperienceStorage``
  re-created here (upstream itself is not installed): ORM objects with upstream's columns,
  ``session.add_all`` per write batch (one transaction), blob ``pickle.dumps(experience)``;
  an engine with ``NullPool`` (a new connection per session) and SQLite's default settings
  (rollback journal, ``synchronous=FULL``); each read takes the newest least-consumed rows
  (``ORDER BY consumed, id DESC LIMIT batch``), bumps their ``consumed`` and unpickles them.
  SQLite sorts every unread row for that on each call (the index only covers ``consumed``:
  "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY"), so this row's read rate falls as ``n``
  grows: it runs at ``--upstream-n`` (default: ``--n``) and its n is printed.
- **sql**: ``trinity.buffer.sql`` (SQLWriter/SQLReader); **sql, pickled blobs**: the same with
  experiences in the previous blob format (a pickled dict of numpy arrays), to show what the
  binary format brings; **queue** / **queue + sql mirror**: the Ray queue actor.

Every storage runs ``--repeat`` rounds on fresh databases and keeps the fastest (the least
disturbed by other work on a shared machine); the upstream-style row, about 30 s a round at the
default n, runs ``--upstream-repeat`` (default 1) rounds, so a busy machine can make it look
slower than it is. The CPU-time ratios printed next to the wall-time ones hardly depend on load,
but leave out time spent waiting for the disk (upstream's ``synchronous=FULL`` fsyncs are a
real cost of it), so for upstream the truth lies between the two. "cpu write+read/s" divides by this process's CPU
time (``time.process_time``: all threads of this process) instead; SQLite runs in-process, so
it is the rate with a core to itself. Not shown for the queue, whose work is in a Ray actor
process. Numbers depend on the machine; the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import torch
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool

from trinity.experience import EID, Experience

# The SQLite settings the sql storage applies (trinity.buffer.sql_schema.create_sql_engine),
# written out as a user would; each run reads them back from its connections and main() prints them.
FILE_PRAGMAS = ("page_size=8192", "journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=16384")


def make(n: int, tokens: int) -> list[Experience]:
    half = tokens // 2
    return [
        Experience(
            tokens=torch.randint(0, 150_000, (tokens,)),
            prompt_length=half,
            logprobs=torch.randn(tokens - half),
            reward=float(i % 2),
            eid=EID(batch=i // 64, task=i % 64),
            prompt_text="What is 2 + 2? " * 8,
            response_text="The answer is 4. " * 8,
        )
        for i in range(n)
    ]


# SQLite settings seen by each storage's own connections, filled in by the bench functions.
SETTINGS: dict[str, str] = {}


def connection_settings(engine: sa.Engine) -> str:
    """The SQLite settings of one of ``engine``'s connections, e.g. ``journal_mode=wal ...``.

    Asked on the engine's own connection: ``synchronous`` and ``wal_autocheckpoint`` are set
    per connection, not stored in the file.
    """
    conn = engine.raw_connection()
    try:
        names = ("journal_mode", "synchronous", "page_size", "wal_autocheckpoint")
        return " ".join(f"{n}={conn.cursor().execute(f'PRAGMA {n}').fetchone()[0]}" for n in names)
    finally:
        conn.close()


# -- trinity's storages ---------------------------------------------------------------------


def bench_sql(exps: list[Experience], batch: int, url: str) -> tuple[float, float, float]:
    """(write seconds, read seconds, CPU seconds of both)."""
    from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter

    storage = SQLStorage(url, "bench")
    storage.counts()  # create tables outside the timing
    writer, reader = SQLWriter(storage), SQLReader(storage, max_read_timeout=0)
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(0, len(exps), batch):
        writer.write(exps[i : i + batch])
    wrote = time.perf_counter()
    got = 0
    while got < len(exps):
        got += len(reader.read(batch))
    done = time.perf_counter()
    assert got == len(exps) and writer.written == len(exps)
    SETTINGS["sql"] = connection_settings(storage.engine)
    storage.engine.dispose()
    return wrote - start, done - wrote, time.process_time() - cpu


def bench_sql_pickled(exps: list[Experience], batch: int, url: str) -> tuple[float, float, float]:
    """bench_sql with blobs in the previous format (deserialize still reads it)."""
    original = Experience.serialize
    Experience.serialize = lambda self: pickle.dumps(self.to_dict(), protocol=5)  # type: ignore[method-assign]
    try:
        return bench_sql(exps, batch, url)
    finally:
        Experience.serialize = original  # type: ignore[method-assign]


def bench_queue(exps: list[Experience], batch: int, mirror: str | None) -> tuple[float, float]:
    import ray

    from trinity.buffer.queue import QueueReader, QueueWriter, get_queue_actor, kill_queue_actor

    name = f"bench{int(time.time() * 1000)}"
    actor = get_queue_actor(name, capacity=len(exps) + 1, mirror_url=mirror)
    ray.get(actor.stats.remote())  # actor started outside the timing
    writer, reader = QueueWriter(actor, name), QueueReader(actor, max_read_timeout=0)
    start = time.perf_counter()
    for i in range(0, len(exps), batch):
        writer.write(exps[i : i + batch])
    wrote = time.perf_counter()
    got = 0
    while got < len(exps):
        got += len(reader.read(batch))
    done = time.perf_counter()
    kill_queue_actor(name)
    return wrote - start, done - wrote


# -- baseline: batched SQLAlchemy Core ------------------------------------------------------


def bench_batched(exps: list[Experience], batch: int, path: str) -> tuple[float, float, float]:
    """The batched Core baseline (see the module docstring); (write s, read s, CPU s)."""
    engine = sa.create_engine(f"sqlite:///{path}")

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        for pragma in FILE_PRAGMAS:
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    metadata = sa.MetaData()
    t = sa.Table(
        "batched",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("consumed", sa.Boolean, nullable=False, default=False, index=True),
        sa.Column("reward", sa.Float),
        sa.Column("model_version", sa.Integer, nullable=False),
        sa.Column("task_id", sa.String(256)),
        sa.Column("prompt_text", sa.Text),
        sa.Column("response_text", sa.Text),
        sa.Column("blob", sa.LargeBinary, nullable=False),
    )
    metadata.create_all(engine)  # outside the timing, as for the sql storage
    pick = sa.select(t.c.id, t.c.blob).where(sa.not_(t.c.consumed)).order_by(t.c.id)  # consumed = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(0, len(exps), batch):
        rows = [
            {
                "consumed": False,
                "reward": e.reward,
                "model_version": e.model_version,
                "task_id": e.eid.tid,
                "prompt_text": e.prompt_text,
                "response_text": e.response_text,
                "blob": e.serialize(),
            }
            for e in exps[i : i + batch]
        ]
        with engine.begin() as conn:
            conn.execute(t.insert(), rows)  # a list of dicts: one executemany
    wrote = time.perf_counter()
    got = 0
    while got < len(exps):
        with engine.begin() as conn:
            claimed = conn.execute(pick.limit(batch)).all()
            conn.execute(t.update().where(t.c.id.in_([r.id for r in claimed])).values(consumed=True))
        got += len([Experience.deserialize(r.blob) for r in claimed])
    done = time.perf_counter()
    assert got == len(exps)
    SETTINGS["batched"] = connection_settings(engine)
    engine.dispose()
    return wrote - start, done - wrote, time.process_time() - cpu


# -- baseline: upstream Trinity-RFT's SQL experience storage, re-created ----------------------


class Base(DeclarativeBase):
    pass


class UpstreamRow(Base):
    """Upstream's experience table: its columns, an index on ``consumed``, a pickled blob."""

    __tablename__ = "upstream"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    prompt: Mapped[str | None] = mapped_column(sa.Text)
    response: Mapped[str | None] = mapped_column(sa.Text)
    message_list: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    reward: Mapped[float | None]
    model_version: Mapped[int | None]
    experience_bytes: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    consumed: Mapped[int] = mapped_column(default=0, index=True)


def bench_upstream(exps: list[Experience], batch: int, path: str) -> tuple[float, float, float]:
    """Upstream's write and (priority) read pattern, see the module docstring; (write s, read s, CPU s)."""
    engine = sa.create_engine(f"sqlite:///{path}", poolclass=NullPool)
    Base.metadata.create_all(engine)
    u = UpstreamRow
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(0, len(exps), batch):
        with Session(engine) as session, session.begin():
            session.add_all(
                [
                    UpstreamRow(
                        prompt=e.prompt_text,
                        response=e.response_text,
                        message_list=e.messages,
                        reward=e.reward,
                        model_version=e.model_version,
                        experience_bytes=pickle.dumps(e),  # upstream's Experience.serialize
                    )
                    for e in exps[i : i + batch]
                ]
            )
    wrote = time.perf_counter()
    got = 0
    while got < len(exps):
        with Session(engine) as session, session.begin():
            rows = (
                session.query(u).order_by(u.consumed.asc(), u.id.desc()).limit(batch).with_for_update().all()
            )
            session.query(u).filter(u.id.in_([r.id for r in rows])).update(
                {u.consumed: u.consumed + 1}, synchronize_session=False
            )
            exps_read = [pickle.loads(r.experience_bytes) for r in rows]  # type: ignore[arg-type]
            # Upstream always returns a full batch, topping up with already consumed rows once
            # fewer unread ones are left (its "consumed" is a use count): count the new ones.
            got += sum(r.consumed == 0 for r, _ in zip(rows, exps_read, strict=True))
    done = time.perf_counter()
    assert got == len(exps)
    SETTINGS["upstream"] = connection_settings(engine)
    engine.dispose()
    return wrote - start, done - wrote, time.process_time() - cpu


def best(rounds: int, run: Callable[[int], tuple[float, ...]]) -> tuple[float, ...]:
    """The fastest of ``rounds`` runs (by write + read time); ``run(i)`` gets the round number."""
    return min((run(i) for i in range(rounds)), key=lambda r: r[0] + r[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000, help="experiences per storage")
    parser.add_argument(
        "--upstream-n", type=int, default=None, help="experiences for the upstream-style row (default: --n)"
    )
    parser.add_argument("--batch", type=int, default=256, help="experiences per write/read call")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per experience")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per storage (fastest kept)")
    parser.add_argument(
        "--upstream-repeat", type=int, default=1, help="rounds for the (slow) upstream-style row"
    )
    parser.add_argument("--no-queue", action="store_true", help="skip the Ray queue")
    args = parser.parse_args()
    upstream_n = args.upstream_n or args.n

    exps = make(max(args.n, upstream_n), args.tokens)
    sizes = (
        len(exps[0].serialize()),
        len(pickle.dumps(exps[0].to_dict(), protocol=5)),
        len(pickle.dumps(exps[0])),
    )
    print(
        f"{args.n} experiences x {args.tokens} tokens, blob {sizes[0]} bytes (previous format "
        f"{sizes[1]}, upstream's pickle {sizes[2]}), batch {args.batch}, best of {args.repeat}"
    )
    results: dict[str, tuple[float, ...]] = {}
    baseline, upstream = "batched Core (executemany)", "upstream-style ORM"
    with tempfile.TemporaryDirectory() as folder:
        results[baseline] = (
            args.n,
            *best(args.repeat, lambda i: bench_batched(exps[: args.n], args.batch, f"{folder}/b{i}.db")),
        )
        results[upstream] = (
            upstream_n,
            *best(
                args.upstream_repeat,
                lambda i: bench_upstream(exps[:upstream_n], args.batch, f"{folder}/u{i}.db"),
            ),
        )
        exps = exps[: args.n]
        results["sql, pickled blobs"] = (
            args.n,
            *best(args.repeat, lambda i: bench_sql_pickled(exps, args.batch, f"sqlite:///{folder}/p{i}.db")),
        )
        results["sql"] = (
            args.n,
            *best(args.repeat, lambda i: bench_sql(exps, args.batch, f"sqlite:///{folder}/s{i}.db")),
        )
        if not args.no_queue:
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            try:
                results["queue"] = (args.n, *best(args.repeat, lambda i: bench_queue(exps, args.batch, None)))
                results["queue + sql mirror"] = (
                    args.n,
                    *best(
                        args.repeat,
                        lambda i: bench_queue(exps, args.batch, f"sqlite:///{folder}/m{i}.db"),
                    ),
                )
            finally:
                ray.shutdown()

    base_n, base_w, base_r, _ = results[baseline]
    base_rate = base_n / (base_w + base_r)
    print(
        f"{'storage':<28}{'n':>7}{'write/s':>10}{'read/s':>10}{'write+read/s':>14}{'vs batched':>12}"
        f"{'cpu write+read/s':>18}"
    )
    for name, (n, w, r, *cpu) in results.items():
        rate = n / (w + r)
        cpu_rate = f"{n / cpu[0]:>18,.0f}" if cpu else ""
        print(
            f"{name:<28}{n:>7}{n / w:>10,.0f}{n / r:>10,.0f}{rate:>14,.0f}{rate / base_rate:>11.2f}x{cpu_rate}"
        )

    def rate_of(name: str, clock: str = "wall") -> float:
        n, w, r, cpu = results[name]
        return n / (w + r if clock == "wall" else cpu)

    def ratio(name: str, other: str) -> str:
        return f"{rate_of(name) / rate_of(other):.2f}x wall, {rate_of(name, 'cpu') / rate_of(other, 'cpu'):.2f}x CPU"

    print(f"sql vs batched Core baseline (write+read): {ratio('sql', baseline)}")
    print(
        f"sql vs upstream-style SQL storage (write+read): {ratio('sql', upstream)}"
        f"  (upstream-style at n={upstream_n}, best of {args.upstream_repeat})"
    )
    print(f"binary format vs pickled blobs (write+read): {ratio('sql', 'sql, pickled blobs')}")
    for name in ("sql", "batched", "upstream"):
        print(f"SQLite settings, {name}: {SETTINGS[name]}")
    if SETTINGS["sql"] != SETTINGS["batched"]:
        print("WARNING: the batched baseline's file settings differ from the sql storage's")
    print(
        f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}; target: sql write+read >= 10,000/s)"
    )


if __name__ == "__main__":
    main()
