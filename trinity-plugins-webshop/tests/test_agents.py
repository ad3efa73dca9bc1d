"""The environment is solvable (oracle scores 1.0) and the reward separates it from chance."""

from __future__ import annotations

import statistics

import pytest

from trinity_webshop.agents import OracleAgent, RandomAgent, evaluate, play
from trinity_webshop.env import WebShopEnv


@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


def test_oracle_scores_one_on_every_test_goal(env):
    goals = env.catalog.goal_indices("test")[:100]
    rewards = evaluate(env, lambda i: OracleAgent(), goals)
    failed = {i: r for i, r in zip(goals, rewards) if r != 1.0}
    assert not failed, f"oracle below 1.0 on goals {failed}"


def test_oracle_falls_back_to_searching_the_title(env):
    # a query that does not find the target forces the Back to Search + title search path
    gi = env.catalog.goal_indices("test")[0]
    agent = OracleAgent()
    session = env.reset(goal_index=gi)
    session.step("search[zzz unknown words shampoo]")
    while not session.done:
        session.step(agent.act(session))
    assert session.reward == 1.0 and agent._searched_title


def test_random_agent_is_far_below_the_oracle(env):
    goals = env.catalog.goal_indices("test")[:100]
    rewards = evaluate(env, lambda i: RandomAgent(seed=i), goals)
    mean = statistics.mean(rewards)
    print(f"random agent mean reward on 100 test goals: {mean:.4f}")
    assert 0.0 < mean < 0.6
    assert min(rewards) == 0.0
    # the same seeds give the same episodes
    assert play(env, RandomAgent(seed=goals[3]), goals[3]).reward == rewards[3]
