"""Experience buffer throughput: ``sql`` and ``queue`` against a naive ORM baseline, same run.

    python benchmarks/buffer.py [--n 20000] [--batch 256] [--tokens 512] [--naive-n 1000] [--repeat 3]

Each experience has ``--tokens`` tokens (half prompt, half response, with logprobs), like a
512-token rollout. "write" is serialise + store; "read" is claim + deserialise; "write+read" is
n / (write time + read time). The naive baseline is what a first version usually does: one ORM
object inserted and committed per row, and one row fetched, marked consumed and committed per
read. "sql, pickled blobs" is the same sql storage with experiences in the previous format (a
pickled dict of numpy arrays), to show what the binary format brings.

sql and queue run ``--repeat`` rounds on fresh databases and report the fastest (the least
disturbed by other work on a shared machine). For sql, "cpu write+read/s" divides by this
process's CPU time instead (SQLite runs in-process): the rate it would reach with a core to
itself. Numbers depend on the machine; the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from collections.abc import Callable

import sqlalchemy as sa
import torch
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from trinity.experience import EID, Experience


class Base(DeclarativeBase):
    pass


class Row(Base):
    """The naive baseline's ORM model: the same columns as the sql storage, one table."""

    __tablename__ = "naive"
    id: Mapped[int] = mapped_column(primary_key=True)
    consumed: Mapped[bool] = mapped_column(default=False, index=True)
    reward: Mapped[float | None]
    model_version: Mapped[int]
    task_id: Mapped[str]
    prompt_text: Mapped[str | None]
    response_text: Mapped[str | None]
    blob: Mapped[bytes]


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


def bench_naive(exps: list[Experience], folder: str) -> tuple[float, float]:
    engine = sa.create_engine(f"sqlite:///{folder}/naive.db")
    Base.metadata.create_all(engine)
    start = time.perf_counter()
    with Session(engine) as session:
        for e in exps:
            session.add(
                Row(
                    reward=e.reward,
                    model_version=e.model_version,
                    task_id=e.eid.tid,
                    prompt_text=e.prompt_text,
                    response_text=e.response_text,
                    blob=e.serialize(),
                )
            )
            session.commit()
    wrote = time.perf_counter()
    with Session(engine) as session:
        for _ in exps:
            row = session.scalars(
                sa.select(Row).where(Row.consumed.is_(False)).order_by(Row.id).limit(1)
            ).one()
            row.consumed = True
            Experience.deserialize(row.blob)
            session.commit()
    done = time.perf_counter()
    return wrote - start, done - wrote


def best(rounds: int, run: Callable[[int], tuple[float, ...]]) -> tuple[float, ...]:
    """The fastest of ``rounds`` runs (by write + read time); ``run(i)`` gets the round number."""
    return min((run(i) for i in range(rounds)), key=lambda r: r[0] + r[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000, help="experiences for sql and queue")
    parser.add_argument("--naive-n", type=int, default=500, help="experiences for the (slow) naive baseline")
    parser.add_argument("--batch", type=int, default=256, help="experiences per write/read call")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per experience")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per sql/queue storage (fastest kept)")
    parser.add_argument("--no-queue", action="store_true", help="skip the Ray queue")
    args = parser.parse_args()

    exps = make(args.n, args.tokens)
    sizes = len(exps[0].serialize()), len(pickle.dumps(exps[0].to_dict(), protocol=5))
    print(
        f"{args.n} experiences x {args.tokens} tokens, {sizes[0]} bytes serialised "
        f"({sizes[1]} pickled), batch {args.batch}, best of {args.repeat}"
    )
    results: dict[str, tuple[float, ...]] = {}
    with tempfile.TemporaryDirectory() as folder:
        results["naive ORM (row/commit)"] = (args.naive_n, *bench_naive(exps[: args.naive_n], folder))
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

    base_n, base_w, base_r = results["naive ORM (row/commit)"]
    base_rate = base_n / (base_w + base_r)
    print(
        f"{'storage':<24}{'write/s':>10}{'read/s':>10}{'write+read/s':>14}{'vs naive':>10}"
        f"{'cpu write+read/s':>18}"
    )
    for name, (n, w, r, *cpu) in results.items():
        rate = n / (w + r)
        cpu_rate = f"{n / cpu[0]:>18,.0f}" if cpu else ""
        print(f"{name:<24}{n / w:>10,.0f}{n / r:>10,.0f}{rate:>14,.0f}{rate / base_rate:>9.1f}x{cpu_rate}")
    sql, old = results["sql"], results["sql, pickled blobs"]
    print(f"binary format vs pickled blobs (write+read): {(old[1] + old[2]) / (sql[1] + sql[2]):.2f}x")
    print(
        f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}; target: sql write+read >= 10,000/s)"
    )


if __name__ == "__main__":
    main()
