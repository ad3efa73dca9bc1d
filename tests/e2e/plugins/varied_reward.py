"""Test plugin (``--plugin-dir tests/e2e/plugins``): ``varied_reward``, a reward with a spread.

An untrained tiny model gets every arithmetic answer wrong, so a real reward gives every
rollout of a task the same score and group-baseline algorithms get no gradient. This reward
depends only on the response's length (0, 0.5 or 1), so rollouts of one task usually differ:
what the algorithm tests need to see weights move, not a signal worth learning.
"""

from __future__ import annotations

from typing import Any

from trinity import hookimpl
from trinity.workflow import RewardFn


class VariedReward(RewardFn):
    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        return {"length_class": (len(response) % 3) / 2}


@hookimpl
def register_reward_fns(register):
    register("varied_reward", VariedReward)
