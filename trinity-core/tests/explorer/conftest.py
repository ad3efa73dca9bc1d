"""Shared fixtures of the explorer tests: one tiny local model per session."""

from __future__ import annotations

import pytest

from trinity.testing.tiny_model import create_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("explorer_tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def engine(tiny_model_path):
    from trinity.explorer.engines.transformers_engine import TransformersEngine

    return TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)
