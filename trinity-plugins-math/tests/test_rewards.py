"""Table-driven tests of the math and countdown rewards: (response, truth) -> expected parts."""

from __future__ import annotations

import threading
import time

import pytest

from trinity_math.rewards import (
    AccuracyReward,
    CountdownRewardFn,
    FormatReward,
    MathBoxedRewardFn,
    MathRewardFn,
)

GOOD = "<think>{}</think><answer>{}</answer>"


def r1(answer: str, think: str = "reasoning") -> str:
    return GOOD.format(think, answer)


# math_reward: (response, truth, accuracy, format_score)
MATH_REWARD_CASES = [
    (r1("72"), "72", 1.0, 0.1),
    (r1("71"), "72", 0.0, 0.1),
    (r1("72"), "Natalia sold 48/2 = 24 clips in May.\n#### 72", 1.0, 0.1),  # GSM8K truth
    (r1("1,234"), "#### 1,234", 1.0, 0.1),  # commas in answer and truth
    (r1("1234"), "1,234", 1.0, 0.1),
    (r1("\\frac{1}{2}"), "0.5", 1.0, 0.1),  # LaTeX fraction vs decimal
    (r1("\\dfrac{3}{4}"), "\\frac{3}{4}", 1.0, 0.1),
    (r1("3/4"), "0.75", 1.0, 0.1),
    (r1("0.3"), "\\frac{1}{3}", 0.0, 0.1),
    (r1("18 dollars"), "18", 1.0, 0.1),  # units as prose
    (r1("5\\text{ cm}"), "5", 1.0, 0.1),  # units as LaTeX text
    (r1("$\\sqrt{2}$"), "\\sqrt{2}", 1.0, 0.1),
    (r1("2x+1"), "1+2x", 1.0, 0.1),  # algebra, not "the first number"
    (r1("2x+3"), "2x+1", 0.0, 0.1),
    (r1("x = 3"), "3", 1.0, 0.1),
    (r1("10\\%"), "\\frac{1}{10}", 1.0, 0.1),
    (r1("\\boxed{7}"), "7", 1.0, 0.1),  # box inside the answer tag
    (r1("The answer is 42."), "42", 1.0, 0.1),
    (r1("yes"), "Yes", 1.0, 0.1),  # non-math truth: text comparison
    ("<think>a</think>\n<answer>4</answer>\n", "4", 1.0, 0.1),  # whitespace between/after tags
    ("Sure! <think>a</think><answer>4</answer>", "4", 1.0, 0.1),  # preamble is allowed
    ("<answer>4</answer>", "4", 1.0, -0.1),  # right answer, no think block
    ("<think>a</think><answer>4</answer> trailing", "4", 1.0, -0.1),  # text after the answer
    ("<think>a</think><answer>3</answer><answer>4</answer>", "4", 1.0, 0.1),  # the last answer counts
    ("<think>a</think><answer>4", "4", 0.0, -0.1),  # unclosed answer tag
    ("<think>a<answer>4</answer>", "4", 1.0, -0.1),  # unclosed think tag
    ("<think>a</think> 4", "4", 0.0, -0.1),  # no answer tag at all
    ("<think>a</think><answer></answer>", "4", 0.0, 0.1),  # empty answer
    ("", "4", 0.0, -0.1),  # empty output
    ("4", "4", 0.0, -0.1),  # bare answer, no tags
    (r1("__import__('os').system('true')"), "4", 0.0, 0.1),  # code is just a wrong answer
]


@pytest.mark.parametrize(("response", "truth", "accuracy", "format_score"), MATH_REWARD_CASES)
def test_math_reward(response: str, truth: str, accuracy: float, format_score: float) -> None:
    parts = MathRewardFn()(response, truth)
    assert parts == {"accuracy": accuracy, "format_score": pytest.approx(format_score)}


# math_boxed_reward: (response, truth, accuracy)
MATH_BOXED_CASES = [
    ("So the answer is \\boxed{72}.", "72", 1.0),
    ("\\boxed{72}", "Natalia sold 24 clips in May... #### 72", 1.0),  # GSM8K truth unchanged
    ("\\boxed{3} no wait, \\boxed{5}", "5", 1.0),  # last box wins
    ("\\boxed{5} no wait, \\boxed{3}", "5", 0.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # nested braces
    ("\\boxed{\\boxed{7}}", "7", 1.0),  # nested boxes
    ("$\\boxed{\\dfrac{2}{4}}$", "\\frac{1}{2}", 1.0),
    ("\\boxed 5", "5", 1.0),  # \boxed without braces
    ("\\fbox{5}", "5", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{5\\,\\text{cm}}", "5", 1.0),
    ("The answer is 72.", "72", 0.0),  # no box, no score
    ("\\boxed{72", "72", 0.0),  # unclosed box
    ("\\boxed{}", "72", 0.0),
    ("", "72", 0.0),
    ("\\boxed{72}", "The answer is $\\boxed{72}$.", 1.0),  # boxed truth (MATH style)
    ("\\boxed{9^{9^{9}}}", "5", 0.0),  # huge exponent: bounded by the timeout
]


@pytest.mark.parametrize(("response", "truth", "accuracy"), MATH_BOXED_CASES)
def test_math_boxed_reward(response: str, truth: str, accuracy: float) -> None:
    parts = MathBoxedRewardFn(timeout_seconds=1)(response, truth)
    assert parts == {"accuracy": accuracy, "format_score": 0.0}


@pytest.mark.parametrize(
    ("response", "with_think", "format_score"),
    [
        ("<think>x</think> \\boxed{1}", True, 0.0),
        ("no thinking \\boxed{1}", True, -0.1),
        ("<think>x</think><think>y</think> \\boxed{1}", True, -0.1),
        ("</think>x<think> \\boxed{1}", True, -0.1),
        ("no thinking \\boxed{1}", False, 0.0),
    ],
)
def test_math_boxed_reward_think_penalty(response: str, with_think: bool, format_score: float) -> None:
    assert MathBoxedRewardFn(with_think=with_think)(response, "1") == {
        "accuracy": 1.0,
        "format_score": format_score,
    }
    # per-call arguments (what math_boxed_workflow passes) override the constructor's
    parts = MathBoxedRewardFn()(response, "1", with_think=with_think, format_score_coef=0.5)
    assert parts["format_score"] == (format_score * 5 if format_score else 0.0)


# countdown_reward: (response, truth, score); truth numbers [3, 5, 7], target 16 unless given
CD = {"target": 16, "numbers": [3, 5, 7]}
COUNTDOWN_CASES = [
    ("<think>..</think><answer>(7 - 5) * 3 + ...</answer>", CD, 0.1),  # malformed
    ("<answer>3 * 7 - 5</answer>", CD, 1.0),
    ("<answer>3*7-5</answer>", '{"target": 16, "numbers": [3, 5, 7]}', 1.0),  # JSON truth
    ("<answer>3*7-5</answer>", "{'target': 16, 'numbers': [3, 5, 7]}", 1.0),  # str(dict) truth
    ("<answer>(3 * 7) - 5</answer>", CD, 1.0),
    ("<answer>\n3 * 7 - 5\n</answer>", CD, 1.0),  # multi-line answer
    ("<answer>3 * 7 + 5</answer>", CD, 0.1),  # right numbers, wrong value
    ("<answer>3 * 7 - 5 + 0</answer>", CD, 0.1),  # extra number
    ("<answer>3 * 7</answer>", CD, 0.1),  # a number left out
    ("<answer>21 - 5</answer>", CD, 0.1),  # value right, numbers wrong
    ("<answer>3 * 7 - 5 = 16</answer>", CD, 0.1),  # '=' is not arithmetic
    ("<answer>16</answer>", CD, 0.1),
    ("<answer>__import__('os').system('echo pwned')</answer>", CD, 0.1),  # never executed
    ("<answer>(3).__class__</answer>", CD, 0.1),
    ("<answer>9**9**9</answer>", {"target": 16, "numbers": [9, 9, 9]}, 0.1),  # no power operator
    ("<answer>9*9*9</answer>", {"target": 729, "numbers": [9, 9, 9]}, 1.0),
    ("<answer>7 / (5 - 5)</answer>", {"target": 16, "numbers": [7, 5, 5]}, 0.1),  # division by zero
    ("<answer>7 / 2 * 4 + 2</answer>", {"target": 16, "numbers": [7, 2, 4, 2]}, 1.0),  # exact fractions
    ("<answer>(1 + 2) / 3 * 3</answer>", {"target": 3, "numbers": [1, 2, 3, 3]}, 1.0),
    ("<answer>3.0 * 7 - 5</answer>", CD, 0.1),  # floats are not the given numbers
    ("<answer>-3 + 7 * 5 - 16</answer>", {"target": 16, "numbers": [3, 7, 5, 16]}, 1.0),  # unary minus
    ("<answer>" + "(" * 300 + "3" + ")" * 300 + "</answer>", CD, 0.1),  # absurdly deep
    ("<answer>3 * 7 - 5</answer><answer>3</answer>", CD, 0.1),  # the last answer counts
    ("3 * 7 - 5", CD, 0.0),  # no answer tag
    ("<answer></answer>", CD, 0.0),  # empty equation
    ("", CD, 0.0),  # empty output
    ("<answer>3 * 7 - 5", CD, 0.0),  # unclosed tag
]


@pytest.mark.parametrize(("response", "truth", "score"), COUNTDOWN_CASES)
def test_countdown_reward(response: str, truth: object, score: float) -> None:
    assert CountdownRewardFn()(response, truth) == {"score": score}


def test_countdown_reward_rejects_bad_truths_with_a_clear_message() -> None:
    fn = CountdownRewardFn()
    with pytest.raises(ValueError, match="expects a truth like"):
        fn("<answer>1</answer>", "24")
    with pytest.raises(ValueError, match="integer 'target'"):
        fn("<answer>1</answer>", {"numbers": [1]})
    with pytest.raises(ValueError, match="response_key"):
        fn("<answer>1</answer>", None)


# accuracy_reward: (response, truth, accuracy)
ACCURACY_CASES = [
    ("The answer is $\\frac{1}{2}$.", "0.5", 1.0),
    ("First 3, then \\boxed{4}.", "4", 1.0),
    ("It is 12 apples.", "#### 12", 1.0),
    ("It is 13 apples.", "12", 0.0),
    ("", "12", 0.0),
]


@pytest.mark.parametrize(("response", "truth", "accuracy"), ACCURACY_CASES)
def test_accuracy_reward(response: str, truth: str, accuracy: float) -> None:
    assert AccuracyReward()(response, truth) == {"accuracy": accuracy}


@pytest.mark.parametrize(
    ("response", "pattern", "score"),
    [
        ("<think>\nx\n</think>\n<answer>\n1\n</answer>", None, 0.1),
        ("<think>x</think><answer>1</answer>", None, -0.1),  # the default wants newlines
        ("<think>x</think><answer>1</answer>", r"<think>.*</think><answer>.*</answer>$", 0.1),
        ("", None, -0.1),
    ],
)
def test_format_reward(response: str, pattern: str | None, score: float) -> None:
    assert FormatReward(pattern)(response) == {"format_score": score}


def test_math_rewards_need_a_truth() -> None:
    for fn in (MathRewardFn(), MathBoxedRewardFn(), AccuracyReward()):
        with pytest.raises(ValueError, match="response_key"):
            fn("<answer>1</answer>", None)


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "worker-thread"])
def test_huge_exponent_is_cut_off_by_the_timeout(in_thread: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline's signal only works in the main thread; runners use other threads."""
    # 9^{9^{9}} is refused before evaluation (test_hostile_answers.py); switch that off here.
    monkeypatch.setattr("trinity_math.verify.refusal_reason", lambda text, max_chars=0: None)
    fn = MathRewardFn(timeout_seconds=1)
    results: list[dict[str, float]] = []

    def score() -> None:
        results.append(fn(r1("9^{9^{9}}"), "5"))

    start = time.monotonic()
    if in_thread:
        thread = threading.Thread(target=score)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the reward hung in a worker thread"
    else:
        score()
    elapsed = time.monotonic() - start
    assert results == [{"accuracy": 0.0, "format_score": pytest.approx(0.1)}]
    assert fn.timeouts == 1
    assert elapsed < 30, f"a 1 s timeout took {elapsed:.1f} s"


def test_rewards_in_a_worker_thread_agree_with_the_main_thread() -> None:
    """The subprocess path (used off the main thread) gives the same scores."""
    cases = [c for c in MATH_REWARD_CASES if "9^{" not in c[0]][:12]
    fn = MathRewardFn()
    expected = [fn(r, t) for r, t, _, _ in cases]
    got: list[list[dict[str, float]]] = []
    thread = threading.Thread(target=lambda: got.append([fn(r, t) for r, t, _, _ in cases]))
    thread.start()
    thread.join(timeout=120)
    assert got == [expected]
