"""Old home of :mod:`trinity.lazy` (kept so existing imports work); import from ``trinity.lazy``."""

from __future__ import annotations

from trinity.lazy import LazyModule as _LazyModule
from trinity.lazy import lazy_import

__all__ = ["_LazyModule", "lazy_import"]
