"""Hostile model answers are refused before evaluation, score as wrong, and cost little.

Performance is measured in benchmarks, not here: these tests check that a hostile answer never
reaches math-verify (a spy on the comparison), with one coarse sanity bound per test.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

import trinity_math.verify as verify
from trinity_math.rewards import AccuracyReward, CountdownRewardFn, MathBoxedRewardFn, MathRewardFn

SANITY_SECONDS = 3.0  # far above the ~1 s bound: only catches the old multi-second behaviour

HOSTILE = {
    "python-tower": "9**9**9**9",
    "latex-tower": "9^{9^{9^{9}}}",
    "boxed-tower": "\\boxed{9^{9^{9^{9}}}}",
    "googolplex": "10^{10^{100}}",
    "100k-digits": "7" * 100_000,
    "10k-deep-parens": "(" * 10_000 + "1" + ")" * 10_000,
    "10k-deep-braces": "{" * 10_000 + "1" + "}" * 10_000,
    "1MB": "1+" * 500_000,
}


def _in_answer_tag(answer: str) -> str:
    return "<think>reasoning</think><answer>" + answer + "</answer>"


def _in_box(answer: str) -> str:
    return answer if answer.startswith("\\boxed") else "So the answer is \\boxed{" + answer + "}."


VerifyingReward = MathRewardFn | MathBoxedRewardFn | AccuracyReward

# (registered name, reward factory, how the answer is put in a response)
REWARDS: dict[str, tuple[Callable[[], VerifyingReward], Callable[[str], str]]] = {
    "math_reward": (MathRewardFn, _in_answer_tag),
    "math_boxed_reward": (MathBoxedRewardFn, _in_box),
    "accuracy_reward": (AccuracyReward, lambda answer: answer),
    "accuracy_reward-boxed": (AccuracyReward, _in_box),
}


class ComparisonSpy:
    """Counts comparisons that reach math-verify (here or in the worker), then runs them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        real_here, real_worker = verify._compare_here, verify._verifiers.compare

        def here(answer: str, truth: str, timeout_seconds: float) -> verify.Verdict:
            self.calls.append(answer[:40])
            return real_here(answer, truth, timeout_seconds)

        def worker(answer: str, truth: str, timeout_seconds: float) -> verify.Verdict:
            self.calls.append(answer[:40])
            return real_worker(answer, truth, timeout_seconds)

        monkeypatch.setattr(verify, "_compare_here", here)
        monkeypatch.setattr(verify._verifiers, "compare", worker)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> ComparisonSpy:
    return ComparisonSpy(monkeypatch)


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.parametrize("reward", list(REWARDS), ids=list(REWARDS))
def test_hostile_answer_is_refused_before_evaluation(
    reward: str, hostile: str, spy: ComparisonSpy, caplog: pytest.LogCaptureFixture
) -> None:
    factory, wrap = REWARDS[reward]
    fn = factory()
    response = wrap(HOSTILE[hostile])
    with caplog.at_level(logging.DEBUG, logger="trinity_math"):
        start = time.monotonic()
        parts = fn(response, "5")
        elapsed = time.monotonic() - start
    assert parts["accuracy"] == 0.0
    assert spy.calls == [], "a hostile answer reached math-verify"
    assert fn.refusals == 1
    assert fn.timeouts == 0
    assert any("refused" in record.getMessage() for record in caplog.records)
    assert elapsed < SANITY_SECONDS, f"{reward} on {hostile} took {elapsed:.1f} s"


def test_hostile_answer_is_refused_in_a_worker_thread_too(spy: ComparisonSpy) -> None:
    """Off the main thread the refusal happens before the worker process is asked."""
    fn = MathBoxedRewardFn()
    results: list[dict[str, float]] = []
    start = time.monotonic()
    thread = threading.Thread(target=lambda: results.append(fn("\\boxed{9^{9^{9^{9}}}}", "5")))
    thread.start()
    thread.join(timeout=60)
    elapsed = time.monotonic() - start
    assert results == [{"accuracy": 0.0, "format_score": 0.0}]
    assert spy.calls == []
    assert fn.refusals == 1
    assert elapsed < SANITY_SECONDS


def test_math_rewards_refuse_a_hostile_answer_without_spoiling_the_format_score() -> None:
    parts = MathRewardFn()(_in_answer_tag("9**9**9**9"), "5")
    assert parts == {"accuracy": 0.0, "format_score": pytest.approx(0.1)}


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
def test_countdown_reward_rejects_hostile_equations(hostile: str) -> None:
    """countdown_reward parses with ast, without powers, under a length cap: nothing to evaluate."""
    response = "<answer>" + HOSTILE[hostile] + "</answer>"
    start = time.monotonic()
    assert CountdownRewardFn()(response, {"target": 5, "numbers": [9]}) == {"score": 0.1}
    assert time.monotonic() - start < SANITY_SECONDS


# Normal answers around the same shapes still score (none of these is refused).
NORMAL = [
    ("\\boxed{2^{10}}", "1024"),
    ("2^{10}", "1024"),
    ("2**10", "1024"),
    ("2^{2^{3}}", "256"),
    ("\\frac{1}{2^{10}}", "\\frac{1}{1024}"),
]


NORMAL_CASES = [
    pytest.param(reward, answer, truth, id=f"{reward}-{answer}")
    for reward in REWARDS
    for answer, truth in NORMAL
    # math-verify reads an anchored \\boxed{2**10} as LaTeX, where ** means nothing (as before)
    if (reward, answer) != ("accuracy_reward-boxed", "2**10")
]


@pytest.mark.parametrize(("reward", "answer", "truth"), NORMAL_CASES)
def test_normal_power_answers_still_score(reward: str, answer: str, truth: str, spy: ComparisonSpy) -> None:
    factory, wrap = REWARDS[reward]
    fn = factory()
    assert fn(wrap(answer), truth)["accuracy"] == 1.0
    assert len(spy.calls) == 1  # evaluated, not refused


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "worker-thread"])
def test_a_slow_comparison_is_cut_off_below_a_second_and_scores_as_wrong(
    in_thread: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the refusal switched off, the deadline (whole comparison, sub-second) still holds."""
    monkeypatch.setattr(verify, "refusal_reason", lambda text, max_chars=0: None)
    fn = MathBoxedRewardFn(timeout_seconds=0.5)
    fn("\\boxed{1}", "1")  # start the worker (in a thread) or warm up, outside the measurement
    results: list[dict[str, float]] = []

    def score() -> None:
        results.append(fn("\\boxed{9^{9^{9}}}", "5"))

    start = time.monotonic()
    if in_thread:
        thread = threading.Thread(target=score)
        thread.start()
        thread.join(timeout=60)
    else:
        score()
    elapsed = time.monotonic() - start
    assert results == [{"accuracy": 0.0, "format_score": 0.0}]
    assert fn.timeouts == 1
    assert fn.refusals == 0
    assert elapsed < SANITY_SECONDS, f"a 0.5 s deadline took {elapsed:.1f} s"


def _in_thread(call: Callable[[], dict[str, float]]) -> dict[str, float]:
    results: list[dict[str, float]] = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join(timeout=120)
    assert results, "the reward hung or raised in a worker thread"
    return results[0]


@pytest.mark.skipif(os.name != "posix", reason="the verifier processes are POSIX only")
def test_a_verifier_that_does_not_answer_is_killed_and_replaced() -> None:
    """Work no signal can interrupt (simulated: the verifier is stopped) costs the deadline only."""
    verify._verifiers.close()
    fn = MathBoxedRewardFn(timeout_seconds=0.5)
    # Fractions, not plain integers: those are compared without a verifier.
    assert _in_thread(lambda: fn("\\boxed{\\frac{2}{2}}", "1"))["accuracy"] == 1.0  # they are up
    before = verify._verifiers.processes
    for proc in before:  # every verifier stuck: the call that meets one overruns
        os.kill(proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    assert _in_thread(lambda: fn("\\boxed{\\frac{4}{2}}", "2")) == {"accuracy": 0.0, "format_score": 0.0}
    elapsed = time.monotonic() - start
    assert fn.timeouts == 1
    killed = [p for p in before if p not in verify._verifiers.processes]
    assert len(killed) == 1, "the stuck verifier was not replaced"
    assert killed[0].wait(timeout=10) is not None, "the stuck verifier was not killed"
    assert elapsed < SANITY_SECONDS
    for proc in before:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    verify._verifiers.close()  # the other stuck one, too
    # fresh verifiers answer the next call
    assert _in_thread(lambda: fn("\\boxed{\\frac{4}{2}}", "2"))["accuracy"] == 1.0


def test_default_time_bound_is_about_a_second() -> None:
    for fn in (MathRewardFn(), MathBoxedRewardFn(), AccuracyReward()):
        assert fn.timeout_seconds <= 1.0


PLAIN_PAIRS = [
    ("12", "12"),
    ("12", "13"),
    ("012", "12"),
    ("-3", "-3"),
    ("+7", "7"),
    ("-0", "0"),
    ("1000001", "1000000"),
    ("123456789012345678901", "123456789012345678902"),
    ("123456789012345678901234567890", "123456789012345678901234567890"),
]


@pytest.mark.parametrize(("answer", "truth"), PLAIN_PAIRS)
def test_plain_numbers_are_compared_here_with_math_verifys_verdict(
    answer: str, truth: str, spy: ComparisonSpy
) -> None:
    """Both sides plain integers: no math-verify parse and no worker process (a reward in a
    runner thread answers at once), with the verdict math-verify gives."""
    results: list[verify.Verdict] = []
    thread = threading.Thread(target=lambda: results.append(verify.math_equal(answer, truth)))
    thread.start()
    thread.join(timeout=60)
    assert spy.calls == [], "a plain number reached math-verify"
    assert results[0].equal == verify._compare_here(answer, truth, 5.0).equal


def test_anything_but_plain_numbers_still_goes_to_math_verify(spy: ComparisonSpy) -> None:
    pairs = (
        ("\\frac{24}{2}", "12"),
        ("1,000", "1000"),
        ("12 apples", "12"),
        ("1e3", "1000"),
        ("2.50", "2.5"),
    )
    for answer, truth in pairs:
        verify.math_equal(answer, truth)
    assert len(spy.calls) == len(pairs)
