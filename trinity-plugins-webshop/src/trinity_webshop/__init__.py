"""A multi-turn WebShop environment and workflow for Trinity.

Public API (imported lazily, so ``import trinity_webshop`` stays cheap):

- :func:`get_reward` — WebShop's purchase reward (:mod:`trinity_webshop.reward`).
- :class:`WebShopEnv` — the built-in text-protocol environment (:mod:`trinity_webshop.env`).
- :func:`load_catalog` / :func:`default_catalog` — products and goals (:mod:`trinity_webshop.catalog`).
- :class:`WebShopWorkflow` — registered as ``webshop_workflow`` (:mod:`trinity_webshop.workflow`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "get_reward": "trinity_webshop.reward",
    "WebShopEnv": "trinity_webshop.env",
    "WebShopSession": "trinity_webshop.env",
    "Catalog": "trinity_webshop.catalog",
    "load_catalog": "trinity_webshop.catalog",
    "default_catalog": "trinity_webshop.catalog",
    "WebShopWorkflow": "trinity_webshop.workflow",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trinity_webshop' has no attribute {name!r}")
