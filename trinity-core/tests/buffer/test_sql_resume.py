"""SQL buffer: idempotent writes by experience id, and a trainer resumed from a checkpoint
re-reading exactly what the lost steps had consumed (real processes; each test on a SQLite file
and on PostgreSQL, see the ``sql_url`` fixture)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.experience import EID

WORKER = str(Path(__file__).with_name("sql_worker.py"))


# -- idempotent writes -----------------------------------------------------------------------


def test_a_redone_batch_is_skipped_counted_and_logged_once(sql_url, make_experience, caplog):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i) for i in range(10)])
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.sql_io"):
        writer.write([make_experience(i) for i in range(10)])  # the explorer redid this step
    assert storage.counts()["total"] == 10
    assert writer.metrics() == {"buffer/written": 10.0, "buffer/duplicates_skipped": 10.0}
    warnings = [r for r in caplog.records if "already stored" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 10 of 10" in warnings[0].getMessage()


def test_a_partly_redone_batch_stores_only_the_new_rows_with_their_own_blobs(
    sql_url, sql_rows, make_experience
):
    storage = SQLStorage(sql_url, "exp")
    writer = SQLWriter(storage)
    writer.write([make_experience(i) for i in range(0, 6)])
    writer.write([make_experience(i) for i in range(3, 9)])  # 3..5 stored already
    assert writer.duplicates == 3 and writer.written == 9
    got = SQLReader(storage).read(20, timeout=0)
    assert [e.eid.task for e in got] == list(range(9))
    # Every row has its own experience's blob (no blob shifted onto a neighbour's row).
    rows = sql_rows("SELECT e.uid, length(b.blob) FROM exp e JOIN exp_blobs b ON b.id = e.id ORDER BY e.id")
    assert len(rows) == 9 and [uid for uid, _ in rows] == [e.eid.uid for e in got]
    assert sql_rows("SELECT count(*) FROM exp_blobs") == [(9,)]


def test_repeated_ids_inside_one_batch_are_all_kept_and_a_redo_still_skips_them(
    sql_url, sql_rows, make_experience
):
    # A workflow that emits several experiences per run without numbering eid.step.
    storage = SQLStorage(sql_url, "exp")
    batch = [make_experience(0) for _ in range(3)]
    batch[1].reward, batch[2].reward = 1.0, 2.0
    writer = SQLWriter(storage)
    writer.write(batch)
    writer.write(batch)
    assert writer.written == 3 and writer.duplicates == 3
    assert sorted(r for (r,) in sql_rows("SELECT uid FROM exp")) == [
        "w/0/0/0",
        "w/0/0/0#1",
        "w/0/0/0#2",
    ]
    assert [e.reward for e in SQLReader(storage).read(5, timeout=0)] == [0.0, 1.0, 2.0]


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_the_same_batch_written_by_two_processes_at_once_is_stored_once(sql_url, sql_rows):
    url = sql_url
    SQLStorage(url, "exp").counts()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "write", url, "same", "3000", "100"], stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert sql_rows("SELECT count(*), count(DISTINCT uid) FROM exp") == [(3000, 3000)]
    assert sql_rows("SELECT count(*) FROM exp_blobs") == [(3000,)]
    got = SQLReader(SQLStorage(url, "exp")).read(4000, timeout=0)
    assert sorted(e.eid.task for e in got) == list(range(3000))


# -- resume from a checkpoint ----------------------------------------------------------------


def _train(url: str, tmp_path: Path, out: str, steps: int, save_at: int, resume: Path | None = None) -> None:
    args = [sys.executable, WORKER, "train", url, str(tmp_path / out), str(steps), "10"]
    args += [str(save_at), str(tmp_path / f"state_{out}.json")]
    if resume is not None:
        args.append(str(resume))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # the worker "crashes" at the end


def _steps(path: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        step, uid = line.split()
        out.setdefault(int(step), []).append(uid)
    return out


@pytest.mark.e2e
def test_a_trainer_resumed_from_step_3_rereads_exactly_steps_4_and_5(
    tmp_path, sql_url, sql_rows, make_experience
):
    writer = SQLWriter(SQLStorage(sql_url, "exp"))
    writer.write([make_experience(i) for i in range(100)])
    # Trainer process 1 trains steps 1..5 (10 experiences each), checkpoints after step 3, dies.
    _train(sql_url, tmp_path, "first", steps=5, save_at=3)
    first = _steps(tmp_path / "first")
    assert sorted(first) == [1, 2, 3, 4, 5]
    assert sql_rows("SELECT count(*) FROM exp WHERE consumed = 1") == [(50,)]
    assert sql_rows(
        "SELECT consumed_step, count(*) FROM exp WHERE consumed_step IS NOT NULL GROUP BY 1 ORDER BY 1"
    ) == [(s, 10) for s in range(1, 6)]
    # Trainer process 2 resumes from the step-3 checkpoint and trains steps 4..6.
    _train(sql_url, tmp_path, "second", steps=3, save_at=-1, resume=tmp_path / "state_first.json")
    second = _steps(tmp_path / "second")
    assert second[4] == first[4] and second[5] == first[5], "lost steps must get the same batches"
    assert second[6] == [f"w/{i}/{i % 3}/0" for i in range(50, 60)], "then reading goes on"
    trained = first[1] + first[2] + first[3] + second[4] + second[5] + second[6]
    assert len(trained) == len(set(trained)) == 60, "after the resume nothing is trained twice"
    assert sql_rows("SELECT count(*) FROM exp WHERE consumed = 1") == [(60,)]


def test_loading_a_state_gives_back_only_this_readers_later_rows(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).write([make_experience(i) for i in range(40)])
    mine, other = SQLReader(storage), SQLReader(storage)
    mine.read(5, timeout=0)  # 0..4
    saved = json.loads(json.dumps(mine.state_dict()))  # as a checkpoint stores it
    assert [e.eid.task for e in other.read(5, timeout=0)] == [5, 6, 7, 8, 9]
    assert [e.eid.task for e in mine.read(5, timeout=0)] == [10, 11, 12, 13, 14]
    assert [e.eid.task for e in mine.read(5, timeout=0)] == [15, 16, 17, 18, 19]

    resumed = SQLReader(SQLStorage(sql_url, "exp"))
    resumed.load_state_dict(saved)
    assert resumed.released == 10
    assert [e.eid.task for e in resumed.read(10, timeout=0)] == list(range(10, 20))
    assert [e.eid.task for e in resumed.read(3, timeout=0)] == [20, 21, 22]
    # The state of a reader made before read sequences existed restores without releasing.
    legacy = SQLReader(storage)
    legacy.load_state_dict({"rows_read": 7})
    assert legacy.released == 0 and legacy.rows_read == 7
    assert storage.counts()["unread"] == 40 - 23


def test_resuming_twice_from_the_same_checkpoint_gives_the_same_batches(sql_url, make_experience):
    storage = SQLStorage(sql_url, "exp")
    SQLWriter(storage).write([make_experience(i, writer="x") for i in range(30)])
    reader = SQLReader(storage)
    reader.read(4, timeout=0)
    saved = reader.state_dict()
    lost = [e.eid.uid for e in reader.read(4, timeout=0)]
    for _ in range(2):  # crash again before the next checkpoint, resume again
        again = SQLReader(storage)
        again.load_state_dict(saved)
        assert [e.eid.uid for e in again.read(4, timeout=0)] == lost


def test_a_table_from_an_older_version_fails_with_a_clear_message(sql_url):
    engine = sa.create_engine(sql_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE exp (id INTEGER PRIMARY KEY, consumed INTEGER)")
    engine.dispose()
    with pytest.raises(RuntimeError, match=r"older trinity-core.*no column uid.*new database file"):
        SQLStorage(sql_url, "exp").counts()


def test_uids_include_step_and_suffix(sql_url, sql_rows, make_experience):
    storage = SQLStorage(sql_url, "exp")
    exps = [make_experience(1), make_experience(1)]
    exps[1].eid = EID(batch="w", task=1, run=1, step=2, suffix="turn")
    SQLWriter(storage).write(exps)
    assert sorted(r for (r,) in sql_rows("SELECT uid FROM exp")) == ["w/1/1/0", "w/1/1/2/turn"]
