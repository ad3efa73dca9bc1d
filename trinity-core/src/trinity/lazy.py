"""Lazy module proxies, so the core and plugins stay light to import (public API).

``trinity --help`` and ``trinity plugins`` must not pay for importing torch, and neither should
a plugin's hook module: modules that hold tensor code bind ``torch = lazy_import("torch")`` and
the real import happens on first attribute access::

    from typing import TYPE_CHECKING

    from trinity.lazy import lazy_import

    if TYPE_CHECKING:
        import torch  # editors and type checkers see the real module
    else:
        torch = lazy_import("torch")
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class LazyModule(types.ModuleType):
    """Stands in for a module until an attribute is read, then forwards to the real one."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_target"] = name

    def _load(self) -> types.ModuleType:
        return importlib.import_module(self.__dict__["_lazy_target"])

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._load())


def lazy_import(name: str) -> Any:
    """Return ``name`` if it is already imported, else a proxy that imports it on first use."""
    return sys.modules.get(name) or LazyModule(name)


__all__ = ["LazyModule", "lazy_import"]
