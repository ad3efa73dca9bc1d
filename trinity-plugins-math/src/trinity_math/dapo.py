"""``math_dapo_reward``: DAPO's rule-based math reward with its overlong soft penalty.

DAPO (https://arxiv.org/abs/2503.14476) rewards a correct final answer and, optionally, punishes
responses that run into the length limit. The parts, with Trinity-RFT's names:

* ``accuracy``      1.0 when the final answer equals the truth, else ``incorrect_score``
  (0.0 by default, as Trinity-RFT's ``MathDAPORewardFn``; -1.0 gives the paper's +1 / -1);
* ``format_score``  the overlong penalty when ``enable_overlong_penalty``, else 0.0. With
  ``L`` the response's length in tokens, ``max_response_length`` ``M`` and ``cache_length``
  ``C`` (the soft buffer):

  ============================  =====================================
  ``L < M - C``                 0
  ``M - C <= L <= M``           ``(M - C - L) / C * penalty_factor``
  ``L > M``                     ``-penalty_factor``
  ============================  =====================================

The final answer is looked for after the last ``</think>``: the last ``\\boxed{}`` or the last
``Answer: ...`` line (DAPO's own format), whichever comes later; a response that is nothing but
a short single line counts as the answer itself. Equality is this plugin's (math-verify, after
:mod:`trinity_math.guard` has refused hostile answers, under ``timeout_seconds``).

The token length comes from the ``response_token`` keyword (the response's token ids, as
Trinity-RFT passes them); this plugin's single-turn workflows pass it to this reward.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sized
from typing import Any, ClassVar

from trinity_math.answers import last_boxed, reference_answer
from trinity_math.guard import MAX_ANSWER_CHARS
from trinity_math.rewards import _require_truth, _VerifyingReward
from trinity_math.verify import DEFAULT_TIMEOUT_SECONDS

# DAPO's answer line: "Answer: $Answer" (any case, anything up to the end of the line).
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]*)", re.IGNORECASE)
_BOXED_NAMES = ("\\boxed", "\\fbox")


def _clean(text: str) -> str:
    """An ``Answer:`` line's content without markdown emphasis, a trailing full stop or spaces."""
    text = text.strip().strip("*").strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def extract_dapo_answer(response: str) -> str | None:
    """The final answer of a DAPO-style response, or ``None`` when it gives none.

    Only the text after the last ``</think>`` counts. There, the later of the last
    ``\\boxed{...}`` (its content) and the last ``Answer: ...`` (the rest of that line, itself
    reduced to its ``\\boxed{}`` content when it has one) is the answer. Without either, a
    response that is one line of at most :data:`~trinity_math.guard.MAX_ANSWER_CHARS`
    characters is its own answer (``"42"``); anything else has no answer.
    """
    text = response.rsplit("</think>", 1)[-1]
    line = deque(_ANSWER_LINE.finditer(text), maxlen=1)
    box_at = max(text.rfind(name) for name in _BOXED_NAMES)
    if line and line[0].start() > box_at:
        content = line[0].group(1)
        boxed = last_boxed(content)
        answer = _clean(boxed if boxed is not None else content)
        if answer:
            return answer
    if box_at >= 0:
        return last_boxed(text) or None
    bare = text.strip()
    if not line and bare and "\n" not in bare and len(bare) <= MAX_ANSWER_CHARS:
        return bare
    return None


class MathDAPORewardFn(_VerifyingReward):
    """DAPO's math reward: ``accuracy`` of the final answer plus the overlong ``format_score``.

    Args:
        enable_overlong_penalty: add the soft overlong penalty (needs the three below).
        penalty_factor: the largest penalty (reached at ``max_response_length`` tokens).
        max_response_length: responses longer than this get ``-penalty_factor``.
        cache_length: the soft buffer: the penalty grows linearly from 0 at
            ``max_response_length - cache_length`` tokens to ``-penalty_factor``.
        incorrect_score: ``accuracy`` of a wrong or missing answer (0.0 as in Trinity-RFT;
            -1.0 for the DAPO paper's +1 / -1).
        timeout_seconds: bound on each comparison (both parses and the comparison together).

    Called as ``fn(response, truth, response_token=<the response's token ids>)``; the
    token ids are needed only with the penalty on (anything with a ``len()`` works).
    """

    #: This plugin's workflows pass ``response_token`` to rewards that set this.
    needs_response_token: ClassVar[bool] = True

    def __init__(
        self,
        enable_overlong_penalty: bool | None = None,
        penalty_factor: float | None = None,
        max_response_length: int | None = None,
        cache_length: int | None = None,
        incorrect_score: float = 0.0,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(timeout_seconds)
        self.enable_overlong_penalty = bool(enable_overlong_penalty)
        self.penalty_factor = penalty_factor
        self.max_response_length = max_response_length
        self.cache_length = cache_length
        self.incorrect_score = float(incorrect_score)
        if self.enable_overlong_penalty:
            missing = [
                name
                for name in ("penalty_factor", "max_response_length", "cache_length")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"math_dapo_reward: enable_overlong_penalty needs {', '.join(missing)} in reward_fn_args "
                    "(penalty_factor, max_response_length and cache_length must all be set)"
                )
            if not 0 < cache_length < max_response_length:  # type: ignore[operator]
                raise ValueError(
                    f"math_dapo_reward: cache_length ({cache_length}) must be positive and smaller than "
                    f"max_response_length ({max_response_length})"
                )

    def overlong_penalty(self, response_length: int) -> float:
        """The (non-positive) penalty of a response of ``response_length`` tokens."""
        assert self.max_response_length is not None and self.cache_length is not None
        assert self.penalty_factor is not None
        expected = self.max_response_length - self.cache_length
        if response_length < expected:
            return 0.0
        if response_length > self.max_response_length:
            return -float(self.penalty_factor)
        return (expected - response_length) / self.cache_length * self.penalty_factor

    def __call__(
        self,
        response: str,
        truth: str | None = None,
        response_token: Sized | None = None,
        **kwargs: Any,
    ) -> dict[str, float]:
        gold = reference_answer(_require_truth(truth, "math_dapo_reward"))
        answer = extract_dapo_answer(response)
        correct = answer is not None and self._equal(answer, gold)
        format_score = 0.0
        if self.enable_overlong_penalty:
            if response_token is None:
                raise ValueError(
                    "math_dapo_reward: the overlong penalty needs the response's tokens "
                    "(response_token=...); use it with a workflow that passes them (simple_workflow, "
                    "math_workflow, math_boxed_workflow) or set enable_overlong_penalty: false"
                )
            format_score = self.overlong_penalty(len(response_token))
        return {"accuracy": 1.0 if correct else self.incorrect_score, "format_score": format_score}
