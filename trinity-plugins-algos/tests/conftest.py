"""Fixtures: the plugin registered on a fresh manager (``trinity.testing``'s fixtures: no
entry-point autoload), and random inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import trinity_algos.hooks

# pytest runs with --import-mode=importlib: make algos_testutil importable by the test modules.
sys.path.insert(0, str(Path(__file__).parent))

PLUGIN_NAME = "trinity-plugins-algos"


@pytest.fixture
def algos_manager(plugin_manager, register_plugin):
    """A fresh plugin manager holding only this plugin, installed process-wide for the test."""
    register_plugin(trinity_algos.hooks, PLUGIN_NAME)
    return plugin_manager
