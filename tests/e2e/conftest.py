"""Shared set-up of the end-to-end tests: a tiny math job's files, and the environment of a
``trinity run`` subprocess."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def job_env() -> dict[str, str]:
    """Environment for ``trinity run`` subprocesses: offline, unbuffered, and a Ray of its own
    (never a cluster another test left behind)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="session")
def math_job() -> Callable[..., Path]:
    """``math_job(root, train=, test=, difficulty=)`` writes an arithmetic taskset to
    ``root/data`` and a fresh tiny math model to ``root/model``; returns ``root``."""

    def make(root: Path, *, train: int, test: int, difficulty: int = 1) -> Path:
        from trinity_math.tasks import main as make_tasks
        from trinity_math.tiny import create_math_model

        args = ["arithmetic", "--out", str(root / "data"), "--train", str(train), "--test", str(test)]
        assert make_tasks([*args, "--difficulty", str(difficulty)]) == 0
        create_math_model(root / "model", seed=0)
        return root

    return make
