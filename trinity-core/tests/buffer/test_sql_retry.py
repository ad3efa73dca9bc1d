"""SQL writes and claims retry transient errors (a locked database) as the buffer's
``max_retry_times`` / ``max_retry_interval`` say, on a real SQLite file held locked."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from trinity.buffer import sql as sql_module
from trinity.buffer.factory import get_buffer_reader, get_buffer_writer
from trinity.buffer.sql import SQLStorage
from trinity.buffer.sql_schema import create_sql_engine
from trinity.config import ExperienceBufferConfig


@pytest.fixture(autouse=True)
def _short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contenders give up on a lock after 50 ms instead of a minute, so a held lock is an error."""
    monkeypatch.setattr(
        sql_module, "create_sql_engine", lambda url: create_sql_engine(url, busy_timeout_ms=50)
    )


def _hold_lock(db: Path, seconds: float) -> threading.Thread:
    locked = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        locked.set()
        time.sleep(seconds)
        con.execute("COMMIT")
        con.close()

    thread = threading.Thread(target=hold)
    thread.start()
    locked.wait(5)
    return thread


def test_write_and_claim_retry_while_the_database_is_locked(tmp_path, make_experience, caplog):
    db = tmp_path / "buffer.db"
    storage = SQLStorage(f"sqlite:///{db}", "exp", max_retry_times=20, max_retry_interval=0.05)
    storage.engine  # noqa: B018 - tables exist before the lock is taken
    thread = _hold_lock(db, 0.5)
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.sql"):
        assert storage.write([make_experience(i) for i in range(3)]) == 3
    thread.join()
    assert any("writing 3 experiences failed" in r.getMessage() for r in caplog.records)

    thread = _hold_lock(db, 0.5)
    assert [row_id for row_id, _ in storage.claim(3)] == [1, 2, 3]
    thread.join()


def test_no_retries_raise_the_first_error(tmp_path, make_experience):
    db = tmp_path / "buffer.db"
    storage = SQLStorage(f"sqlite:///{db}", "exp", max_retry_times=0, max_retry_interval=0)
    storage.engine  # noqa: B018
    thread = _hold_lock(db, 0.5)
    try:
        with pytest.raises(sa.exc.OperationalError, match="locked"):
            storage.write([make_experience(0)])
    finally:
        thread.join()
    assert storage.counts()["total"] == 0


def test_other_errors_are_not_retried(tmp_path, make_experience):
    storage = SQLStorage(f"sqlite:///{tmp_path / 'b.db'}", "exp", max_retry_times=5, max_retry_interval=10)
    row = storage.rows_for([make_experience(0)])[0] | {"model_version": None}
    start = time.monotonic()
    with pytest.raises(sa.exc.IntegrityError):  # a NOT NULL column left empty: a mistake, not transient
        storage.insert_rows([row])
    assert time.monotonic() - start < 5


def test_buffer_keys_reach_the_storage(tmp_path):
    config = ExperienceBufferConfig(
        name="exp",
        storage_type="sql",
        path=f"sqlite:///{tmp_path / 'b.db'}",
        max_retry_times=7,
        max_retry_interval=2,
    )
    for storage in (get_buffer_writer(config).storage, get_buffer_reader(config).storage):
        assert (storage.max_retry_times, storage.max_retry_interval) == (7, 2)
