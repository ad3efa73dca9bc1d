"""math-verify's worker process can be started ahead of the first comparison that needs it.

A runner thread's comparisons go to a worker process that takes about a second to start
(sympy's import). ``start_verifier`` starts it without waiting (the math workflows call it
before generating: tested in test_workflows.py); in the main thread, where comparisons run
in-process, it starts nothing.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

import trinity_math.verify as verify
from trinity_math.rewards import MathRewardFn

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the worker process is POSIX only")


def _in_thread(call: Any) -> Any:
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join(timeout=120)
    assert results, "the call hung or raised in a runner thread"
    return results[0]


@pytest.fixture
def no_worker() -> Any:
    verify._worker.close()
    yield verify._worker
    verify._worker.close()


def test_main_thread_starts_no_worker(no_worker: Any) -> None:
    MathRewardFn().start_verifier()
    assert no_worker._proc is None


def test_a_runner_thread_starts_the_worker_its_first_comparison_then_uses(no_worker: Any) -> None:
    reward = MathRewardFn()
    _in_thread(reward.start_verifier)
    started = no_worker._proc
    assert started is not None and started.poll() is None
    assert not no_worker._ready  # started without waiting for it
    _in_thread(reward.start_verifier)  # a second start keeps the running worker
    assert no_worker._proc is started
    # A fraction is no plain integer: the comparison goes to the worker started above.
    assert _in_thread(lambda: verify.math_equal("\\frac{14}{2}", "7")).equal
    assert no_worker._proc is started and no_worker._ready
