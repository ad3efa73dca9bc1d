"""Pytest fixtures, auto-loaded through the ``pytest11`` entry point of trinity-core.

``plugin_manager``: a fresh plugin manager (no entry-point autoloading) installed as the
process-wide one for the test. ``register_plugin``: ``register_plugin(obj, name)`` registers a
plugin object on it; everything is unregistered after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trinity.plugins import TrinityPluginManager
from trinity.testing.plugins import isolated_plugin_manager


@pytest.fixture
def plugin_manager() -> Iterator[TrinityPluginManager]:
    with isolated_plugin_manager() as manager:
        yield manager


@pytest.fixture
def register_plugin(plugin_manager: TrinityPluginManager) -> Iterator[Callable[[Any, str], Any]]:
    names: list[str] = []

    def register(plugin: Any, name: str) -> Any:
        plugin_manager.register_plugin(plugin, name)
        names.append(name)
        return plugin

    try:
        yield register
    finally:
        for name in reversed(names):
            plugin_manager.unregister_plugin(name)
