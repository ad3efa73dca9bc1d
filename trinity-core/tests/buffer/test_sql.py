"""SQL experience storage on real SQLite files, with real concurrent processes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from trinity.buffer.base import BufferExhausted
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.experience import Experience

WORKER = str(Path(__file__).with_name("sql_worker.py"))


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'buffer.db'}"


def test_roundtrip_keeps_tensors_and_columns(tmp_path, make_experience):
    storage = SQLStorage(_url(tmp_path), "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i, model_version=3) for i in range(5)])
    got = SQLReader(storage, max_read_timeout=0).read(5)
    assert [e.eid.task for e in got] == [0, 1, 2, 3, 4]
    assert torch.equal(got[2].tokens, torch.arange(16))
    assert torch.equal(got[2].logprobs, torch.full((8,), -0.5))
    assert got[4].model_version == 3
    with sqlite3.connect(tmp_path / "buffer.db") as con:
        rows = con.execute(
            "SELECT reward, model_version, task_id, run_id, prompt_text, consumed FROM exp"
        ).fetchall()
    assert rows[4] == (4.0, 3, "w/4", 1, "prompt 4", 1)


def test_reads_fifo_in_batches_and_times_out_with_partial_batch(tmp_path, make_experience):
    storage = SQLStorage(_url(tmp_path), "exp")
    SQLWriter(storage).write([make_experience(i) for i in range(7)])
    reader = SQLReader(storage)
    assert [e.eid.task for e in reader.read(3, timeout=0)] == [0, 1, 2]
    start = time.monotonic()
    assert [e.eid.task for e in reader.read(10, timeout=0.3)] == [3, 4, 5, 6]
    assert time.monotonic() - start >= 0.3
    assert reader.read(2, timeout=0.05) == []  # nothing left, writer not finished: empty, no error


def test_exhausted_only_after_every_writer_finished(tmp_path, make_experience):
    storage = SQLStorage(_url(tmp_path), "exp")
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


def test_read_waits_for_a_writer_in_another_thread(tmp_path, make_experience):
    storage = SQLStorage(_url(tmp_path), "exp")
    writer = SQLWriter(storage)

    def later() -> None:
        time.sleep(0.2)
        writer.write([make_experience(i) for i in range(4)])

    t = threading.Thread(target=later)
    t.start()
    got = SQLReader(storage).read(4, timeout=10)
    t.join()
    assert len(got) == 4


def test_priority_order_reads_highest_first(tmp_path, make_experience):
    storage = SQLStorage(_url(tmp_path), "exp", priority_fn=lambda e: e.reward)
    SQLWriter(storage).write([make_experience(i) for i in (3, 9, 1, 9, 5)])
    got = SQLReader(storage, order="priority").read(5, timeout=0)
    assert [e.eid.task for e in got] == [9, 9, 5, 3, 1]


def test_storage_pickles_and_reconnects(tmp_path, make_experience):
    import pickle

    storage = SQLStorage(_url(tmp_path), "exp")
    SQLWriter(storage).write([make_experience(0)])
    clone = pickle.loads(pickle.dumps(storage))
    assert clone._engine is None
    assert clone.counts()["unread"] == 1


def _run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *args], stderr=subprocess.PIPE, text=True)


def _check(proc: subprocess.Popen, timeout: float = 120) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err


@pytest.mark.e2e
def test_four_writer_processes_two_reader_processes_exactly_once(tmp_path):
    url = _url(tmp_path)
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
def test_sigkill_mid_batch_leaves_a_consistent_database(tmp_path):
    url = _url(tmp_path)
    storage = SQLStorage(url, "exp")
    batch = 100
    writer = _run("write", url, "victim", "-1", str(batch))
    deadline = time.monotonic() + 60
    while storage.counts()["total"] < 20 * batch:
        assert writer.poll() is None, writer.stderr.read()
        assert time.monotonic() < deadline, "writer made no progress"
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert writer.returncode == -signal.SIGKILL

    with sqlite3.connect(tmp_path / "buffer.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        total = con.execute("SELECT count(*) FROM exp").fetchone()[0]
        blobs = con.execute("SELECT count(*) FROM exp_blobs").fetchone()[0]
    assert total == blobs, "a row without its blob (or the reverse) survived the crash"
    assert total % batch == 0, "a partial batch was committed"
    # The dead writer never finished, so readers cannot see the end; read everything with a timeout.
    got = SQLReader(SQLStorage(url, "exp")).read(total + 10, timeout=0.5)
    assert [e.eid.task for e in got] == list(range(total))
    # A fresh writer can go on using the database.
    SQLWriter(SQLStorage(url, "exp")).write([Experience(tokens=[1, 2], prompt_length=1)])
    assert SQLStorage(url, "exp").counts()["unread"] == 1


@pytest.mark.e2e
def test_reader_restarted_in_a_new_process_continues_where_reading_stopped(tmp_path, make_experience):
    url = _url(tmp_path)
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
