"""The SQL buffer on PostgreSQL (its own dialect branches: ON CONFLICT DO NOTHING RETURNING,
FOR UPDATE SKIP LOCKED). Runs only with a server:

    TRINITY_TEST_POSTGRES_URL=postgresql+psycopg://user@127.0.0.1:5432/db pytest ...

Each test works in its own table and drops it afterwards.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from trinity.buffer.base import BufferExhausted
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter

URL = os.environ.get("TRINITY_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="set TRINITY_TEST_POSTGRES_URL to test on PostgreSQL")


@pytest.fixture
def new_storage():
    """``new_storage(priority_fn=None)``: a storage in a fresh table, dropped after the test."""
    made: list[SQLStorage] = []

    def factory(priority_fn=None) -> SQLStorage:
        made.append(SQLStorage(URL or "", f"t{uuid.uuid4().hex[:10]}", priority_fn=priority_fn))
        return made[-1]

    yield factory
    for store in made:
        with store.engine.begin() as conn:
            for t in (store.blobs, store.writers, store.table):
                t.drop(conn)
        store.engine.dispose()


@pytest.fixture
def storage(new_storage):
    return new_storage()


def test_roundtrip_dedup_and_fifo(storage, make_experience):
    writer = SQLWriter(storage)
    writer.write([make_experience(i) for i in range(6)])
    writer.write([make_experience(i) for i in range(4, 8)])  # 4 and 5 again
    assert (writer.written, writer.duplicates) == (8, 2)
    got = SQLReader(storage).read(20, timeout=0)
    assert [e.eid.task for e in got] == list(range(8))
    assert got[3].prompt_text == "prompt 3" and got[3].logprobs.tolist() == [-0.5] * 8


def test_priority_order(new_storage, make_experience):
    store = new_storage(priority_fn=lambda e: e.reward)
    SQLWriter(store).write([make_experience(i) for i in (3, 9, 1, 5)])
    assert [e.eid.task for e in SQLReader(store, order="priority").read(4, timeout=0)] == [9, 5, 3, 1]


def test_concurrent_claimers_get_each_row_once(storage, make_experience):
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
                seen[k].extend(e.eid.task for e in reader.read(37))
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


def test_resume_gives_back_rows_read_after_the_state(storage, make_experience):
    SQLWriter(storage).write([make_experience(i) for i in range(30)])
    reader = SQLReader(storage)
    reader.read(5, timeout=0)
    saved = reader.state_dict()
    lost = [e.eid.task for e in reader.read(10, timeout=0)]
    resumed = SQLReader(storage)
    resumed.load_state_dict(saved)
    assert resumed.released == 10
    assert [e.eid.task for e in resumed.read(10, timeout=0)] == lost
