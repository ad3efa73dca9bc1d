"""Plugin-manager isolation for tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trinity.plugins import TrinityPluginManager, get_manager, set_manager


@contextmanager
def isolated_plugin_manager(*, autoload: bool = False) -> Iterator[TrinityPluginManager]:
    """Install a fresh process-wide plugin manager for the block, then restore the old one.

    Entry-point autoloading is off by default so a test sees only what it registers.
    """
    manager = TrinityPluginManager(autoload=autoload)
    previous = set_manager(manager)
    try:
        yield manager
    finally:
        set_manager(previous)


@contextmanager
def registered_plugin(plugin: Any, name: str, manager: TrinityPluginManager | None = None) -> Iterator[Any]:
    """Register ``plugin`` under ``name`` for the block (on the current manager by default)."""
    manager = manager or get_manager()
    manager.register_plugin(plugin, name)
    try:
        yield plugin
    finally:
        manager.unregister_plugin(name)
