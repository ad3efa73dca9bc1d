"""Reward functions for math and countdown tasks (registered names in brackets).

Every reward returns its parts as a dict (the reward is their sum; each part is logged as a
metric), with the part names Trinity-RFT uses:

* ``math_reward``        ``accuracy`` (the ``<answer>`` content vs the truth) + ``format_score``
  (+0.1 for ``<think>…</think><answer>…</answer>``, −0.1 otherwise);
* ``math_boxed_reward``  ``accuracy`` (the last ``\\boxed{}`` vs the truth) + ``format_score``
  (0, or −0.1 when ``with_think`` and the ``<think>`` block is malformed);
* ``accuracy_reward``    ``accuracy`` (math-verify's own extraction over the whole response);
* ``format_reward``      ``format_score`` (+0.1 / −0.1 for a regex match);
* ``countdown_reward``   ``score``: 0 no equation, 0.1 an equation that is wrong, 1 correct.

Truths may be plain answers, ``\\boxed{}`` solutions or GSM8K solutions (``... #### 72``).
Equivalence is math-verify's. A hostile answer (an exponent tower such as ``9**9**9**9``, a
huge number, deep nesting, overly long text: see :mod:`trinity_math.guard`) is refused before
anything evaluates it, and every other comparison runs in a verifier process under a wall-time
bound, ``timeout_seconds`` (``reward_fn_args``; 1 s by default, for the whole call), that holds
whatever the load: a verifier that overruns is killed (see :mod:`trinity_math.verify`). Either
way the answer scores 0, is logged, and is counted: in the reward's ``refusals`` / ``timeouts``
and, per rollout, in the metrics ``reward_refused`` / ``reward_timeout`` (0 or 1; the math
workflows log their means as ``rollout/reward_refused`` / ``rollout/reward_timeout``, the share
of rollouts concerned). Nothing raises, and model output is never executed.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections import Counter
from typing import Any

from trinity.workflow import RewardFn
from trinity_math.answers import extract_tag, last_boxed, reference_answer, think_is_well_formed
from trinity_math.equation import EquationError, evaluate, numbers_used, parse_equation
from trinity_math.guard import MAX_ANSWER_CHARS, MAX_RESPONSE_CHARS
from trinity_math.verify import DEFAULT_TIMEOUT_SECONDS, Verdict, math_equal, prestart

logger = logging.getLogger(__name__)

# Trinity-RFT's patterns: math_reward is lenient about what precedes <think> and about
# whitespace; format_reward (after open-r1) wants each tag on its own line.
MATH_FORMAT_PATTERN = r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$"
STRICT_FORMAT_PATTERN = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"


def _require_truth(truth: str | None, reward: str) -> str:
    if truth is None:
        raise ValueError(
            f"{reward} needs a reference answer but the task has none: check that the taskset's "
            "`format.response_key` names the column holding the answer"
        )
    return str(truth)


class _VerifyingReward(RewardFn):
    """Shared plumbing: math-verify comparisons with a timeout; counts of refusals and timeouts."""

    timeout_seconds: float
    timeouts: int
    refusals: int

    def __init__(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if (
            isinstance(timeout_seconds, bool)
            or not isinstance(timeout_seconds, (int, float))
            or timeout_seconds <= 0
        ):
            raise ValueError(
                f"{type(self).__name__}: reward_fn_args.timeout_seconds must be a positive number of "
                f"seconds (the bound on one answer's verification), got {timeout_seconds!r}"
            )
        self.timeout_seconds = float(timeout_seconds)
        self.timeouts = 0
        self.refusals = 0
        self._pending = {"reward_refused": 0.0, "reward_timeout": 0.0}

    def take_metrics(self) -> dict[str, float]:
        """``reward_refused`` / ``reward_timeout``: how many of the comparisons since the last
        call were refused (hostile answer) or hit ``timeout_seconds`` (0 or 1 for one reward
        call). Not reward parts: the math workflows add them to each rollout's ``metrics``."""
        taken, self._pending = self._pending, {"reward_refused": 0.0, "reward_timeout": 0.0}
        return taken

    def start_verifier(self) -> None:
        """Start math-verify's worker process now if this thread's comparisons will use it
        (:func:`trinity_math.verify.prestart`): a workflow calls this before generating, so
        the worker's start overlaps the generation instead of delaying the first reward."""
        prestart()

    def _equal(self, answer: str, truth: str, max_chars: int = MAX_ANSWER_CHARS) -> bool:
        verdict: Verdict = math_equal(answer, truth, self.timeout_seconds, max_chars)
        if verdict.refused:
            self.refusals += 1
            self._pending["reward_refused"] += 1.0
            # The first one is a warning; after that (a policy that learnt the trick) debug.
            logger.log(
                logging.WARNING if self.refusals == 1 else logging.DEBUG,
                "%s: refused answer %.80r before evaluating it (%s); scored as wrong (%d refusals so far)",
                type(self).__name__,
                answer,
                verdict.refused,
                self.refusals,
            )
        if verdict.timed_out:
            self.timeouts += 1
            self._pending["reward_timeout"] += 1.0
            logger.warning(
                "%s: comparing answer %.80r with %.80r took longer than %ss; scored as wrong "
                "(%d timeouts so far)",
                type(self).__name__,
                answer,
                truth,
                self.timeout_seconds,
                self.timeouts,
            )
        return verdict.equal


class FormatReward(RewardFn):
    """``format_score``: +``score`` when the whole response matches ``pattern``, −``score`` otherwise.

    The default pattern wants ``<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>``.
    """

    def __init__(self, pattern: str | None = None, score: float = 0.1) -> None:
        self.pattern = re.compile(pattern or STRICT_FORMAT_PATTERN, re.DOTALL | re.MULTILINE)
        self.score = score

    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        matched = self.pattern.match(response) is not None
        return {"format_score": self.score if matched else -self.score}


class AccuracyReward(_VerifyingReward):
    """``accuracy``: 1 if math-verify finds the truth's value in the response, else 0.

    math-verify looks for a ``\\boxed{}`` first, then for the last LaTeX or plain expression;
    no tags are needed. Use it for models that answer in free text.
    """

    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        gold = reference_answer(_require_truth(truth, "accuracy_reward"))
        if not response.strip():
            return {"accuracy": 0.0}
        # Anchored in \boxed{} when there is one, so math-verify's extraction starts there.
        boxed = last_boxed(response)
        if boxed is not None:
            answer = "\\boxed{" + boxed + "}"
            return {"accuracy": float(self._equal(answer, gold, MAX_ANSWER_CHARS + len(answer) - len(boxed)))}
        # No box: the whole response is searched, up to a larger cap.
        return {"accuracy": float(self._equal(response, gold, MAX_RESPONSE_CHARS))}


class MathRewardFn(_VerifyingReward):
    """DeepSeek-R1 style: ``accuracy`` of the ``<answer>`` content plus a ±``format_score``.

    Args:
        pattern: regex the whole response must match for the format bonus (default: a
            ``<think>…</think>`` block followed by an ``<answer>…</answer>`` block at the end).
        format_score: size of the bonus / penalty.
        timeout_seconds: bound on each comparison (both parses and the comparison together).

    A response without a complete ``<answer>…</answer>`` has accuracy 0, whatever it says.
    """

    def __init__(
        self,
        pattern: str = MATH_FORMAT_PATTERN,
        format_score: float = 0.1,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(timeout_seconds)
        self.format = FormatReward(pattern, format_score)

    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        gold = reference_answer(_require_truth(truth, "math_reward"))
        answer = extract_tag(response, "answer")
        accuracy = float(bool(answer) and self._equal(answer, gold))
        return {"accuracy": accuracy, **self.format(response)}


class MathBoxedRewardFn(_VerifyingReward):
    """``accuracy`` of the last ``\\boxed{}`` in the response, plus an optional think penalty.

    Args:
        with_think: also require one well-formed ``<think>…</think>`` block; without it
            ``format_score`` is ``-format_score_coef``.
        format_score_coef: size of that penalty.
        timeout_seconds: bound on each comparison (both parses and the comparison together).

    ``with_think`` and ``format_score_coef`` may also be passed per call (as
    ``math_boxed_workflow`` does from its ``workflow_args``).
    """

    def __init__(
        self,
        with_think: bool = False,
        format_score_coef: float = 0.1,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(timeout_seconds)
        self.with_think = with_think
        self.format_score_coef = format_score_coef

    def __call__(
        self,
        response: str,
        truth: str | None = None,
        with_think: bool | None = None,
        format_score_coef: float | None = None,
        **kwargs: Any,
    ) -> dict[str, float]:
        gold = reference_answer(_require_truth(truth, "math_boxed_reward"))
        boxed = last_boxed(response)
        accuracy = float(bool(boxed) and self._equal(boxed, gold))  # type: ignore[arg-type]
        think = self.with_think if with_think is None else with_think
        coef = self.format_score_coef if format_score_coef is None else format_score_coef
        format_score = 0.0 if not think or think_is_well_formed(response) else -coef
        return {"accuracy": accuracy, "format_score": format_score}


def _countdown_truth(truth: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from a dict, a JSON string or the ``str()`` of a dict."""
    data = truth
    if isinstance(truth, str):
        try:
            data = json.loads(truth)
        except json.JSONDecodeError:
            try:
                # Task.truth is str(value): a dict column arrives as its Python repr.
                data = ast.literal_eval(truth)
            except (ValueError, SyntaxError):
                data = None
    if not isinstance(data, dict):
        raise ValueError(
            f"countdown_reward expects a truth like {{'target': 24, 'numbers': [4, 6, 1]}} "
            f"(a dict or its JSON), got {truth!r:.200}"
        )
    numbers = data.get("numbers", data.get("nums"))
    try:
        return int(data["target"]), [int(n) for n in numbers]  # type: ignore[union-attr]
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"countdown_reward expects integer 'target' and a list of integer 'numbers', got {data!r:.200}"
        ) from None


class CountdownRewardFn(RewardFn):
    """Countdown (TinyZero): use every given number exactly once to reach the target.

    ``score`` is 0 when the response has no ``<answer>…</answer>`` equation, ``format_score``
    (0.1) when the equation is malformed, uses other numbers or misses the target, and
    ``score`` (1.0) when it is right. The equation is parsed with :mod:`ast` and evaluated
    exactly (never ``eval``); only integers, ``+ - * /`` and parentheses are accepted.
    The truth is ``{"target": int, "numbers": [int, ...]}`` as a dict or JSON text.
    """

    def __init__(self, format_score: float = 0.1, score: float = 1.0) -> None:
        self.format_score = format_score
        self.score = score

    def __call__(self, response: str, truth: Any = None, **kwargs: Any) -> dict[str, float]:
        if truth is None:
            _require_truth(truth, "countdown_reward")
        target, numbers = _countdown_truth(truth)
        equation = extract_tag(response, "answer")
        if not equation:
            return {"score": 0.0}
        try:
            tree = parse_equation(equation)
            if Counter(numbers_used(tree)) != Counter(numbers):
                return {"score": self.format_score}
            correct = evaluate(tree) == target
        except EquationError:
            return {"score": self.format_score}
        return {"score": self.score if correct else self.format_score}
