"""A reward call has a wall-time bound that holds by construction, not by the machine's speed.

Issue 34, item 5: 39 hostile model outputs (code that would run, towers, factorials, nesting
thousands deep, huge literals: :func:`corpus`) through ``accuracy_reward``,
``math_reward``, ``math_boxed_reward`` and ``math_dapo_reward``. Nothing may execute, and each
call must return within ``timeout_seconds`` (plus slack) even when the verifier itself is slow:
slowed in Python (its own timer interrupts it), stuck in C code no signal interrupts (it must
be killed), and with the machine's cores busy. Hitting the bound scores 0 and is counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trinity_math.verify as verify
from trinity_math.dapo import MathDAPORewardFn
from trinity_math.rewards import AccuracyReward, MathBoxedRewardFn, MathRewardFn
from trinity_math.workflows import MathWorkflow

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the verifier processes are POSIX only")

# Generous: the bound itself is what is checked, not the machine's speed. The old verifier's
# calls took seconds here (an in-process timer cannot stop C code; a replaced worker's restart
# delayed the next call).
SLACK_SECONDS = 0.5


# -- the corpus: each ``(name, answer)`` is an answer text a model might give ------------------


def _touch(path: str) -> str:
    return f"open({path!r}, 'w').write('pwned')"


def corpus(sentinel: str) -> list[tuple[str, str]]:
    """The hostile answers, with ``sentinel`` as the file a code-running answer would create."""
    touch = _touch(sentinel)
    return [
        # -- code execution ----------------------------------------------------------------------
        ("os-system", f"__import__('os').system('touch {sentinel}')"),
        ("os-system-bare", f"os.system('touch {sentinel}')"),
        ("eval", f'eval("{touch}")'),
        ("exec", f'exec("{touch}")'),
        ("open-write", touch),
        ("lambda", f"(lambda: __import__('os').system('touch {sentinel}'))()"),
        (
            "subclasses-popen",
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
            f"(['touch', '{sentinel}'])",
        ),
        ("subclasses-chain", "().__class__.__bases__[0].__subclasses__()[0].__init__.__globals__"),
        ("builtins", f"__builtins__.__dict__['__import__']('os').system('touch {sentinel}')"),
        ("boxed-os-system", f"\\boxed{{__import__('os').system('touch {sentinel}')}}"),
        ("latex-write18", f"\\immediate\\write18{{touch {sentinel}}}"),
        ("latex-input", "\\input{/etc/passwd}"),
        ("sympify-function", f"Function('system')('touch {sentinel}')"),
        # -- huge exponents ----------------------------------------------------------------------
        ("python-tower", "9**9**9**9"),
        ("latex-tower", "9^{9^{9^{9}}}"),
        ("googolplex", "10^{10^{100}}"),
        ("two-tower", "2^{2^{2^{2^{2^{2}}}}}"),
        ("pow-of-pow", "(10**100)**(10**100)"),
        ("float-exponent", "1e999999999"),
        ("exp-exp", "\\exp(\\exp(\\exp(100)))"),
        ("braced-tower", "{10}^{{10}^{10}}"),
        # -- deep nesting ------------------------------------------------------------------------
        ("parens-5000", "(" * 5000 + "1" + ")" * 5000),
        ("braces-5000", "{" * 5000 + "1" + "}" * 5000),
        ("brackets-3000", "[" * 3000 + "1" + "]" * 3000),
        ("sqrt-2000", "\\sqrt{" * 2000 + "2" + "}" * 2000),
        ("frac-1000", "\\frac{1}{" * 1000 + "2" + "}" * 1000),
        ("negations-3000", "-(" * 3000 + "1" + ")" * 3000),
        ("left-right-2000", "\\left(" * 2000 + "1" + "\\right)" * 2000),
        # -- huge factorials ---------------------------------------------------------------------
        ("factorial-1e5", "100000!"),
        ("factorial-1e6-latex", "(10^{6})!"),
        ("factorial-chain", "9!!!!!!!!!"),
        ("binomial", "\\binom{10^{9}}{10^{8}}"),
        ("factorial-call", "factorial(10**8)"),
        # -- long digit strings and sheer size ---------------------------------------------------
        ("digits-100k", "7" * 100_000),
        ("decimal-50k", "1." + "0" * 50_000 + "1"),
        ("fraction-5k", "1" * 5000 + "/" + "3" * 5000),
        ("thousands-10k", ",".join(["100"] * 10_000)),
        ("sum-1MB", "1+" * 500_000 + "1"),
        ("letters-100k", "x" * 100_000),
    ]


def _boxed(answer: str) -> str:
    return answer if answer.startswith("\\boxed") else "So \\boxed{" + answer + "}."


# (registered name, reward class, how an answer is put in a response)
REWARDS: dict[str, tuple[type, Callable[[str], str]]] = {
    "accuracy_reward": (AccuracyReward, lambda answer: answer),
    "math_reward": (MathRewardFn, lambda answer: "<think>hmm</think><answer>" + answer + "</answer>"),
    "math_boxed_reward": (MathBoxedRewardFn, _boxed),
    "math_dapo_reward": (MathDAPORewardFn, lambda answer: "Let me see.\nAnswer: " + answer),
}


def _timed_in_thread(call: Callable[[], Any], limit: float) -> tuple[Any, float]:
    """``call()`` in a runner thread (as Trinity runs workflows), and its wall time; a call
    that never returns is reported at ``limit`` instead of hanging the test."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(timeout=limit)
    elapsed = time.monotonic() - start
    assert results or elapsed >= limit, "the reward raised"
    return (results[0] if results else None), elapsed


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    return tmp_path / "executed"


@pytest.mark.parametrize("reward", list(REWARDS))
def test_hostile_outputs_execute_nothing_score_zero_and_return_within_the_bound(
    reward: str, sentinel: Path
) -> None:
    cls, wrap = REWARDS[reward]
    fn = cls()  # default bound
    fn(wrap("\\frac{1}{2}"), "0.5")  # the verifiers' first start: the one wait outside the bound
    fn.take_metrics()
    slow = []
    for name, answer in corpus(str(sentinel)):
        parts, elapsed = _timed_in_thread(lambda answer=answer: fn(wrap(answer), "5"), 30)
        assert parts is not None and parts["accuracy"] == 0.0, (name, parts)
        counts = fn.take_metrics()
        assert set(counts) == {"reward_refused", "reward_timeout"} and sum(counts.values()) <= 1
        if elapsed > fn.timeout_seconds + SLACK_SECONDS:
            slow.append(f"{name}: {elapsed:.2f} s")
    assert not sentinel.exists(), "a model output was executed"
    assert not slow, f"{reward} overran its {fn.timeout_seconds} s bound: {slow}"
    assert fn.refusals >= 20  # most never reach math-verify at all


SLOW_VERIFIER = """
import sys
import trinity_math.verify as verify

mode = sys.argv[1]
verify._prepare()  # warm up with the real comparison, then slow it down
real = verify._compare


def slow(answer, truth, step_timeout):
    if mode == "python":  # slow Python code: the verifier's own timer interrupts it
        while True:
            pass
    if mode == "c":  # stuck in C: no signal handler runs; only a kill ends it
        sum(range(10**13))
    return real(answer, truth, step_timeout)


verify._compare = slow
verify._serve()
"""


@pytest.fixture
def slow_verifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``use(mode)``: this process's verifiers become ones whose comparisons are slow."""
    script = tmp_path / "slow_verifier.py"
    script.write_text(textwrap.dedent(SLOW_VERIFIER))
    pool = verify._Verifiers()

    def use(mode: str) -> None:
        monkeypatch.setattr(verify, "_verifier_command", lambda: [sys.executable, str(script), mode])
        monkeypatch.setattr(verify, "_verifiers", pool)

    yield use
    pool.close()


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Every core busy (twice over) while the test runs."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


# Answers the guard lets through (so they reach the slow verifier).
EVALUATED = ["\\frac{1}{2}", "x^2+1", "\\sqrt{2}", "(1, 2]", "3.14"]


def _bound_holds_with(mode: str, sentinel: Path, timeout: float) -> None:
    for reward, (cls, wrap) in REWARDS.items():
        fn = cls(timeout_seconds=timeout)
        answers = EVALUATED + [answer for _, answer in corpus(str(sentinel))[::8]]
        overran = []
        for answer in answers:
            parts, elapsed = _timed_in_thread(
                lambda fn=fn, wrap=wrap, answer=answer: fn(wrap(answer), "5"), 30
            )
            assert parts is not None and parts["accuracy"] == 0.0
            if elapsed > timeout + SLACK_SECONDS:
                overran.append(f"{answer[:20]!r}: {elapsed:.2f} s")
        assert not overran, f"{reward} ({mode} verifier) overran its {timeout} s bound: {overran}"
        # every answer that reached the verifier timed out, and was counted as such
        assert fn.timeouts == len(EVALUATED) + sum(
            verify.refusal_reason(a, 10**6) is None for a in answers[len(EVALUATED) :]
        ), (reward, fn.timeouts, fn.refusals)
    assert not sentinel.exists()


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
@pytest.mark.parametrize("mode", ["python", "c"])
def test_the_bound_holds_when_the_verifier_is_slow(mode: str, slow_verifiers, sentinel: Path) -> None:
    slow_verifiers(mode)
    verify._verifiers.start()
    with verify._verifiers._cond:
        verify._verifiers._wait_first_start()  # the one wait outside the bound
    _bound_holds_with(mode, sentinel, timeout=0.3)


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_the_bound_holds_on_a_loaded_machine_with_a_verifier_stuck_in_c(
    slow_verifiers, sentinel: Path, busy_cores: None
) -> None:
    slow_verifiers("c")
    verify._verifiers.start()
    with verify._verifiers._cond:
        verify._verifiers._wait_first_start()
    _bound_holds_with("c, cores busy", sentinel, timeout=0.3)


def test_stuck_verifiers_are_killed_and_replaced(slow_verifiers, monkeypatch: pytest.MonkeyPatch) -> None:
    real_command = verify._verifier_command
    slow_verifiers("c")
    fn = MathBoxedRewardFn(timeout_seconds=0.3)
    parts, _ = _timed_in_thread(lambda: fn("\\boxed{\\frac{1}{2}}", "0.5"), 60)
    assert parts == {"accuracy": 0.0, "format_score": 0.0} and fn.timeouts == 1
    stuck = verify._verifiers.processes
    # From now on replacements are real verifiers; each stuck one is killed at its next overrun.
    monkeypatch.setattr(verify, "_verifier_command", real_command)
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in stuck) and time.monotonic() < deadline:
        _timed_in_thread(lambda: fn("\\boxed{\\frac{1}{3}}", "1/3"), 30)
    assert all(p.poll() is not None for p in stuck), "a stuck verifier was left running"
    # The replacements verify: asked with a bound a fresh verifier meets on a loaded machine too
    # (its first comparison imports math-verify; the suite runs beside another job).
    patient = MathBoxedRewardFn(timeout_seconds=30)
    parts, _ = _timed_in_thread(lambda: patient("\\boxed{\\frac{1}{2}}", "0.5"), 60)
    assert parts == {"accuracy": 1.0, "format_score": 0.0} and patient.timeouts == 0
    assert not set(verify._verifiers.processes) & set(stuck)  # it was a replacement that answered


def test_concurrent_runner_threads_share_the_verifiers() -> None:
    fn_per_thread = [MathRewardFn() for _ in range(8)]
    fn_per_thread[0]("<answer>\\frac{1}{2}</answer>", "0.5")  # first start
    verdicts: list[list[float]] = [[] for _ in fn_per_thread]

    def work(i: int) -> None:
        for k in range(10):
            answer = f"\\frac{{{i * 10 + k}}}{{{i * 10 + k + 1}}}"
            truth = f"{i * 10 + k}/{i * 10 + k + 1}" if k % 2 == 0 else "7"
            verdicts[i].append(fn_per_thread[i]("<answer>" + answer + "</answer>", truth)["accuracy"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert verdicts == [[1.0, 0.0] * 5] * 8
    assert sum(fn.timeouts for fn in fn_per_thread) == 0


def test_a_timed_out_reward_is_a_rollout_metric_not_a_reward_part(slow_verifiers) -> None:
    """The math workflows put ``reward_timeout`` / ``reward_refused`` in each rollout's metrics
    (their mean is ``rollout/reward_timeout``), apart from the reward's parts."""
    from trinity.experience import Experience
    from trinity.workflow import Task

    slow_verifiers("c")
    task = Task(
        workflow=MathWorkflow,
        raw_task={"prompt": "1/2?", "response": "0.5"},
        reward_fn_args={"timeout_seconds": 0.3},
        repeat_times=2,
    )
    workflow = task.to_workflow(object())
    assert workflow.reward_fn.timeout_seconds == 0.3  # reward_fn_args reach the reward
    responses = [
        Experience(tokens=[1, 2], prompt_length=1, response_text=text)
        for text in (
            "<think>.</think><answer>\\frac{1}{2}</answer>",
            "<think>.</think><answer>9**9**9**9</answer>",
        )
    ]
    scored, _ = _timed_in_thread(lambda: workflow.score(responses), 60)
    assert [e.metrics["reward_timeout"] for e in scored] == [1.0, 0.0]
    assert [e.metrics["reward_refused"] for e in scored] == [0.0, 1.0]
    assert [e.reward for e in scored] == pytest.approx([0.1, 0.1])  # accuracy 0, format bonus


@pytest.mark.parametrize("bad", [0, -1, "1", True])
def test_timeout_seconds_must_be_positive(bad: Any) -> None:
    with pytest.raises(ValueError, match="timeout_seconds must be a positive number"):
        MathRewardFn(timeout_seconds=bad)


ORDINARY = [
    ("\\frac{1}{2}", "0.5"),
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("(1, 2]", "(1,2]"),
    ("3.14", "3.14"),
    ("2^{10}", "1024"),
    ("\\frac{3}{4}", "0.7"),
]


@pytest.mark.parametrize("reward", list(REWARDS))
def test_ordinary_answers_are_verified_well_within_the_bound(reward: str) -> None:
    """The normal path: right verdicts, no timeout counted (no timing asserted but the bound)."""
    cls, wrap = REWARDS[reward]
    fn = cls()
    fn(wrap("\\frac{1}{2}"), "0.5")
    for answer, truth in ORDINARY:
        parts, elapsed = _timed_in_thread(lambda answer=answer, truth=truth: fn(wrap(answer), truth), 30)
        expected = float(verify._compare_here(answer, truth, 5.0).equal)
        assert parts["accuracy"] == expected, (answer, truth)
        assert elapsed < fn.timeout_seconds + SLACK_SECONDS
    assert fn.timeouts == 0 and fn.refusals == 0
