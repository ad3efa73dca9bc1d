"""Hook implementations of trinity-plugins-agents (entry point `trinity` → `trinity_agents.hooks`).

Importing this module must stay light (no torch, no gymnasium at import time): `trinity plugins`
loads it. The workflow modules import only the core's light modules; gymnasium is imported when a
FrozenLake map is first drawn.
"""

from __future__ import annotations

from trinity import hookimpl


@hookimpl
def register_workflows(register):
    """Register the workflows under Trinity-RFT's names (``toolcall_workflow``,
    ``frozen_lake_workflow``, the AgentScope ReAct workflows...)."""
    from trinity_agents.frozen_lake import FrozenLakeWorkflow
    from trinity_agents.toolcall import ToolCallWorkflow

    register("toolcall_workflow", ToolCallWorkflow)
    register("frozen_lake_workflow", FrozenLakeWorkflow)
    # AgentScope ReAct agents (extra `agentscope`): agentscope is imported only when one runs.
    from trinity_agents.agentscope_frozen_lake import UPSTREAM_CLASS_PATH, AgentScopeFrozenLakeWorkflow
    from trinity_agents.agentscope_react import (
        AgentScopeReactMathWorkflow,
        AgentScopeReActWorkflow,
        AgentScopeV0ReactMathWorkflow,
    )

    register("agentscope_react_workflow", AgentScopeReActWorkflow)
    register("agentscope_react_math_workflow", AgentScopeReactMathWorkflow)
    register("agentscopev0_react_math_workflow", AgentScopeV0ReactMathWorkflow)
    register("agentscope_frozen_lake_workflow", AgentScopeFrozenLakeWorkflow)
    # Trinity-RFT's frozenlake_agent.yaml names its example file's class; registered names are
    # looked up before class paths are imported, so that config resolves to this workflow.
    register(UPSTREAM_CLASS_PATH, AgentScopeFrozenLakeWorkflow)
    # ALFWorld: alfworld / textworld (extra `alfworld`) are imported only when a game starts.
    from trinity_agents.alfworld import AlfworldWorkflow, StepWiseAlfworldWorkflow

    register("alfworld_workflow", AlfworldWorkflow)
    register("step_wise_alfworld_workflow", StepWiseAlfworldWorkflow)
    from trinity_agents.raft_alfworld import RAFTAlfworldWorkflow, RAFTReflectAlfworldWorkflow

    register("RAFT_alfworld_workflow", RAFTAlfworldWorkflow)
    register("RAFT_reflect_alfworld_workflow", RAFTReflectAlfworldWorkflow)
    # ScienceWorld: scienceworld (extra `sciworld`, a Java simulator) is imported only when a task starts.
    from trinity_agents.sciworld import SciWorldWorkflow

    register("sciworld_workflow", SciWorldWorkflow)
    # Email search over an SQLite mailbox (AgentScope, extra `agentscope`, imported when it runs).
    from trinity_agents.email_search import EmailSearchWorkflow

    register("email_search_workflow", EmailSearchWorkflow)
    # Web search over a local corpus (AgentScope, extra `agentscope`; bm25s), no network.
    from trinity_agents.websearch import AgentScopeV1ReactSearchWorkflow

    register("agentscope_v1_react_search_workflow", AgentScopeV1ReactSearchWorkflow)
