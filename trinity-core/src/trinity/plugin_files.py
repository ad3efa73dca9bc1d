"""Importing plugin files from ``--plugin-dir`` folders, describing a plugin's failure and tracing hook calls, for
:class:`trinity.plugins.TrinityPluginManager`."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any


def dir_module_name(file: Path) -> str:
    """The ``sys.modules`` name of a plugin-dir file (unique per path, stable across processes)."""
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    return f"trinity_plugin_dir_{digest}_{file.stem}"


def import_file(mod_name: str, file: Path, search: Path | None = None) -> ModuleType:
    """Import ``file`` as module ``mod_name`` (a package searching ``search`` when given)."""
    locations = [str(search)] if search is not None else None
    spec = importlib.util.spec_from_file_location(mod_name, file, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def describe_exception(exc: BaseException, doing: str) -> str:
    """One line: the exception, what was being done, and where it was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__} while {doing}: {exc}{where}"


def trace_before(hook_name: str, hook_impls: list, kwargs: dict) -> None:
    """``TRINITY_TRACE_HOOKS``: say which plugins a hook call reaches."""
    names = ", ".join(i.plugin_name for i in hook_impls)
    print(f"[trinity] calling {hook_name} on {names}", file=sys.stderr)


def trace_after(outcome: Any, hook_name: str, hook_impls: list, kwargs: dict) -> None:
    """``TRINITY_TRACE_HOOKS``: say that a hook call returned."""
    print(f"[trinity] {hook_name} done", file=sys.stderr)
