"""Shared set-up of the end-to-end tests: a tiny math job's files, and the environment of a
``trinity run`` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
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
    """``math_job(root, train=, test=, difficulty=, **model_args)`` writes an arithmetic taskset
    to ``root/data`` and a fresh tiny math model to ``root/model`` (``model_args``: sizes, see
    ``create_tiny_model``); returns ``root``."""

    def make(root: Path, *, train: int, test: int, difficulty: int = 1, **model_args) -> Path:
        from trinity_math.tasks import main as make_tasks
        from trinity_math.tiny import create_math_model

        args = ["arithmetic", "--out", str(root / "data"), "--train", str(train), "--test", str(test)]
        assert make_tasks([*args, "--difficulty", str(difficulty)]) == 0
        create_math_model(root / "model", seed=0, **model_args)
        return root

    return make


#: Test plugins (``--plugin-dir``): the ``weights_probe`` eval workflow.
PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(scope="session")
def trinity_run(job_env) -> Callable[..., subprocess.CompletedProcess]:
    """``trinity_run(config, *args)`` runs ``trinity run --config config *args`` in a subprocess
    (``job_env``), asserts it succeeded and returns the finished process."""

    def run(config: Path, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config), *args]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=job_env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    return run


@pytest.fixture(scope="session")
def probe_score() -> Callable[[Path], float]:
    """What the ``weights_probe`` eval workflow reports for the weights saved at a path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("weights_probe", PLUGINS / "weights_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score
