"""Scripted reference agents for the built-in environment: an oracle and a random baseline.

    python -m trinity_webshop.agents [--split test] [--goals 100] [--seed 0]

prints the mean reward of both on the first ``--goals`` goals of ``--split``. The oracle shows the
environment is solvable and that the reward agrees (it should score 1.0 on every goal); the random
agent is the floor a trained policy must beat. Both act only through the text protocol
(``search[...]`` / ``click[...]`` on what :meth:`get_available_actions` lists).
"""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any, Protocol

from trinity_webshop.env import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, WebShopEnv, WebShopSession


class Agent(Protocol):
    def act(self, session: WebShopSession) -> str:
        """The next action for the session's current page."""


class OracleAgent:
    """Reads the goal: searches its instruction, pages through the results to the target
    product (searching its title when the instruction does not find it), selects the goal's
    options and buys."""

    def __init__(self) -> None:
        self._searched_title = False

    def act(self, session: WebShopSession) -> str:
        goal = session.goal
        available = session.get_available_actions()
        clickables = available["clickables"]
        if available["has_search_bar"]:
            query = goal["name"] if self._searched_title else goal["instruction_text"]
            return f"search[{query}]"
        target = goal["asin"].lower()
        if target in clickables:
            return f"click[{goal['asin']}]"
        if session.page_kind == "item":
            if session.asin != goal["asin"].upper():
                return "click[< Prev]"
            chosen = set(session.options.values())
            for value in goal["goal_options"].values():
                if value.lower() not in chosen:
                    return f"click[{value}]"
            return f"click[{END_BUTTON}]"
        if session.page_kind == "results" and NEXT_PAGE.lower() in clickables:
            return f"click[{NEXT_PAGE}]"
        self._searched_title = True
        return f"click[{BACK_TO_SEARCH}]"


class RandomAgent:
    """Searches the instruction, then clicks uniformly at random among the page's buttons."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, session: WebShopSession) -> str:
        available = session.get_available_actions()
        if available["has_search_bar"]:
            return f"search[{session.instruction_text}]"
        return f"click[{self.rng.choice(available['clickables'])}]"


def play(env: WebShopEnv, agent: Agent, goal_index: int, max_steps: int = 15) -> WebShopSession:
    """Run one episode of ``agent`` on ``goal_index``; returns the finished session."""
    session = env.reset(goal_index=goal_index, max_steps=max_steps)
    while not session.done:
        session.step(agent.act(session))
    return session


def evaluate(env: WebShopEnv, make_agent: Any, goal_indices: list[int], max_steps: int = 15) -> list[float]:
    """Rewards of a fresh ``make_agent(i)`` on each goal ``i``."""
    return [play(env, make_agent(i), i, max_steps).reward for i in goal_indices]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trinity_webshop.agents", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--goals", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=15)
    args = parser.parse_args(argv)
    env = WebShopEnv()
    goals = env.catalog.goal_indices(args.split)[: args.goals]
    oracle = evaluate(env, lambda i: OracleAgent(), goals, args.max_steps)
    rand = evaluate(env, lambda i: RandomAgent(args.seed * 100003 + i), goals, args.max_steps)
    print(f"{len(goals)} {args.split} goals, max {args.max_steps} steps")
    print(f"oracle: mean reward {statistics.mean(oracle):.4f}, min {min(oracle):.4f}")
    print(f"random: mean reward {statistics.mean(rand):.4f}, bought {sum(r > 0 for r in rand)}/{len(rand)}")


if __name__ == "__main__":
    main()
