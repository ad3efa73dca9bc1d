"""Plugin file of the RULER example (``--plugin-dir trinity-plugins-math/examples/ruler``): two
scripted judges for ``math_ruler_workflow``, each registered as a workflow of its own.

* ``ruler_scripted_judge``: reads the judge's chat as a judge model would (the question and the
  numbered candidate solutions of :func:`trinity_math.ruler.ruler_messages`), works the sum out
  and replies with a list of scores: 1 for a solution whose ``<answer>`` holds the right number,
  0 otherwise;
* ``ruler_random_judge``: replies with random scores (seeded by the chat it reads).

Both replies go through RULER's reading of a judge's reply, as a served judge's would. Neither
judge sees the task's reference answer.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from trinity import hookimpl
from trinity_math.equation import EquationError, evaluate, parse_equation
from trinity_math.ruler import MathRULERWorkflow

_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)
_SOLUTION = re.compile(
    r"Candidate solution (\d+): (.*?)(?=\n\nCandidate solution \d+: |\n\nScore each solution)", re.DOTALL
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def read_chat(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """The question and the candidate solutions in a RULER judge's chat."""
    text = messages[-1]["content"]
    question = _QUESTION.search(text)
    solutions = [m.group(2) for m in _SOLUTION.finditer(text)]
    return (question.group(1).strip() if question else ""), solutions


class ScriptedJudge:
    """Scores 1 for the right number in ``<answer>`` tags, else 0."""

    def ask(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        question, solutions = read_chat(messages)
        try:
            truth = evaluate(parse_equation(question))
        except EquationError:
            return "I cannot work this question out."
        scores = []
        for solution in solutions:
            answers = _ANSWER.findall(solution)
            scores.append(1 if answers and answers[-1].strip() == str(truth) else 0)
        return f"Checked each final answer against {truth}.\n{scores}"


class RandomJudge:
    """Scores drawn at random, the same for the same chat."""

    def ask(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        _, solutions = read_chat(messages)
        draw = random.Random(hashlib.sha256(repr(messages).encode()).digest())
        return str([round(draw.random(), 2) for _ in solutions])


class ScriptedJudgeRULER(MathRULERWorkflow):
    """``math_ruler_workflow`` judged by :class:`ScriptedJudge`."""

    workflow_name = "ruler_scripted_judge"

    def make_judge(self, auxiliary_models):
        return ScriptedJudge()


class RandomJudgeRULER(MathRULERWorkflow):
    """``math_ruler_workflow`` judged by :class:`RandomJudge`."""

    workflow_name = "ruler_random_judge"

    def make_judge(self, auxiliary_models):
        return RandomJudge()


@hookimpl
def register_workflows(register):
    register("ruler_scripted_judge", ScriptedJudgeRULER)
    register("ruler_random_judge", RandomJudgeRULER)
