"""``agentscope_frozen_lake_workflow``: an AgentScope ReAct agent playing FrozenLake.

The game is :mod:`trinity_agents.frozen_lake`'s (same task rows, maps, text protocol and
``workflow_args``: ``env_max_steps``, ``agent_max_steps``, ``is_slippery``, ``desc``,
``compact``); the player is AgentScope's ``ReActAgent`` (no tools, ``react_max_iters`` = 2
reasoning-acting iterations per move, as in Trinity-RFT's ``examples/agentscope_frozenlake``),
talking to the model through the core's OpenAI-compatible API. The agent keeps its memory over
the episode: each move it gets the observation as a user message and its reply's last
triple-backtick block is the move.

It is also registered as ``examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow``, the
class path Trinity-RFT's ``frozenlake_agent.yaml`` names, so that config loads unchanged.

Experiences: one per model call (recorded by the OpenAI API), ``eid.step`` numbering the calls
of the episode, the episode reward on every step, ``info["step_reward"]`` the environment's
reward of the move a call ended (0 on the other calls), ``info["env_step"]`` the move and
``info["env_state_hash"]`` the grid the agent acted on (for ``multi_step_grpo`` and ``gigpo``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Workflow
from trinity_agents.agentscope_react import (
    agentscope_chat_model,
    check_model_for_agents,
    clear_history,
    context_exhausted,
    finish_steps,
    react_agent,
    require_agentscope,
    run_blocking,
)
from trinity_agents.multi_turn import StepResult, positive_int

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.workflow import Task

#: The class path of Trinity-RFT's example workflow, registered as an alias.
UPSTREAM_CLASS_PATH = "examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow"


class AgentScopeFrozenLakeWorkflow(Workflow):
    """FrozenLake played by an AgentScope ReAct agent (see the module docstring)."""

    is_async: ClassVar[bool] = True
    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = False

    registered_name: ClassVar[str] = "agentscope_frozen_lake_workflow"

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """The rows are frozen_lake_workflow's (``seed``, ``size``, ``p``; no prompt column)."""
        from trinity_agents.frozen_lake import FrozenLakeWorkflow

        return FrozenLakeWorkflow.row_problem(row, format_args)

    def reset(self, task: Task) -> None:
        from trinity_agents.frozen_lake import FrozenLakeWorkflow

        self.task = task
        self.repeat_times = task.repeat_times
        # The game (map, rules, prompts, limits) is frozen_lake_workflow's; only its
        # environment methods are used, never its own model loop.
        self.game = FrozenLakeWorkflow(task=task, model=self.model)
        args = task.workflow_args or {}
        self.react_max_iters = positive_int(args.get("react_max_iters", 2), "react_max_iters")

    def run(self) -> list[Experience]:
        return run_blocking(self)

    def build_agent(self) -> Any:
        from agentscope.tool import Toolkit

        chat_model = agentscope_chat_model(self.model, self.task)
        sys_prompt = self.game.system_prompt() or ""
        return react_agent("frozenlake_agent", sys_prompt, chat_model, Toolkit(), self.react_max_iters)

    async def run_async(self) -> list[Experience]:
        require_agentscope(self.registered_name)
        from agentscope.message import Msg

        check_model_for_agents(self.model, self.registered_name, tools=False)
        clear_history(self.model)
        game = self.game
        game.run_id_base = self.run_id_base  # slippery ice seeded per run, as frozen_lake_workflow
        agent = self.build_agent()
        steps: list[tuple[Experience, dict[str, Any]]] = []
        rewards: list[float] = []
        done = False
        invalid = 0
        terminate_reason = "max_turns"
        try:
            observation = game.reset_env()
            for turn in range(game.max_turns):
                prompt = game.format_observation(observation, turn)
                try:
                    reply = await agent.reply(Msg("user", prompt, "user"))
                except Exception as exc:
                    if not context_exhausted(exc):
                        raise
                    # The conversation outgrew max_model_len: the episode ends here; calls
                    # of this turn that were answered are kept, with no step reward.
                    state = game.state_hash(observation)
                    for exp in self.model.extract_experience_from_history(clear_history=True):
                        steps.append((exp, {"env_step": turn, "env_state_hash": state}))
                    terminate_reason = "max_model_len"
                    break
                text = reply.get_text_content() or ""
                result = StepResult.coerce(game.step_env(text))
                calls = self.model.extract_experience_from_history(clear_history=True)
                state = game.state_hash(observation)
                for k, exp in enumerate(calls):
                    step_info: dict[str, Any] = {"env_step": turn, "env_state_hash": state}
                    if k == len(calls) - 1:
                        step_info.update(result.info)
                        step_info["step_reward"] = float(result.reward)
                    steps.append((exp, step_info))
                rewards.append(float(result.reward))
                invalid += not result.info.get("action_valid", True)
                observation = result.observation
                if result.done:
                    done = True
                    terminate_reason = "done"
                    break
        finally:
            game.close_env()
        if not steps:
            return []
        reward = float(sum(rewards))
        success = reward > 0
        info = {
            "env_steps": len(rewards),
            "env_done": int(done),
            "truncated": not done,
            "terminate_reason": terminate_reason,
            "episode_reward": reward,
            "success": success,
            "invalid_actions": invalid,
            "model_calls": len(steps),
            "seed": game.seed,
            "map_size": len(game.desc),
        }
        metrics = {
            "env_steps": float(len(rewards)),
            "env_done": float(done),
            "success": float(success),
            "invalid_actions": float(invalid),
            "model_calls": float(len(steps)),
            "final_reward": reward,
        }
        return finish_steps(steps, reward=reward, run=self.run_id_base, info=info, metrics=metrics)


__all__ = ["UPSTREAM_CLASS_PATH", "AgentScopeFrozenLakeWorkflow"]
