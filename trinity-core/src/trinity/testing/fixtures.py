"""Pytest fixtures, auto-loaded through the ``pytest11`` entry point of trinity-core.

``plugin_manager``: a fresh plugin manager (no entry-point autoloading) installed as the
process-wide one for the test. ``register_plugin``: ``register_plugin(obj, name)`` registers a
plugin object on it; everything is unregistered after the test. ``tiny_model``:
``tiny_model(**args)`` is the path of a tiny local model (``create_tiny_model(path, **args)``),
built once per session for the same arguments and shared by every test asking for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trinity.plugins import TrinityPluginManager
from trinity.testing.plugins import isolated_plugin_manager
from trinity.testing.tiny_model import create_tiny_model


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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_model(**args)``: the path of the tiny model ``create_tiny_model(path, **args)``
    saves (``seed``, ``hidden_size``, ``vocab_chars``, ...), built once per test session for the
    same arguments (defaults filled in, so ``tiny_model()`` and ``tiny_model(seed=0)`` are one
    model). Every test asking for those arguments reads the same folder: never write into it;
    a test that changes the files works on a copy (``shutil.copytree``)."""
    signature = inspect.signature(create_tiny_model)
    built: dict[tuple, Path] = {}

    def get(**args: Any) -> Path:
        bound = signature.bind("unused", **args)
        bound.apply_defaults()
        key = tuple(sorted((k, v) for k, v in bound.arguments.items() if k != "path"))
        if key not in built:
            built[key] = create_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", **args)
        return built[key]

    return get
