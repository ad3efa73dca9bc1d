"""End to end: a decoupled pair, as upstream's ``async_gsm8k`` runs it: an ``explore`` job and a
``train`` job (two ``trinity run`` processes, each with a Ray of its own) share a ``queue``
buffer through its SQL path and the weights through checkpoints. The explorer is SIGKILLed
mid-run and restarted, then the trainer; nothing is lost or trained twice, and every explore
step ran on the version the fixed sync style promises (the first sync waits for the trainer's
first checkpoint too). The pair runs on SQLite, and once more on PostgreSQL when
``TRINITY_TEST_POSTGRES_URL`` names a server. Then a killed explorer that nobody restarts: the
trainer stops waiting with a line that says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOTAL, BATCH = 8, 16  # steps; experiences per step (4 tasks x 4 rollouts)
INTERVAL = 2  # synchronizer.sync_interval (sync_offset 0) and the trainer's checkpoint interval
POSTGRES_URL_VAR = "TRINITY_TEST_POSTGRES_URL"

# The relative SQLite path names one file for both jobs: both start in the test's folder.
SQLITE = ("sqlite:///buffer.db", "pair_buffer")


def _write(root: Path, mode: str, timeout: int = 300, buffer: tuple[str, str] = SQLITE) -> Path:
    url, table = buffer
    config = tiny_job(
        root,
        name="pair",
        mode=mode,
        continue_from_checkpoint=True,
        algorithm={"repeat_times": 4, "optimizer": {"lr": 1.0e-3}},
        model={"max_response_tokens": 12},
        buffer={
            "total_steps": TOTAL,
            "batch_size": 4,
            "trainer_input": {
                "experience_buffer": {
                    "name": table,
                    "storage_type": "queue",
                    "path": url,
                    "max_read_timeout": timeout,
                }
            },
        },
        explorer={"eval_on_startup": None},
        synchronizer={"sync_method": "checkpoint", "sync_interval": INTERVAL, "sync_offset": 0},
        trainer={"save_interval": INTERVAL},
    )
    return write_job(root / f"{mode}.yaml", config)


@pytest.fixture(params=["sqlite", "postgresql"])
def pair_buffer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(SQLAlchemy URL, table)`` of the pair's buffer: a SQLite file in the test's folder, or
    a fresh table on the PostgreSQL server ``TRINITY_TEST_POSTGRES_URL`` names (dropped after the
    test; skipped without the variable)."""
    if request.param == "sqlite":
        yield SQLITE
        return
    url = os.environ.get(POSTGRES_URL_VAR)
    if not url:
        pytest.skip(f"set {POSTGRES_URL_VAR} to run the decoupled pair on PostgreSQL (.ci/postgres.sh start)")
    table = f"pair_{uuid.uuid4().hex[:12]}"
    try:
        yield url, table
    finally:
        import sqlalchemy as sa

        engine = sa.create_engine(url)
        with engine.begin() as conn:
            for name in (f"{table}_blobs", f"{table}_writers", table):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
        engine.dispose()


def _rows(root: Path, buffer: tuple[str, str], query: str) -> list[tuple]:
    """The rows ``query`` returns from the pair's buffer (``{t}`` in it: the table's name)."""
    import sqlalchemy as sa

    url, table = buffer
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        url = f"sqlite:///{root / url[len('sqlite:///') :]}"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(query.format(t=table))]
    finally:
        engine.dispose()


def _start(root: Path, mode: str, env: dict[str, str]) -> subprocess.Popen:
    # Both jobs start in `root`: the queue's relative sqlite path must name one file for both.
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(root / f"{mode}.yaml")],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # a SIGKILL hits the driver only, as a crash would
    )


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(3)  # let Ray's reaper take down the orphaned local cluster (and its explorer)


def _read_until(proc: subprocess.Popen, marker: str) -> str:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return "".join(seen)
    pytest.fail(f"ended before {marker!r}: " + "".join(seen)[-3000:])


def test_explore_and_train_jobs_survive_a_killed_explorer(tmp_path, math_job, job_env, pair_buffer):
    math_job(tmp_path, train=200, test=4, difficulty=3)
    _write(tmp_path, "explore", buffer=pair_buffer)
    _write(tmp_path, "train", buffer=pair_buffer)
    trainer = _start(tmp_path, "train", job_env)
    explorer = _start(tmp_path, "explore", job_env)
    try:
        # The explorer dies after step 3: past its first sync point (step 2, which waited for
        # the trainer's first checkpoint), so the restarted one must load that version again.
        _read_until(explorer, f"[explorer] step 3/{TOTAL}")
        _kill(explorer)
        explorer = _start(tmp_path, "explore", job_env)
        # Then the trainer dies after step 3 (checkpoint 2 saved, step 3's weights not).
        _read_until(trainer, f"[trainer] step 3/{TOTAL}")
        _kill(trainer)
        trainer = _start(tmp_path, "train", job_env)
        explore_out, _ = explorer.communicate(timeout=600)
        train_out, _ = trainer.communicate(timeout=600)
    finally:
        for proc in (explorer, trainer):
            if proc.poll() is None:
                proc.kill()
    assert explorer.returncode == 0, explore_out[-3000:]
    assert trainer.returncode == 0, train_out[-3000:]
    assert f"done: {TOTAL} train steps" in train_out, train_out[-3000:]
    logs = tmp_path / "ckpt" / "e2e" / "pair" / "log"
    assert "resumed explorer" in (logs / "explorer.log").read_text()
    assert "resumed trainer at step" in (logs / "trainer.log").read_text()
    rows = lambda query: _rows(tmp_path, pair_buffer, query)  # noqa: E731
    per_step = dict(rows("select consumed_step, count(*) from {t} where consumed = 1 group by 1"))
    [(unread,)] = rows("select count(*) from {t} where consumed = 0")
    [uids] = rows("select count(*), count(distinct uid) from {t}")
    steps = dict(rows("select explorer_step, count(*) from {t} group by 1"))
    versions = {
        s: (lo, hi)
        for s, lo, hi in rows(
            "select explorer_step, min(model_version), max(model_version) from {t} group by 1"
        )
    }
    # The redone explorer step wrote nothing twice; the rows the killed trainer read after its
    # checkpoint were given back and trained by the resumed trainer's steps; each training step
    # trained on exactly one explorer step's batch, and nothing is left over.
    assert uids[0] == uids[1] == TOTAL * BATCH and unread == 0
    assert steps == {step: BATCH for step in range(1, TOTAL + 1)}
    assert per_step == {step: BATCH for step in range(1, TOTAL + 1)}
    # Fixed style, sync_interval 2, sync_offset 0: after explore step 2k the explorer waits for
    # the trainer's checkpoint of step 2k (the first one included, while no checkpoint exists
    # yet), so steps 1-8 ran on versions 0,0,2,2,4,4,6,6, through both kills.
    expected = {step: (step - 1) // INTERVAL * INTERVAL for step in range(1, TOTAL + 1)}
    assert versions == {step: (v, v) for step, v in expected.items()}, explore_out[-3000:]
    # The restarted trainer's checkpoint 4 comes seconds after the explorer's step 4: waited for.
    assert "waits for the trainer job's checkpoint of step" in explore_out, explore_out[-3000:]


def test_a_trainer_whose_explorer_was_killed_stops_waiting_and_says_why(tmp_path, math_job, job_env):
    math_job(tmp_path, train=200, test=4, difficulty=3)
    _write(tmp_path, "explore")
    # Its first batch is written before the explorer is killed; the wait for the second ends
    # after max_read_timeout (the gone writers are seen at once).
    _write(tmp_path, "train", timeout=6)
    explorer = _start(tmp_path, "explore", job_env)
    trainer = None
    try:
        _read_until(explorer, f"[explorer] step 1/{TOTAL}")
        _kill(explorer)
        trainer = _start(tmp_path, "train", job_env)
        out, _ = trainer.communicate(timeout=300)
    finally:
        for proc in (explorer, trainer):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert trainer.returncode == 1, out[-3000:]
    assert "every writer of SQL buffer 'pair_buffer' is gone without finishing" in out, out[-3000:]
