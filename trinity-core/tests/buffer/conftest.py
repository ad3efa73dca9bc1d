"""Shared fixtures for the buffer tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch

from trinity.experience import EID, Experience


def _make_experience(i: int, *, tokens: int = 16, writer: str = "w", model_version: int = 0) -> Experience:
    return Experience(
        tokens=torch.arange(tokens),
        prompt_length=tokens // 2,
        logprobs=torch.full((tokens - tokens // 2,), -0.5),
        reward=float(i),
        eid=EID(batch=writer, task=i, run=i % 3),
        model_version=model_version,
        prompt_text=f"prompt {i}",
        response_text=f"response {i}",
    )


@pytest.fixture
def make_experience() -> Callable[..., Experience]:
    """``make_experience(i, tokens=16, writer="w", model_version=0)``: a small deterministic
    experience whose ``eid`` is ``(writer, i)`` and reward is ``i``."""
    return _make_experience


POSTGRES_URL_VAR = "TRINITY_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """The SQLAlchemy URL of an empty database, once per database the SQL buffer is tested on:
    a SQLite file in ``tmp_path``, and a new database on the PostgreSQL server that
    ``TRINITY_TEST_POSTGRES_URL`` names (dropped after the test; skipped without the variable:
    ``.ci/postgres.sh start`` runs a throwaway server and prints it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'buffer.db'}"
        return
    server = os.environ.get(POSTGRES_URL_VAR)
    if not server:
        pytest.skip(f"set {POSTGRES_URL_VAR} to test on PostgreSQL (.ci/postgres.sh start runs a server)")
    import sqlalchemy as sa

    name = f"trinity_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield sa.make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            # Connections the test left open (pooled engines, killed worker processes) would
            # block the drop.
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        admin.dispose()


@pytest.fixture
def sql_rows(sql_url: str) -> Iterator[Callable[[str], list[tuple]]]:
    """``sql_rows(statement)``: runs one plain SQL statement on ``sql_url``'s database in a
    transaction of its own (committed) and returns its rows (``[]`` for a statement without)."""
    import sqlalchemy as sa

    engine = sa.create_engine(sql_url)

    def rows(statement: str) -> list[tuple]:
        with engine.begin() as conn:
            result = conn.exec_driver_sql(statement)
            return [tuple(r) for r in result] if result.returns_rows else []

    yield rows
    engine.dispose()
