"""SQL experience storage with real concurrent processes, on SQLite files and on a PostgreSQL
server (the ``sql_url`` fixture runs each test on both; PostgreSQL needs
``TRINITY_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from trinity.buffer.base import BufferExhausted
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.experience import EID, Experience

WORKER = str(Path(__file__).with_name("sql_worker.py"))


def test_roundtrip_keeps_tensors_and_columns(sql_url, sql_rows, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i, model_version=3) for i in range(5)])
    got = SQLReader(storage, max_read_timeout=0).read(5)
    assert [e.eid.task for e in got] == [0, 1, 2, 3, 4]
    assert torch.equal(got[2].tokens, torch.arange(16))
    assert torch.equal(got[2].logprobs, torch.full((8,), -0.5))
    assert got[4].model_version == 3
    rows = sql_rows(
        "SELECT reward, model_version, task_id, run_id, prompt_text, consumed FROM exp ORDER BY id"
    )
    assert rows[4] == (4.0, 3, "w/4", 1, "prompt 4", 1)


def test_reads_fifo_in_batches_and_times_out_with_partial_batch(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).write([make_experience(i) for i in range(7)])
    reader = SQLReader(storage)
    assert [e.eid.task for e in reader.read(3, timeout=0)] == [0, 1, 2]
    start = time.monotonic()
    assert [e.eid.task for e in reader.read(10, timeout=0.3)] == [3, 4, 5, 6]
    assert time.monotonic() - start >= 0.3
    assert reader.read(2, timeout=0.05) == []  # nothing left, writer not finished: empty, no error


def test_exhausted_only_after_every_writer_finished(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    w1, w2 = SQLWriter(storage), SQLWriter(storage)
    w1.write([make_experience(0)])
    w2.write([make_experience(1)])
    reader = SQLReader(storage)
    w1.finish()
    assert len(reader.read(5, timeout=0.05)) == 2
    assert reader.read(5, timeout=0.05) == []
    w2.finish()
    with pytest.raises(BufferExhausted, match="all writers finished"):
        reader.read(5, timeout=5)


def test_read_waits_for_a_writer_in_another_thread(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)

    def later() -> None:
        time.sleep(0.2)
        writer.write([make_experience(i) for i in range(4)])

    t = threading.Thread(target=later)
    t.start()
    got = SQLReader(storage).read(4, timeout=10)
    t.join()
    assert len(got) == 4


def test_priority_order_reads_highest_first(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp", priority_fn=lambda e: e.reward)
    SQLWriter(storage).write([make_experience(i) for i in (3, 9, 1, 9, 5)])
    got = SQLReader(storage, order="priority").read(5, timeout=0)
    assert [e.eid.task for e in got] == [9, 9, 5, 3, 1]


def test_threads_claiming_at_once_get_each_row_once(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    for start in range(0, 2000, 200):
        writer.write([make_experience(i) for i in range(start, start + 200)])
    writer.finish()
    seen: list[list[int]] = [[], [], []]
    errors: list[BaseException] = []

    def claim(k: int) -> None:
        reader = SQLReader(storage, max_read_timeout=5)
        try:
            while True:
                got = reader.read(37)
                assert len(got) <= 37
                seen[k].extend(e.eid.task for e in got)
        except BufferExhausted:
            return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    everything = [i for part in seen for i in part]
    assert sorted(everything) == list(range(2000)), "a row was lost or read twice"


def test_storage_pickles_and_reconnects(sql_url, make_experience):
    import pickle

    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).write([make_experience(0)])
    clone = pickle.loads(pickle.dumps(storage))
    assert clone._engine is None
    assert clone.counts()["unread"] == 1


def test_nul_characters_and_long_task_ids_are_stored(sql_url, sql_rows):
    # A model can emit NUL, which PostgreSQL's text columns cannot hold, and a task id can be
    # longer than the task_id column's 256 characters, which PostgreSQL enforces.
    exp = Experience(
        tokens=[1, 2, 3],
        prompt_length=1,
        eid=EID(batch="b" * 300, task="t\x00"),
        prompt_text="p\x00",
        response_text="a\x00b",
    )
    SQLWriter(SQLStorage(sql_url, "exp")).write([exp])
    [(uid, task_id, prompt, response)] = sql_rows("SELECT uid, task_id, prompt_text, response_text FROM exp")
    assert (prompt, response) == ("p\ufffd", "a\ufffdb")
    assert uid == exp.eid.uid.replace("\x00", "\ufffd")
    assert task_id == str(exp.eid.tid).replace("\x00", "\ufffd")[:256]
    [got] = SQLReader(SQLStorage(sql_url, "exp")).read(1, timeout=0)
    assert (got.prompt_text, got.response_text, got.eid.task) == ("p\x00", "a\x00b", "t\x00")  # exact


def test_a_buffer_name_too_long_for_the_database_fails_with_one_clear_line(sql_url, make_experience):
    longest_fitting = "n" * 51  # its longest index name, ix_<name>_priority, has 63 characters
    SQLWriter(SQLStorage(sql_url, longest_fitting)).write([make_experience(0)])
    assert SQLStorage(sql_url, longest_fitting).counts()["total"] == 1
    storage = SQLStorage(sql_url, "n" * 52)
    if sql_url.startswith("sqlite"):  # no limit
        SQLWriter(storage).write([make_experience(0)])
        assert storage.counts()["total"] == 1
    else:
        with pytest.raises(
            ValueError,
            match=r"^SQL buffer name 'n{52}' \(52 characters\) is too long for postgresql.* at most 51 characters$",
        ):
            storage.counts()


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_processes_opening_a_new_buffer_at_once_all_succeed(tmp_path, sql_url):
    # An explorer job and a trainer job started together both find no table and create it.
    # Four processes open the same 20 new buffers in turn: every opening is a race.
    go = tmp_path / "go"
    tables = [f"fresh{k}" for k in range(20)]
    procs = [_run("open", sql_url, str(go), *tables) for _ in range(4)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*.ready"))) < len(procs):  # their imports are done
        assert all(p.poll() is None for p in procs), "a process failed before the start"
        assert time.monotonic() < deadline, "the processes never got ready"
        time.sleep(0.01)
    go.touch()
    for p in procs:
        _check(p)
    assert SQLStorage(sql_url, tables[-1]).counts()["total"] == 0


def _run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *args], stderr=subprocess.PIPE, text=True)


def _check(proc: subprocess.Popen, timeout: float = 120) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err


@pytest.mark.e2e
def test_four_writer_processes_two_reader_processes_exactly_once(tmp_path, sql_url):
    url = sql_url
    storage = SQLStorage(url, "exp")
    # Readers stop once every *registered* writer has finished; a fast writer can finish before
    # a slow one has even started, so a gate writer stays open until all four registered.
    gate = storage.register_writer()
    outs = [tmp_path / f"read{i}.txt" for i in range(2)]
    readers = [_run("read", url, str(out), "200") for out in outs]
    writers = [_run("write", url, f"w{i}", "5000", "250") for i in range(4)]
    deadline = time.monotonic() + 120
    while storage.counts()["writers"] < 5:
        assert all(p.poll() in (None, 0) for p in writers), "a writer failed"
        assert time.monotonic() < deadline, "writers never registered"
        time.sleep(0.01)
    storage.finish_writer(gate)
    for p in writers + readers:
        _check(p)
    seen = [line for out in outs for line in out.read_text().splitlines()]
    expected = {f"w{w}/{i}/0/0" for w in range(4) for i in range(5000)}
    assert len(seen) == 20000, "lost or duplicated experiences"
    assert set(seen) == expected
    assert all(len(out.read_text().splitlines()) > 0 for out in outs), "one reader starved"
    counts = SQLStorage(url, "exp").counts()
    assert counts == {"total": 20000, "unread": 0, "writers": 5, "open_writers": 0}


@pytest.mark.e2e
def test_sigkill_mid_batch_leaves_a_consistent_database(tmp_path, sql_url, sql_rows):
    url = sql_url
    storage = SQLStorage(url, "exp")
    batch = 100
    # On PostgreSQL the writer's connection is named, to see when the server has ended it.
    victim_url = url if url.startswith("sqlite") else f"{url}?application_name=victim"
    writer = _run("write", victim_url, "victim", "-1", str(batch))
    deadline = time.monotonic() + 60
    while storage.counts()["total"] < 20 * batch:
        assert writer.poll() is None, writer.stderr.read()
        assert time.monotonic() < deadline, "writer made no progress"
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert writer.returncode == -signal.SIGKILL

    if url.startswith("sqlite"):
        assert sql_rows("PRAGMA integrity_check") == [("ok",)]
    else:
        # A server ends a dead client's session (rolling back its open transaction) once it sees
        # the closed connection; a COMMIT sent just before the kill may still be applied until then.
        while sql_rows("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'victim'") != [(0,)]:
            assert time.monotonic() < deadline + 60, "the server kept the killed writer's session"
            time.sleep(0.05)
    [(total,)] = sql_rows("SELECT count(*) FROM exp")
    [(blobs,)] = sql_rows("SELECT count(*) FROM exp_blobs")
    assert total == blobs, "a row without its blob (or the reverse) survived the crash"
    assert total % batch == 0, "a partial batch was committed"
    # The dead writer never finished, so readers cannot see the end; read everything with a timeout.
    got = SQLReader(SQLStorage(url, "exp")).read(total + 10, timeout=0.5)
    assert [e.eid.task for e in got] == list(range(total))
    # A fresh writer can go on using the database.
    SQLWriter(SQLStorage(url, "exp")).write([Experience(tokens=[1, 2], prompt_length=1)])
    assert SQLStorage(url, "exp").counts()["unread"] == 1


@pytest.mark.e2e
def test_reader_restarted_in_a_new_process_continues_where_reading_stopped(
    tmp_path, sql_url, make_experience
):
    url = sql_url
    writer = SQLWriter(SQLStorage(url, "exp"))
    writer.write([make_experience(i) for i in range(100)])
    writer.finish()
    first = tmp_path / "first.txt"
    _check(_run("read-n", url, str(first), "30", "10"))
    assert [line.split("/")[1] for line in first.read_text().splitlines()] == [str(i) for i in range(30)]
    second = tmp_path / "second.txt"
    _check(_run("read", url, str(second), "25"))
    assert [line.split("/")[1] for line in second.read_text().splitlines()] == [
        str(i) for i in range(30, 100)
    ]
