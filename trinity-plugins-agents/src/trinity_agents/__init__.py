"""Agentic workflows for Trinity: tool calling, FrozenLake, and a multi-turn base class.

Public API (imported lazily, so ``import trinity_agents`` stays cheap):

- :class:`MultiTurnWorkflow`, :class:`StepResult`, :class:`Episode`, :class:`Turn` — the base
  class for multi-turn (agentic) workflows (:mod:`trinity_agents.multi_turn`).
- :class:`ToolCallWorkflow` (``toolcall_workflow``), :func:`score_tool_calls`,
  :func:`toolcall_reward` (:mod:`trinity_agents.toolcall`).
- :class:`FrozenLakeWorkflow` (``frozen_lake_workflow``), :func:`generate_random_map`
  (:mod:`trinity_agents.frozen_lake`).
- :class:`AlfworldWorkflow` (``alfworld_workflow``), :class:`StepWiseAlfworldWorkflow`
  (``step_wise_alfworld_workflow``) (:mod:`trinity_agents.alfworld`; extra ``alfworld``).
- :class:`RAFTAlfworldWorkflow` (``RAFT_alfworld_workflow``), :class:`RAFTReflectAlfworldWorkflow`
  (``RAFT_reflect_alfworld_workflow``): RAFT data from ALFWorld games (:mod:`trinity_agents.raft_alfworld`).
- :class:`SciWorldWorkflow` (``sciworld_workflow``) on ScienceWorld's simulator and
  :func:`write_sciworld_data`, its task rows (:mod:`trinity_agents.sciworld`; extra ``sciworld``).
- :class:`AgentScopeReActWorkflow` (``agentscope_react_workflow``) and its math variants,
  :class:`AgentScopeFrozenLakeWorkflow` (``agentscope_frozen_lake_workflow``)
  (:mod:`trinity_agents.agentscope_react`, :mod:`trinity_agents.agentscope_frozen_lake`;
  extra ``agentscope``); :func:`run_python`, :func:`calculate` (:mod:`trinity_agents.sandbox`).
- :class:`EmailSearchWorkflow` (``email_search_workflow``) over a mailbox database
  (:mod:`trinity_agents.email_search`; extra ``agentscope``) and :func:`generate_corpus`, the
  synthetic mailbox (:mod:`trinity_agents.email_inbox`).
- :class:`ScriptedEngine`, :func:`scripted_model` — a policy-driven engine for tests
  (:mod:`trinity_agents.scripted`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "MultiTurnWorkflow": "trinity_agents.multi_turn",
    "StepResult": "trinity_agents.multi_turn",
    "Episode": "trinity_agents.multi_turn",
    "Turn": "trinity_agents.multi_turn",
    "ToolCallWorkflow": "trinity_agents.toolcall",
    "score_tool_calls": "trinity_agents.toolcall",
    "toolcall_reward": "trinity_agents.toolcall",
    "FrozenLakeWorkflow": "trinity_agents.frozen_lake",
    "generate_random_map": "trinity_agents.frozen_lake",
    "AlfworldWorkflow": "trinity_agents.alfworld",
    "StepWiseAlfworldWorkflow": "trinity_agents.alfworld",
    "RAFTAlfworldWorkflow": "trinity_agents.raft_alfworld",
    "RAFTReflectAlfworldWorkflow": "trinity_agents.raft_alfworld",
    "SciWorldWorkflow": "trinity_agents.sciworld",
    "write_sciworld_data": "trinity_agents.sciworld",
    "AgentScopeReActWorkflow": "trinity_agents.agentscope_react",
    "AgentScopeReactMathWorkflow": "trinity_agents.agentscope_react",
    "AgentScopeV0ReactMathWorkflow": "trinity_agents.agentscope_react",
    "AgentScopeFrozenLakeWorkflow": "trinity_agents.agentscope_frozen_lake",
    "run_python": "trinity_agents.sandbox",
    "calculate": "trinity_agents.sandbox",
    "EmailSearchWorkflow": "trinity_agents.email_search",
    "generate_corpus": "trinity_agents.email_inbox",
    "ScriptedEngine": "trinity_agents.scripted",
    "scripted_model": "trinity_agents.scripted",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trinity_agents' has no attribute {name!r}")
