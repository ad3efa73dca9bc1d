"""trinity_math.guard: which answers are refused before evaluation, and which are not."""

from __future__ import annotations

import pytest

from trinity_math.guard import MAX_ANSWER_CHARS, MAX_RESPONSE_CHARS, nesting_depth, refusal_reason

# Every answer the table-driven reward tests (test_rewards.py) give math-verify, but the hostile one.
TABLE_ANSWERS = [
    "$\\sqrt{2}$",
    "0.3",
    "1,000",
    "1,234",
    "10\\%",
    "1234",
    "18 dollars",
    "2x+1",
    "2x+3",
    "3",
    "3/4",
    "4",
    "5",
    "5\\,\\text{cm}",
    "5\\text{ cm}",
    "7",
    "71",
    "72",
    "First 3, then \\boxed{4}.",
    "It is 12 apples.",
    "It is 13 apples.",
    "The answer is $\\frac{1}{2}$.",
    "The answer is 42.",
    "\\boxed{7}",
    "\\dfrac{2}{4}",
    "\\dfrac{3}{4}",
    "\\frac{1}{2}",
    "__import__('os').system('true')",
    "x = 3",
    "yes",
]

ACCEPTED = [
    "2^{10}",
    "2**10",
    "2^{2023}",
    "2023^{2023}",
    "-2^{2^{3}}",
    "2^{2^{2^{2}}}",  # 65536
    "x^{y^{z}}",  # symbolic towers are never computed
    "9^{9^{x}}",
    "e^{i\\pi}",
    "x^{1000}",
    "(x+1)^{100}",
    "\\left(\\frac{\\sqrt{3}}{2}, \\frac{1}{2}\\right)",
    "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
    "(1,2]\\cup[3,4)",
    "\\frac{1+\\sqrt{5}}{2}",
    "\\cfrac{1}{1+\\cfrac{1}{1+\\cfrac{1}{2}}}",
    "\\sqrt[3]{2}",
    "100!",
    "\\binom{100}{50}",
    "1,000,000",
    "\\$1{,}234.56",
    "3.14159",
    "1e-5",
    "2^{-3}",
    "(-1)^{n}",
    "a_{n+1} = 2a_n",
    "f'(x) = 2x",
    "x \\neq 5",
    "100\\%",
    "\\exp(10)",
    "We have (a and (b so the answer is 5",  # brackets never closed do not count as nesting
    "1) first, 2) second",
]

REFUSED = {
    "9**9**9**9": "digits",
    "9^{9^{9^{9}}}": "digits",
    "\\boxed{9^{9^{9^{9}}}}": "digits",
    "9^{9^{9}}": "digits",
    "9^9^9": "digits",
    "10^{10^{100}}": "digits",
    "x^{10^{100}}": "digits",
    "x_{9^{9^{9}}}": "digits",
    "2^{2^{2^{2^{2}}}}": "digits",  # 19,729 digits
    "2^{-10^{100}}": "digits",
    "0.5^{10^{7}}": "digits",
    "\\left(\\frac{1}{2}\\right)^{10^{100}}": "digits",
    "(2^{9999})^{9999}": "digits",
    "(10^{100})!": "digits",
    "1000000!": "digits",
    "\\binom{10^{9}}{5}": "digits",
    "\\exp(10^{100})": "digits",
    "2^{1e9}": "digits",
    "7" * 100_000: "longer",
    "7" * 1_500: "number of more than",
    "1," + "000," * 400 + "000": "number of more than",
    "(" * 10_000 + "1" + ")" * 10_000: "nested",
    "{" * 10_000 + "1" + "}" * 10_000: "nested",
    "\\frac{1}{" * 11 + "2" + "}" * 11: "nested",
    "\\sqrt" * 5_000 + "{2}": "nested",
    "1+" * 500_000: "longer",
}


@pytest.mark.parametrize("answer", TABLE_ANSWERS + ACCEPTED)
def test_normal_answers_are_not_refused(answer: str) -> None:
    assert refusal_reason(answer) is None


@pytest.mark.parametrize(("answer", "reason"), list(REFUSED.items()), ids=[a[:24] for a in REFUSED])
def test_hostile_answers_are_refused_with_a_reason(answer: str, reason: str) -> None:
    why = refusal_reason(answer)
    # with the whole-response length cap of accuracy_reward, refused all the same
    wide = refusal_reason(answer, MAX_RESPONSE_CHARS)
    assert why is not None and wide is not None
    assert reason in (why if reason == "longer" else wide)


def test_length_caps() -> None:
    assert refusal_reason("1" * 10 + " " * (MAX_ANSWER_CHARS - 10)) is None
    assert "longer" in (refusal_reason("x" * (MAX_ANSWER_CHARS + 1)) or "")
    assert refusal_reason("The answer is 5. " * 1000, MAX_RESPONSE_CHARS) is None


def test_nesting_depth_counts_matched_pairs_only() -> None:
    assert nesting_depth("(1,2]") == 1
    assert nesting_depth("\\frac{1}{\\sqrt{2}}") == 2
    assert nesting_depth("((((1") == 0
    assert nesting_depth("1)))") == 0
    assert nesting_depth("(((1)") == 1
