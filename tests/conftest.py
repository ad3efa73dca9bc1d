"""Shared set-up of the cross-package tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    """The environment Trinity-RFT's example configs read (``TRINITY_MODEL_PATH``,
    ``TRINITY_CHECKPOINT_ROOT_DIR``, ``TRINITY_TASKSET_PATH``), no Ray cluster or scoring model
    named by the machine, and ``tmp_path`` as the folder the job is started from."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "data"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
