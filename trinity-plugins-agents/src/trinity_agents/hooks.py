"""Hook implementations of trinity-plugins-agents (entry point `trinity` → `trinity_agents.hooks`).

Importing this module must stay light (no torch, no gymnasium at import time): `trinity plugins`
loads it. The workflow modules import only the core's light modules; gymnasium is imported when a
FrozenLake map is first drawn.
"""

from __future__ import annotations

from trinity import hookimpl


@hookimpl
def register_workflows(register):
    """Register ``toolcall_workflow`` and ``frozen_lake_workflow`` (Trinity-RFT's names)."""
    from trinity_agents.frozen_lake import FrozenLakeWorkflow
    from trinity_agents.toolcall import ToolCallWorkflow

    register("toolcall_workflow", ToolCallWorkflow)
    register("frozen_lake_workflow", FrozenLakeWorkflow)
