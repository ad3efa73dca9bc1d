"""Hook implementations of trinity-plugins-webshop (entry point `trinity` → `trinity_webshop.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
The workflow module imports only the core's light modules; the catalog, BM25 index and the
original WebShop package are loaded when a workflow first runs.
"""

from __future__ import annotations

from trinity import hookimpl


@hookimpl
def register_workflows(register):
    """Register ``webshop_workflow``."""
    from trinity_webshop.workflow import WebShopWorkflow

    register("webshop_workflow", WebShopWorkflow)
