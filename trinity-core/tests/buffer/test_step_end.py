"""Writers ending steps (``end_step``) and readers expecting them (``expect_step``); experience
ids prefixed with their run; refusing a buffer another run left unread rows in; giving back
the reads after a trainer position (the SQL tests on a SQLite file and on PostgreSQL, see the
``sql_url`` fixture; the queue tests start a small local Ray)."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from trinity.buffer.base import STEP_ENDED, TIMED_OUT, BufferExhausted
from trinity.buffer.factory import check_buffer_is_free, get_buffer_reader, release_reads_after, run_name
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.buffer.sql_io import run_uids
from trinity.config import resolve_config
from trinity.config.validation import validate_config

# A read that the writers' end_step should cut short: far longer than the test may take.
LONG = 30.0
QUICK = 5.0


def _url(tmp_path: Path, file: str = "buffer.db") -> str:
    return f"sqlite:///{tmp_path / file}"


def _timed_read(reader: Any, n: int, timeout: float | None = None) -> tuple[list, float]:
    start = time.monotonic()
    got = reader.read(n, timeout=timeout)
    return got, time.monotonic() - start


def _config(tmp_path: Path, experience_buffer: dict[str, Any], *, project: str = "proj", name: str = "run"):
    """A resolved ``mode: both`` config (nothing is loaded: model and taskset are never read)."""
    data = {
        "mode": "both",
        "project": project,
        "name": name,
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {
            "model_path": str(tmp_path / "no-model"),
            "max_prompt_tokens": 16,
            "max_response_tokens": 16,
        },
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {"taskset": {"path": str(tmp_path / "tasks.jsonl")}},
            "trainer_input": {"experience_buffer": experience_buffer},
        },
    }
    return resolve_config(validate_config(data))


# -- SQL: reads cut short by ended steps -----------------------------------------------------


def test_sql_read_returns_a_short_batch_once_the_writer_ended_the_step(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i) for i in range(3)])
    writer.end_step(1)
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8)
    assert [e.eid.task for e in got] == [0, 1, 2]
    assert reader.short_reason == STEP_ENDED
    assert seconds < QUICK, f"waited {seconds:.1f} s for experiences the ended step cannot bring"
    # A full batch afterwards has no reason to be short.
    writer.write([make_experience(i) for i in range(3, 5)])
    writer.end_step(2)
    reader.expect_step(2)
    assert [e.eid.task for e in reader.read(2)] == [3, 4] and reader.short_reason is None


def test_sql_read_of_an_ended_step_without_experiences_is_empty_not_exhausted(sql_url):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).end_step(1)  # every task of step 1 failed: nothing written
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8)
    assert got == [] and reader.short_reason == STEP_ENDED and seconds < QUICK
    assert storage.counts() == {"total": 0, "unread": 0, "writers": 1, "open_writers": 1}


def test_sql_read_waits_for_a_step_the_writer_has_not_ended(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i) for i in range(3)])  # step 1 still running
    reader = SQLReader(storage)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8, timeout=0.3)
    assert len(got) == 3 and reader.short_reason == TIMED_OUT and seconds >= 0.3
    # Ending an earlier step than the one expected does not end it either.
    writer.end_step(1)
    reader.expect_step(2)
    got, seconds = _timed_read(reader, 8, timeout=0.3)
    assert got == [] and reader.short_reason == TIMED_OUT and seconds >= 0.3
    # Nor does any ended step help a reader that expects none (a full batch, as before).
    reader.expect_step(None)
    got, seconds = _timed_read(reader, 8, timeout=0.3)
    assert got == [] and reader.short_reason == TIMED_OUT and seconds >= 0.3


def test_sql_read_returns_short_only_when_every_writer_ended_the_step(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    w1, w2 = SQLWriter(storage), SQLWriter(storage)
    w1.write([make_experience(0, writer="a")])
    w1.end_step(1)
    w2.write([make_experience(0, writer="b")])
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8, timeout=0.3)
    assert len(got) == 2 and reader.short_reason == TIMED_OUT and seconds >= 0.3, "w2 has not ended step 1"
    w2.write([make_experience(1, writer="b")])
    w2.end_step(1)
    got, seconds = _timed_read(reader, 8)
    assert [e.eid.uid for e in got] == ["b/1/1/0"]
    assert reader.short_reason == STEP_ENDED and seconds < QUICK


def test_sql_a_finished_writer_does_not_hold_readers_back(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    done, running = SQLWriter(storage), SQLWriter(storage)
    done.write([make_experience(0, writer="done")])
    done.finish()  # never ended a step
    running.write([make_experience(0, writer="running")])
    running.end_step(1)
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8)
    assert len(got) == 2 and reader.short_reason == STEP_ENDED and seconds < QUICK
    assert not storage.exhausted()  # `running` may still write step 2


def test_sql_rows_written_between_the_last_claim_and_end_step_are_still_read(
    sql_url, make_experience, monkeypatch
):
    # The reader claims (nothing yet), then the writer stores rows and ends the step, then the
    # reader sees the step ended: it must claim once more rather than return without them.
    url = sql_url
    writer = SQLWriter(SQLStorage(url, "exp"))
    writer.end_step(0)
    storage = SQLStorage(url, "exp")
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.expect_step(1)
    real = storage.steps_ended
    calls = []

    def write_then_check(step: int) -> bool:
        if not calls:  # the writer of another thread runs right after the reader's first claim
            t = threading.Thread(
                target=lambda: (writer.write([make_experience(i) for i in range(3)]), writer.end_step(1))
            )
            t.start()
            t.join()
        calls.append(step)
        return real(step)

    monkeypatch.setattr(storage, "steps_ended", write_then_check)
    got, seconds = _timed_read(reader, 8)
    assert calls == [1], "the step was seen ended at the first check"
    assert [e.eid.task for e in got] == [0, 1, 2], "rows written before end_step were left unread"
    assert reader.short_reason == STEP_ENDED and seconds < QUICK
    assert storage.counts()["unread"] == 0


def test_sql_concurrent_writer_thread_steps_are_read_in_full(sql_url, make_experience):
    # The same race left to the scheduler: for each of 20 steps, once the reader has started
    # waiting for it, a writer thread writes 0-3 rows (after a varying pause) and ends the step.
    # Every row of a step must be read by that step's read.
    url = sql_url
    writer = SQLWriter(SQLStorage(url, "exp"))
    writer.end_step(0)
    sizes = [i % 4 for i in range(20)]
    reading = [threading.Event() for _ in sizes]

    def explore() -> None:
        n = 0
        for step, size in enumerate(sizes, start=1):
            reading[step - 1].wait(LONG)
            time.sleep(0.003 * (step % 4))
            writer.write([make_experience(n + i) for i in range(size)])
            n += size
            writer.end_step(step)

    reader = SQLReader(SQLStorage(url, "exp"), max_read_timeout=LONG)
    t = threading.Thread(target=explore)
    t.start()
    per_step = []
    try:
        for step in range(1, len(sizes) + 1):
            reader.expect_step(step)
            reading[step - 1].set()
            got = reader.read(4)
            assert reader.short_reason == STEP_ENDED
            per_step.append(len(got))
    finally:
        for event in reading:
            event.set()
        t.join()
    assert per_step == sizes


def test_sql_old_writers_table_gets_the_new_columns_on_open(sql_url, sql_rows, make_experience):
    # A database made before ended_step and run existed: an open writer of that version, its rows.
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).write([make_experience(i) for i in range(2)])
    sql_rows("DROP TABLE exp_writers")
    sql_rows(
        "CREATE TABLE exp_writers (writer_id VARCHAR(64) NOT NULL PRIMARY KEY, "
        "started_at FLOAT NOT NULL, finished_at FLOAT, pid INTEGER)"
    )
    sql_rows("INSERT INTO exp_writers VALUES ('old', 1.0, NULL, 1)")
    reopened = SQLStorage(sql_url, "exp")
    assert reopened.counts() == {"total": 2, "unread": 2, "writers": 1, "open_writers": 1}
    columns = [c["name"] for c in sa.inspect(reopened.engine).get_columns("exp_writers")]
    assert columns == ["writer_id", "started_at", "finished_at", "pid", "ended_step", "run", "host"]
    assert sql_rows("SELECT ended_step FROM exp_writers") == [(None,)]
    new = SQLWriter(reopened)
    new.write([make_experience(2)])
    new.end_step(1)
    reader = SQLReader(reopened)
    reader.expect_step(1)
    assert len(reader.read(8, timeout=0.3)) == 3 and reader.short_reason == TIMED_OUT  # 'old' is open
    reopened.end_step("old", 1)
    assert reader.read(8, timeout=LONG) == [] and reader.short_reason == STEP_ENDED
    # Opening it again (the column is there now) changes nothing.
    assert SQLStorage(sql_url, "exp").steps_ended(1)


# -- SQL: runs -------------------------------------------------------------------------------


def test_run_uids_prefix_the_run_and_keep_in_batch_repeats_apart(make_experience):
    exps = [make_experience(0), make_experience(0), make_experience(1)]
    assert run_uids(None, exps) is None
    assert run_uids("proj/run", exps) == ["proj/run:w/0/0/0", "proj/run:w/0/0/0#1", "proj/run:w/1/1/0"]


def test_two_runs_writing_the_same_ids_both_store_them(sql_url, sql_rows, make_experience):
    storage = SQLStorage(sql_url, "exp")
    first, second = SQLWriter(storage, run="proj/a"), SQLWriter(storage, run="proj/b")
    first.write([make_experience(i) for i in range(4)])
    second.write([make_experience(i) for i in range(4)])
    assert first.written == second.written == 4 and second.duplicates == 0
    first.write([make_experience(i) for i in range(2, 6)])  # a redone step of run a: 2 and 3 again
    assert first.duplicates == 2 and first.written == 6
    uids = [uid for (uid,) in sql_rows("SELECT uid FROM exp ORDER BY id")]
    assert uids == [f"proj/a:w/{i}/{i % 3}/0" for i in range(4)] + [
        f"proj/b:w/{i}/{i % 3}/0" for i in range(4)
    ] + [f"proj/a:w/{i}/{i % 3}/0" for i in range(4, 6)]
    got = SQLReader(storage).read(20, timeout=0)
    assert [e.eid.task for e in got] == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]  # the experiences keep their eid


def test_unread_of_other_runs_counts_only_other_runs_unread_rows(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage, run="proj/run").write([make_experience(i) for i in range(3)])
    SQLWriter(storage, run="proj/run2").write([make_experience(i) for i in range(2)])  # a prefix of it
    SQLWriter(storage, run="proj/runX1").write([make_experience(i) for i in range(2)])  # "_" is no wildcard
    SQLWriter(storage).write([make_experience(9)])  # no run at all
    assert storage.unread_of_other_runs("proj/run") == (5, "proj/run2:w/0/0/0")
    assert storage.unread_of_other_runs("proj/run_1")[0] == 8
    assert storage.unread_of_other_runs("proj/runX1")[0] == 6
    SQLReader(storage).read(5, timeout=0)  # proj/run's 3, proj/run2's 2
    assert storage.unread_of_other_runs("proj/run") == (3, "proj/runX1:w/0/0/0")
    assert storage.unread_of_other_runs("proj/runX1") == (1, "w/9/0/0")
    assert storage.unread_of_other_runs("nobody") == (3, "proj/runX1:w/0/0/0")


def test_check_buffer_is_free_refuses_unread_rows_of_another_run(tmp_path, sql_url, make_experience):
    url = sql_url
    config = _config(tmp_path, {"name": "exp", "storage_type": "sql", "path": url})
    assert run_name(config) == "proj/run"
    check_buffer_is_free(config)  # an empty buffer
    storage = SQLStorage(url, "exp")
    SQLWriter(storage, run=run_name(config)).write([make_experience(i) for i in range(4)])
    check_buffer_is_free(config)  # this run's own rows (a continued run)
    SQLWriter(storage, run="proj/old").write([make_experience(i) for i in range(3)])
    with pytest.raises(ValueError) as info:
        check_buffer_is_free(config)
    message = str(info.value)
    assert "\n" not in message
    assert "holds 3 unread experiences of another run (proj/old)" in message
    assert "'exp'" in message and url in message
    SQLReader(storage).read(7, timeout=0)  # consumed: they can no longer end up in this run
    check_buffer_is_free(config)


def test_check_buffer_is_free_looks_at_queue_mirrors_and_rows_without_a_run(tmp_path, make_experience):
    # A queue with an SQL mirror keeps its rows across runs (the mirror's table is the name).
    mirror = _url(tmp_path, "mirror.db")
    SQLWriter(SQLStorage(mirror, "q"), run="proj/old").write([make_experience(0)])
    with pytest.raises(ValueError, match=r"holds 1 unread experiences of another run \(proj/old\)"):
        check_buffer_is_free(_config(tmp_path, {"name": "q", "storage_type": "queue", "path": mirror}))
    # A queue without a path keeps nothing (and no Ray is needed to tell).
    check_buffer_is_free(_config(tmp_path, {"name": "q", "storage_type": "queue"}))
    # Rows stored without a run (by a version before runs) are another run's too.
    legacy = _url(tmp_path, "legacy.db")
    SQLWriter(SQLStorage(legacy, "exp")).write([make_experience(0), make_experience(1)])
    with pytest.raises(ValueError, match=r"holds 2 unread experiences of another run \(an earlier run\)"):
        check_buffer_is_free(_config(tmp_path, {"name": "exp", "storage_type": "sql", "path": legacy}))


# -- runs: a restarted explorer, and run names that differ only in case ---------------------


def test_the_writer_of_a_crashed_explorer_does_not_hold_the_continued_run_back(sql_url, make_experience):
    url = sql_url
    crashed = SQLWriter(SQLStorage(url, "exp"), run="proj/run")
    crashed.end_step(0)
    crashed.write([make_experience(i) for i in range(2)])
    crashed.end_step(1)
    crashed.write([make_experience(i) for i in range(2, 4)])
    crashed.end_step(2)  # then SIGKILL / Ctrl-C: the actor is killed, finish() never runs
    # The run continues from the explorer state of step 1 (ExplorerActor ends that step first).
    resumed = SQLWriter(SQLStorage(url, "exp"), run="proj/run")
    resumed.end_step(1)
    resumed.write([make_experience(i) for i in range(2, 4)])  # step 2 redone: duplicates skipped
    resumed.end_step(2)
    resumed.write([make_experience(4)])  # step 3: three of its four rollouts failed
    resumed.end_step(3)
    reader = SQLReader(SQLStorage(url, "exp"))
    assert len(reader.read(4, timeout=0)) == 4  # trainer steps 1-2 (full batches)
    reader.expect_step(3)
    assert len(reader.read(4, timeout=1)) == 1
    assert reader.short_reason == STEP_ENDED  # the killed explorer's writer does not hold it back


def test_unread_of_other_runs_tells_runs_apart_by_case(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage, run="proj/Run").write([make_experience(0)])
    assert storage.unread_of_other_runs("proj/run") == (1, "proj/Run:w/0/0/0")


# -- giving back the reads after a position --------------------------------------------------


def test_release_reads_after_gives_back_the_rows_read_after_the_position(tmp_path, sql_url, make_experience):
    url = sql_url
    config = _config(tmp_path, {"name": "exp", "storage_type": "sql", "path": url})
    SQLWriter(SQLStorage(url, "exp")).write([make_experience(i) for i in range(10)])
    reader = get_buffer_reader(config.buffer.trainer_input.experience_buffer)
    assert [e.eid.task for e in reader.read(3, timeout=0)] == [0, 1, 2]
    position = reader.state_dict()  # the trainer finished a step here
    assert [e.eid.task for e in reader.read(4, timeout=0)] == [3, 4, 5, 6]  # an unfinished step
    assert release_reads_after(config, position) == 4
    assert SQLStorage(url, "exp").counts()["unread"] == 7
    again = SQLReader(SQLStorage(url, "exp"))
    assert [e.eid.task for e in again.read(10, timeout=0)] == [3, 4, 5, 6, 7, 8, 9]
    assert release_reads_after(config, position) == 0  # those were read by another reader since
    file_config = _config(tmp_path, {"name": "f", "storage_type": "file", "path": str(tmp_path / "x.jsonl")})
    assert release_reads_after(file_config, position) == 0


# -- queue (Ray) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, namespace="step-end-tests")
    yield ray
    ray.shutdown()


def _queue(ray_cluster):
    from trinity.buffer.queue import QueueReader, QueueWriter, get_queue_actor

    actor = get_queue_actor(f"q{uuid.uuid4().hex[:8]}")
    return actor, (lambda: QueueWriter(actor)), QueueReader(actor, max_read_timeout=LONG)


@pytest.mark.e2e
def test_queue_read_returns_short_once_every_open_writer_ended_the_step(ray_cluster, make_experience):
    actor, new_writer, reader = _queue(ray_cluster)
    w1, w2, done = new_writer(), new_writer(), new_writer()
    done.write([make_experience(9, writer="done")])
    done.finish()  # a finished writer never holds readers back
    w1.write([make_experience(i, writer="a") for i in range(2)])
    w1.end_step(1)
    w2.write([make_experience(0, writer="b")])
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8, timeout=0.5)
    assert len(got) == 4 and reader.short_reason == TIMED_OUT and seconds >= 0.4, "w2 has not ended step 1"
    w2.end_step(1)
    got, seconds = _timed_read(reader, 8)
    assert got == [] and reader.short_reason == STEP_ENDED and seconds < QUICK
    assert set(ray_cluster.get(actor.stats.remote())["ended_steps"].values()) == {1}
    # Step 2: a write, then the end of the step, wakes the waiting reader with the short batch.
    reader.expect_step(2)
    ref = actor.get.remote(8, LONG, reader.reader_id, 99, 2)
    time.sleep(0.2)
    w1.write([make_experience(5, writer="a")])
    w1.end_step(2)
    w2.end_step(2)
    blobs, reason = ray_cluster.get(ref, timeout=QUICK)
    assert len(blobs) == 1 and reason == STEP_ENDED


@pytest.mark.e2e
def test_queue_read_of_an_ended_step_short_or_empty_and_a_timeout_otherwise(ray_cluster, make_experience):
    _, new_writer, reader = _queue(ray_cluster)
    writer = new_writer()
    writer.write([make_experience(i) for i in range(3)])
    writer.end_step(1)
    reader.expect_step(1)
    got, seconds = _timed_read(reader, 8)
    assert [e.eid.task for e in got] == [0, 1, 2] and reader.short_reason == STEP_ENDED and seconds < QUICK
    writer.end_step(2)  # step 2 wrote nothing
    reader.expect_step(2)
    got, seconds = _timed_read(reader, 8)
    assert got == [] and reader.short_reason == STEP_ENDED and seconds < QUICK
    reader.expect_step(3)  # not ended
    got, seconds = _timed_read(reader, 8, timeout=0.5)
    assert got == [] and reader.short_reason == TIMED_OUT and seconds >= 0.4
    writer.write([make_experience(i) for i in range(3, 5)])
    reader.expect_step(None)
    assert len(reader.read(2)) == 2 and reader.short_reason is None


@pytest.mark.e2e
def test_queue_release_reads_after_with_an_sql_mirror(ray_cluster, tmp_path, make_experience):
    from trinity.buffer.factory import get_buffer_writer

    name, mirror = f"q{uuid.uuid4().hex[:8]}", _url(tmp_path, "mirror.db")
    config = _config(tmp_path, {"name": name, "storage_type": "queue", "path": mirror, "max_read_timeout": 1})
    exp = config.buffer.trainer_input.experience_buffer
    get_buffer_writer(exp, run=run_name(config)).write([make_experience(i) for i in range(8)])
    reader = get_buffer_reader(exp)
    assert [e.eid.task for e in reader.read(2)] == [0, 1]
    position = reader.state_dict()
    assert [e.eid.task for e in reader.read(3)] == [2, 3, 4]
    assert release_reads_after(config, position) == 3
    assert [e.eid.task for e in get_buffer_reader(exp).read(6)] == [2, 3, 4, 5, 6, 7]
    with sqlite3.connect(tmp_path / "mirror.db") as con:
        uids = [uid for (uid,) in con.execute(f"SELECT uid FROM {name} ORDER BY id")]
    assert uids == [f"proj/run:w/{i}/{i % 3}/0" for i in range(8)]


# -- an explorer running ahead: reads never take part of a later step -----------------------


def _ahead(make_experience, writer: Any) -> dict[int, list[str]]:
    """The explorer runs two steps ahead of the trainer: step 1 lost one of its 4 rollouts,
    steps 2 and 3 are whole, all ended. Returns the uids each step wrote."""
    sizes = {1: 3, 2: 4, 3: 4}
    uids = {}
    for step, size in sizes.items():
        exps = [make_experience(i, writer=step) for i in range(size)]
        writer.write(exps)
        writer.end_step(step)
        uids[step] = [e.eid.uid for e in exps]
    return uids


def _read_steps(reader: Any, steps: Any, n: int) -> list[tuple[list[str], str | None]]:
    out = []
    for step in steps:
        reader.expect_step(step)
        got = reader.read(n)
        out.append(([e.eid.uid for e in got], reader.short_reason))
    return out


def test_sql_reads_of_a_step_leave_the_later_steps_rows(sql_url, sql_rows, make_experience):
    storage = SQLStorage(sql_url, "exp")
    uids = _ahead(make_experience, SQLWriter(storage))
    reader = SQLReader(storage, max_read_timeout=LONG)
    assert _read_steps(reader, [1, 2, 3], 4) == [
        (uids[1], STEP_ENDED),  # short, rather than completed with the first row of step 2
        (uids[2], None),
        (uids[3], None),
    ]
    assert sql_rows("SELECT explorer_step, count(*) FROM exp GROUP BY 1 ORDER BY 1") == [
        (1, 3),
        (2, 4),
        (3, 4),
    ]


def test_sql_a_bounded_read_takes_earlier_leftovers_and_rows_of_no_known_step(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    # Step 1 made more rows than one read takes (step-wise episodes beyond train_batch_size).
    writer.write([make_experience(i, writer=1) for i in range(6)])
    writer.write([make_experience(0, writer="expert")])  # a label, not a step: never held back
    writer.end_step(1)
    writer.write([make_experience(i, writer=2) for i in range(2)])
    writer.end_step(2)
    writer.write([make_experience(i, writer=3) for i in range(2)])  # step 3 still running
    reader = SQLReader(storage, max_read_timeout=LONG)
    got = _read_steps(reader, [1, 2], 4)
    assert got[0] == (["1/0/0/0", "1/1/1/0", "1/2/2/0", "1/3/0/0"], None)
    assert got[1] == (["1/4/1/0", "1/5/2/0", "expert/0/0/0", "2/0/0/0"], None)
    reader.expect_step(2)
    assert [e.eid.uid for e in reader.read(4)] == ["2/1/1/0"] and reader.short_reason == STEP_ENDED
    # Without an expected step (a plain full-batch read) nothing is held back.
    reader.expect_step(None)
    assert [e.eid.uid for e in reader.read(2, timeout=0)] == ["3/0/0/0", "3/1/1/0"]


def test_sql_old_experience_table_gets_explorer_step_and_its_rows_are_read_by_any_step(
    sql_url, sql_rows, make_experience
):
    storage = SQLStorage(sql_url, "exp")
    old = SQLWriter(storage)
    old.write([make_experience(i, writer=5) for i in range(2)])
    old.finish()
    sql_rows("ALTER TABLE exp DROP COLUMN explorer_step")  # as a table made before the column
    reopened = SQLStorage(sql_url, "exp")
    writer = SQLWriter(reopened)
    writer.write([make_experience(2, writer=1)])
    writer.end_step(1)
    assert sql_rows("SELECT uid, explorer_step FROM exp ORDER BY id") == [
        ("5/0/0/0", None),
        ("5/1/1/0", None),
        ("1/2/2/0", 1),
    ]
    reader = SQLReader(reopened, max_read_timeout=LONG)
    assert _read_steps(reader, [1], 8) == [(["5/0/0/0", "5/1/1/0", "1/2/2/0"], STEP_ENDED)]


@pytest.mark.e2e
def test_queue_reads_of_a_step_leave_the_later_steps_rows(ray_cluster, make_experience):
    _, new_writer, reader = _queue(ray_cluster)
    uids = _ahead(make_experience, new_writer())
    assert _read_steps(reader, [1, 2, 3], 4) == [(uids[1], STEP_ENDED), (uids[2], None), (uids[3], None)]


@pytest.mark.e2e
def test_queue_bounded_reads_skip_a_later_step_queued_first_and_keep_its_place(ray_cluster, make_experience):
    # Two explorer writers of one queue (e.g. a restarted explorer): a row of step 2 is queued
    # before the rest of step 1. Step 1's read takes the rows behind it; step 2's takes it first.
    _, new_writer, reader = _queue(ray_cluster)
    writer = new_writer()
    writer.write([make_experience(0, writer=1)])
    writer.write([make_experience(0, writer=2)])
    writer.write([make_experience(i, writer=1) for i in range(1, 3)])
    writer.end_step(1)
    writer.write([make_experience(i, writer=2) for i in range(1, 3)])
    writer.write([make_experience(0, writer="label")])
    writer.end_step(2)
    assert _read_steps(reader, [1, 2], 8) == [
        (["1/0/0/0", "1/1/1/0", "1/2/2/0", "label/0/0/0"], STEP_ENDED),  # a label: not held back
        (["2/0/0/0", "2/1/1/0", "2/2/2/0"], STEP_ENDED),
    ]


@pytest.mark.e2e
def test_queue_priority_reads_are_bounded_by_step_too(ray_cluster, make_experience):
    from trinity.buffer.queue import QueueReader, QueueWriter, get_queue_actor

    actor = get_queue_actor(f"q{uuid.uuid4().hex[:8]}", priority=True)
    writer, reader = QueueWriter(actor), QueueReader(actor, max_read_timeout=LONG)
    # Newer weights first (linear_decay): step 2's rows (version 1) outrank step 1's (version 0).
    writer.write([make_experience(i, writer=1, model_version=0) for i in range(2)])
    writer.end_step(1)
    writer.write([make_experience(i, writer=2, model_version=1) for i in range(2)])
    writer.end_step(2)
    got = _read_steps(reader, [1, 2], 4)
    assert [sorted(uids) for uids, _ in got] == [["1/0/0/0", "1/1/1/0"], ["2/0/0/0", "2/1/1/0"]]
    assert [reason for _, reason in got] == [STEP_ENDED, STEP_ENDED]


@pytest.mark.e2e
def test_queue_rows_reloaded_from_the_mirror_or_released_keep_their_step(
    ray_cluster, tmp_path, make_experience
):
    from trinity.buffer.queue import QueueReader, QueueWriter, get_queue_actor, kill_queue_actor

    name, mirror = f"q{uuid.uuid4().hex[:8]}", _url(tmp_path, "mirror.db")
    actor = get_queue_actor(name, mirror_url=mirror)
    uids = _ahead(make_experience, QueueWriter(actor))
    reader = QueueReader(actor, max_read_timeout=LONG)
    assert _read_steps(reader, [1], 4) == [(uids[1], STEP_ENDED)]
    position = reader.state_dict()
    assert _read_steps(reader, [2], 4) == [(uids[2], None)]
    # The queue actor restarts: step 3's unread rows come back from the mirror with their step.
    assert kill_queue_actor(name)
    for _ in range(50):  # the name is free once the killed actor is gone
        try:
            ray_cluster.get_actor(f"trinity_queue_{name}")
        except ValueError:
            break
        time.sleep(0.1)
    actor = get_queue_actor(name, mirror_url=mirror)
    writer = QueueWriter(actor)
    writer.end_step(3)
    resumed = QueueReader(actor, max_read_timeout=LONG)
    resumed.load_state_dict(position)  # the trainer step that read step 2 was lost
    assert resumed.released == 4
    assert _read_steps(resumed, [2, 3], 8) == [(uids[2], STEP_ENDED), (uids[3], STEP_ENDED)]


# -- writers killed before they could finish --------------------------------------------------


def _kill_writer_process(storage: SQLStorage, writer_id: str) -> int:
    """Make ``writer_id`` look like it ran in a process that was then SIGKILLed (and not yet
    reaped: a zombie, as a killed Ray actor is until its parent waits for it)."""
    import signal
    import subprocess

    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGKILL)
    time.sleep(0.2)
    w = storage.writers
    with storage.engine.begin() as conn:
        conn.execute(w.update().where(w.c.writer_id == writer_id).values(pid=proc.pid))
    return proc.pid


def test_pid_alive_tells_running_killed_and_zombie_processes_apart():
    import os
    import signal
    import subprocess

    from trinity.buffer.base import pid_alive

    assert pid_alive(os.getpid())
    proc = subprocess.Popen(["sleep", "60"])
    assert pid_alive(proc.pid)
    proc.send_signal(signal.SIGKILL)
    time.sleep(0.2)
    assert not pid_alive(proc.pid), "a killed, unreaped process (zombie) is not running"
    proc.wait()
    assert not pid_alive(proc.pid)


def test_sql_read_stops_waiting_when_every_writer_was_killed(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage, run="proj/run")
    writer.write([make_experience(i, writer=1) for i in range(2)])
    writer.end_step(1)
    pid = _kill_writer_process(storage, writer._register())
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.gone_writer_grace_s, reader.gone_writer_check_s = 0.5, 0.05
    reader.expect_step(2)
    got, seconds = _timed_read(reader, 4)
    assert len(got) == 2 and reader.short_reason == TIMED_OUT
    assert seconds < QUICK, f"waited {seconds:.1f} s for a writer that was killed"
    assert reader.writers_gone is not None and f"pid {pid} on " in reader.writers_gone
    assert reader.writers_gone.endswith("and no explorer took over")


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_sql_read_keeps_waiting_for_a_restarted_explorer_that_takes_over(sql_url, make_experience):
    url = sql_url
    storage = SQLStorage(url, "exp")
    killed = SQLWriter(storage, run="proj/run")
    killed.end_step(1)
    _kill_writer_process(storage, killed._register())
    reader = SQLReader(storage, max_read_timeout=LONG)
    reader.gone_writer_grace_s, reader.gone_writer_check_s = 3.0, 0.05
    reader.expect_step(2)

    def restart() -> None:
        time.sleep(0.5)  # the reader has noticed the killed writer by now
        resumed = SQLWriter(SQLStorage(url, "exp"), run="proj/run")  # takes over the run
        resumed.end_step(1)
        time.sleep(3.0)  # longer than the grace: the reader must not give up meanwhile
        resumed.write([make_experience(i, writer=2) for i in range(3)])
        resumed.end_step(2)

    t = threading.Thread(target=restart)
    t.start()
    got, seconds = _timed_read(reader, 4)
    t.join()
    assert [e.eid.uid for e in got] == ["2/0/0/0", "2/1/1/0", "2/2/2/0"] and reader.short_reason == STEP_ENDED
    assert reader.writers_gone is None and seconds >= 3.0


def test_sql_the_killed_writer_of_an_earlier_run_does_not_hold_a_new_run_back(sql_url, make_experience):
    # A job that failed (or was killed) after its explore step 1 never finished its writer. A
    # later run on the same buffer whose step 2 has no experience (every task failed) must end
    # that step as on a fresh buffer, not wait max_read_timeout for the dead writer's step 2.
    url = sql_url
    storage = SQLStorage(url, "exp")
    failed = SQLWriter(storage, run="proj/failed")
    failed.end_step(1)
    _kill_writer_process(storage, failed._register())
    alive = SQLWriter(storage, run="proj/other")  # another run's writer whose process runs
    alive.end_step(5)
    new = SQLWriter(SQLStorage(url, "exp"), run="proj/new")
    new.end_step(0)  # the explorer actor registers its writer at start
    new.write([make_experience(i, writer="new") for i in range(4)])
    new.end_step(1)
    new.end_step(2)  # every task of step 2 failed: nothing written
    reader = SQLReader(SQLStorage(url, "exp"), max_read_timeout=LONG)
    reader.expect_step(1)
    assert len(reader.read(4)) == 4
    reader.expect_step(2)
    got, seconds = _timed_read(reader, 4)
    assert got == [] and reader.short_reason == STEP_ENDED and seconds < QUICK
    assert storage.counts()["open_writers"] == 2  # the new run's and the live one: only the dead one closed
    alive.finish()
    new.finish()
    with pytest.raises(BufferExhausted):  # as on a fresh buffer once the explorer finished
        reader.read(4)


def test_sql_writers_on_other_hosts_are_never_taken_for_gone(sql_url):
    storage = SQLStorage(sql_url, "exp")
    writer_id = SQLWriter(storage)._register()
    _kill_writer_process(storage, writer_id)
    assert storage.gone_writers()[0] == 1 and len(storage.gone_writers()[1]) == 1
    w = storage.writers
    with storage.engine.begin() as conn:
        conn.execute(w.update().where(w.c.writer_id == writer_id).values(host="another-machine"))
    assert storage.gone_writers() == (1, [])


@pytest.mark.e2e
def test_queue_read_stops_waiting_when_every_writer_was_killed(ray_cluster, make_experience):
    import signal
    import socket
    import subprocess

    actor, new_writer, reader = _queue(ray_cluster)
    writer = new_writer()
    writer.write([make_experience(i, writer=1) for i in range(2)])
    writer.end_step(1)
    writer.finish()
    proc = subprocess.Popen(["sleep", "60"])  # the explorer process that is then killed
    ray_cluster.get(actor.register_writer.remote("killed", "proj/run", proc.pid, socket.gethostname()))
    reader.gone_writer_grace_s = 0.5
    reader.expect_step(2)
    got, seconds = _timed_read(reader, 4, timeout=0.3)
    assert len(got) == 2 and reader.short_reason == TIMED_OUT and reader.writers_gone is None  # alive
    proc.send_signal(signal.SIGKILL)
    time.sleep(0.2)
    got, seconds = _timed_read(reader, 4)
    assert got == [] and reader.short_reason == TIMED_OUT and seconds < QUICK
    assert f"pid {proc.pid} on " in reader.writers_gone
    proc.wait()


# -- the queue actor's lifetime across jobs ---------------------------------------------------


def _queue_alive(ray, config) -> bool:
    from trinity.buffer.queue import queue_actor_name

    exp = config.buffer.trainer_input.experience_buffer
    try:
        ray.get_actor(queue_actor_name(exp.name), namespace=exp.ray_namespace)
    except ValueError:
        return False
    return True


def _wait_gone(ray, config) -> bool:
    for _ in range(50):
        if not _queue_alive(ray, config):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.e2e
def test_the_last_job_to_leave_a_queue_removes_it(ray_cluster, tmp_path, make_experience):
    from trinity.buffer.factory import get_buffer_writer, join_queue, leave_queue

    config = _config(tmp_path, {"name": f"q{uuid.uuid4().hex[:8]}", "storage_type": "queue"})
    # A queue without an SQL mirror, as on a shared cluster (a job on a Ray of its own gets one
    # in its folder by default).
    config.buffer.trainer_input.experience_buffer.path = None
    assert join_queue(config, "explore-job") and join_queue(config, "train-job")
    assert leave_queue(config, "explore-job") == (
        f"queue {config.buffer.trainer_input.experience_buffer.name!r} stays on the cluster for the 1 other "
        "job(s) using it"
    )
    assert _queue_alive(ray_cluster, config)
    assert leave_queue(config, "train-job") is None
    assert _wait_gone(ray_cluster, config), "the last job left an empty queue behind"
    # Unread experiences only the queue holds keep it alive, and the job says so.
    assert join_queue(config, "job")
    get_buffer_writer(config.buffer.trainer_input.experience_buffer).write([make_experience(0)])
    line = leave_queue(config, "job")
    assert line is not None and "stays on the cluster with 1 unread experiences that only it holds" in line
    assert "ray.kill(ray.get_actor(" in line and _queue_alive(ray_cluster, config)
    assert join_queue(config, "next-job")  # the next job of the run finds them
    assert leave_queue(config, "next-job") is not None


@pytest.mark.e2e
def test_a_started_queue_is_the_one_the_writer_and_reader_then_use(ray_cluster, tmp_path, make_experience):
    """The launcher starts a job's queue before its explorer and trainer (its process then
    starts while they load models); they find that same actor by name."""
    from trinity.buffer.factory import get_buffer_reader, get_buffer_writer, start_queue
    from trinity.buffer.queue import queue_actor_name

    config = _config(tmp_path, {"name": f"q{uuid.uuid4().hex[:8]}", "storage_type": "queue"})
    assert start_queue(config)
    exp = config.buffer.trainer_input.experience_buffer
    for _ in range(100):  # created asynchronously: registered under its name shortly after
        if _queue_alive(ray_cluster, config):
            break
        time.sleep(0.05)
    started = ray_cluster.get_actor(queue_actor_name(exp.name), namespace=exp.ray_namespace)
    get_buffer_writer(exp).write([make_experience(i) for i in range(2)])
    assert ray_cluster.get(started.stats.remote())["size"] == 2  # the writer wrote into the started actor
    assert len(get_buffer_reader(exp).read(2)) == 2
    ray_cluster.kill(started)
    sql = _config(tmp_path, {"name": "s", "storage_type": "sql", "path": _url(tmp_path, "s.db")})
    assert not start_queue(sql)


@pytest.mark.e2e
def test_a_mirrored_queue_is_removed_with_unread_rows_kept_in_sql(ray_cluster, tmp_path, make_experience):
    from trinity.buffer.factory import get_buffer_writer, join_queue, leave_queue

    exp = {"name": f"q{uuid.uuid4().hex[:8]}", "storage_type": "queue", "path": _url(tmp_path, "mirror.db")}
    config = _config(tmp_path, exp)
    assert join_queue(config, "job")
    get_buffer_writer(config.buffer.trainer_input.experience_buffer).write(
        [make_experience(i) for i in range(3)]
    )
    assert leave_queue(config, "job") is None
    assert _wait_gone(ray_cluster, config)
    assert SQLStorage(exp["path"], exp["name"]).counts()["unread"] == 3
