"""math-verify's verifier processes can be started ahead of the first comparison that needs them.

Comparisons go to verifier processes that take about a second to start (sympy's import).
``start_verifier`` starts them without waiting (the math workflows call it before generating:
tested in test_workflows.py), from any thread.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

import trinity_math.verify as verify
from trinity_math.rewards import MathRewardFn

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the verifier processes are POSIX only")


def _in_thread(call: Any) -> Any:
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join(timeout=120)
    assert results, "the call hung or raised in a runner thread"
    return results[0]


@pytest.fixture
def no_verifiers() -> Any:
    verify._verifiers.close()
    yield verify._verifiers
    verify._verifiers.close()


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "runner-thread"])
def test_start_verifier_starts_the_processes_its_first_comparison_then_uses(
    no_verifiers: Any, in_thread: bool
) -> None:
    reward = MathRewardFn()
    _in_thread(reward.start_verifier) if in_thread else reward.start_verifier()
    started = no_verifiers.processes
    assert len(started) == verify.VERIFIER_PROCESSES and all(p.poll() is None for p in started)
    assert not no_verifiers._started_once  # started without waiting for them
    reward.start_verifier()  # a second start keeps the running processes
    assert no_verifiers.processes == started
    # A fraction is no plain integer: the comparison goes to a verifier started above.
    assert _in_thread(lambda: verify.math_equal("\\frac{14}{2}", "7")).equal
    assert no_verifiers.processes == started and no_verifiers._started_once
