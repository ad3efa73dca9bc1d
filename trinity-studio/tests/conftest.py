"""Shared fixtures of the studio tests: a finished demo run and a test client over its root."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from trinity_studio.app import create_app
from trinity_studio.demo import make_demo_run

DEMO_STEPS = 6
DEMO_EXPERIENCES = 120


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory):
    """A checkpoint root holding one finished run, ``demo/tiny`` (scalars + an SQL buffer)."""
    root = tmp_path_factory.mktemp("studio_root")
    make_demo_run(str(root), steps=DEMO_STEPS, experiences=DEMO_EXPERIENCES)
    return root


@pytest.fixture
def client(demo_root):
    return TestClient(create_app(str(demo_root)))
