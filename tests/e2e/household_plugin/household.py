"""Test plugin (``--plugin-dir tests/e2e/household_plugin``): the RAFT ALFWorld workflows on a
scripted household instead of TextWorld (which needs the ``alfworld`` extra and downloaded games).

``household_RAFT_alfworld_workflow`` and ``household_RAFT_reflect_alfworld_workflow`` are
``RAFT_alfworld_workflow`` / ``RAFT_reflect_alfworld_workflow`` with their ``env_factory`` swapped
for :class:`Household`: a game file is JSON ``{"task", "receptacles": [...], "where": receptacle,
"goal": [object, receptacle]}``; the game is won by ``take <object> from <where>`` then ``move
<object> to <goal receptacle>``, and anything else is ``Nothing happens.``.
"""

from __future__ import annotations

import json

from trinity import hookimpl
from trinity_agents.raft_alfworld import RAFTAlfworldWorkflow, RAFTReflectAlfworldWorkflow


class Household:
    """TextWorld's gym API (``reset``, ``step``, ``close``) over a household game file."""

    def __init__(self, game_file: str) -> None:
        with open(game_file) as f:
            self.game = json.load(f)

    def _infos(self) -> dict:
        return {"admissible_commands": self._commands(), "inventory": self.holding or "", "won": self.won}

    def _commands(self) -> list[str]:
        obj, goal = self.game["goal"]
        if self.holding:
            return ["look", f"move {obj} to {goal}"]
        return ["look", *(f"take {obj} from {r}" for r in self.game["receptacles"])]

    def reset(self):
        self.holding, self.won = None, False
        return f"You are in a room. Your task is to: {self.game['task']}.", self._infos()

    def step(self, command: str):
        obj, goal = self.game["goal"]
        if command == f"take {obj} from {self.game['where']}" and not self.holding:
            self.holding, text = obj, f"You pick up the {obj}."
        elif command == f"move {obj} to {goal}" and self.holding:
            self.won, text = True, f"You put the {obj} on the {goal}."
        else:
            text = "Nothing happens."
        return text, int(self.won), self.won, self._infos()

    def close(self) -> None:
        pass


class HouseholdRAFT(RAFTAlfworldWorkflow):
    env_factory = staticmethod(Household)


class HouseholdRAFTReflect(RAFTReflectAlfworldWorkflow):
    env_factory = staticmethod(Household)


@hookimpl
def register_workflows(register):
    register("household_RAFT_alfworld_workflow", HouseholdRAFT)
    register("household_RAFT_reflect_alfworld_workflow", HouseholdRAFTReflect)
