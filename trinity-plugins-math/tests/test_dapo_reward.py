"""math_dapo_reward: DAPO's answer extraction, accuracy, the overlong penalty and hostile answers."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import trinity_math.verify as verify
from trinity.config import FormatConfig, GenerationConfig
from trinity.workflow import Task
from trinity_math.dapo import MathDAPORewardFn, extract_dapo_answer
from trinity_math.workflows import MathBoxedWorkflow, MathWorkflow, SimpleWorkflow

DAPO_PROMPT = "Solve step by step. The last line of your response should be of the form Answer: $Answer"
SANITY_SECONDS = 3.0  # far above the ~1 s bound on a comparison (as in test_hostile_answers)

# The hostile answers of test_hostile_answers.
HOSTILE = {
    "python-tower": "9**9**9**9",
    "latex-tower": "9^{9^{9^{9}}}",
    "googolplex": "10^{10^{100}}",
    "100k-digits": "7" * 100_000,
    "10k-deep-parens": "(" * 10_000 + "1" + ")" * 10_000,
    "10k-deep-braces": "{" * 10_000 + "1" + "}" * 10_000,
    "1MB": "1+" * 500_000,
}


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Answers that reach math-verify (here or in the worker process)."""
    calls: list[str] = []
    real_here, real_worker = verify._compare_here, verify._verifiers.compare

    def here(answer: str, truth: str, timeout_seconds: float) -> verify.Verdict:
        calls.append(answer[:40])
        return real_here(answer, truth, timeout_seconds)

    def worker(answer: str, truth: str, timeout_seconds: float) -> verify.Verdict:
        calls.append(answer[:40])
        return real_worker(answer, truth, timeout_seconds)

    monkeypatch.setattr(verify, "_compare_here", here)
    monkeypatch.setattr(verify._verifiers, "compare", worker)
    return calls


# (response, extracted answer)
EXTRACTION_CASES = [
    ("Step 1 ...\nAnswer: 34", "34"),
    ("Step 1 ...\nanswer:34\n", "34"),
    ("Step 1 ...\nANSWER : $\\frac{1}{2}$", "$\\frac{1}{2}$"),
    ("Step 1 ...\n**Answer:** 34.", "34"),
    ("First guess.\nAnswer: 3\nOn second thought.\nAnswer: 4", "4"),  # the last one counts
    ("Answer: \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # a box on the answer line
    ("so the sum is \\boxed{12}", "12"),  # Trinity-RFT's format: the last box
    ("Answer: 3\n... no, \\boxed{5}", "5"),  # the later of the two
    ("\\boxed{5}\nAnswer: 6", "6"),
    ("\\boxed{5}\nAnswer:", "5"),  # an empty answer line leaves the box
    ("<think>Answer: 1</think>The result.\nAnswer: 2", "2"),  # only after </think>
    ("<think>Answer: 1</think>", None),  # nothing after </think>
    ("42", "42"),  # a bare one-line response is its own answer
    ("  x = 3 \n", "x = 3"),
    ("Let me think.\nThe value is 34.", None),  # several lines, no answer form
    ("Answer:", None),
    ("", None),
    ("\\boxed{12", None),  # unclosed box
    ("1" * 3_000, None),  # too long to be a bare answer
]


@pytest.mark.parametrize(("response", "expected"), EXTRACTION_CASES)
def test_extract_dapo_answer(response: str, expected: str | None) -> None:
    assert extract_dapo_answer(response) == expected


# (response, truth, accuracy)
ACCURACY_CASES = [
    ("Reasoning.\nAnswer: 34", "34", 1.0),
    ("Reasoning.\nAnswer: 35", "34", 0.0),
    ("Reasoning.\nAnswer: $\\frac{1}{2}$", "0.5", 1.0),
    ("Reasoning.\nAnswer: \\boxed{1,234}", "1234", 1.0),
    ("so \\boxed{72}", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),  # GSM8K truth
    ("so \\boxed{7}", "The sum is \\boxed{7}.", 1.0),  # boxed solution as truth
    ("42", "42", 1.0),
    ("Reasoning with 34 in it, but no answer line.\nDone.", "34", 0.0),  # missing answer
    ("", "34", 0.0),
    ("Answer: __import__('os').system('true')", "4", 0.0),  # code is just a wrong answer
]


@pytest.mark.parametrize(("response", "truth", "accuracy"), ACCURACY_CASES)
def test_accuracy(response: str, truth: str, accuracy: float) -> None:
    assert MathDAPORewardFn()(response, truth) == {"accuracy": accuracy, "format_score": 0.0}


def test_incorrect_score_gives_the_papers_plus_minus_one() -> None:
    fn = MathDAPORewardFn(incorrect_score=-1.0)
    assert fn("Answer: 34", "34")["accuracy"] == 1.0
    assert fn("Answer: 35", "34")["accuracy"] == -1.0
    assert fn("no answer here\nat all", "34")["accuracy"] == -1.0


def penalised() -> MathDAPORewardFn:
    # max_response_length 20, cache 8: no penalty below 12 tokens, -penalty_factor above 20.
    return MathDAPORewardFn(
        enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=8
    )


# (response length in tokens, format_score), computed by hand: (12 - L) / 8 * 1.0 inside [12, 20]
OVERLONG_CASES = [
    (0, 0.0),
    (11, 0.0),
    (12, 0.0),  # the buffer starts: (12 - 12) / 8
    (13, -0.125),
    (16, -0.5),
    (19, -0.875),
    (20, -1.0),  # (12 - 20) / 8
    (21, -1.0),  # beyond max_response_length: -penalty_factor
    (500, -1.0),
]


@pytest.mark.parametrize(("length", "penalty"), OVERLONG_CASES)
def test_overlong_penalty(length: int, penalty: float) -> None:
    tokens = torch.zeros(length, dtype=torch.long)
    parts = penalised()("Answer: 34", "34", response_token=tokens)
    assert parts == {"accuracy": 1.0, "format_score": pytest.approx(penalty)}
    assert penalised()("Answer: 3", "34", response_token=list(range(length)))[
        "format_score"
    ] == pytest.approx(penalty)


def test_penalty_factor_scales_the_penalty() -> None:
    fn = MathDAPORewardFn(
        enable_overlong_penalty=True, penalty_factor=0.5, max_response_length=20, cache_length=8
    )
    assert fn("Answer: 3", "34", response_token=[0] * 16) == {
        "accuracy": 0.0,
        "format_score": pytest.approx(-0.25),
    }
    assert fn("Answer: 3", "34", response_token=[0] * 30)["format_score"] == pytest.approx(-0.5)


def test_penalty_off_by_default_and_tokens_ignored() -> None:
    fn = MathDAPORewardFn()
    assert fn("Answer: 34", "34", response_token=[0] * 10_000) == {"accuracy": 1.0, "format_score": 0.0}
    off = MathDAPORewardFn(
        enable_overlong_penalty=False, penalty_factor=1.0, max_response_length=20, cache_length=8
    )
    assert off("Answer: 34", "34", response_token=[0] * 100)["format_score"] == 0.0


def test_bad_penalty_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="needs max_response_length, cache_length"):
        MathDAPORewardFn(enable_overlong_penalty=True, penalty_factor=1.0)
    with pytest.raises(
        ValueError, match=r"cache_length \(20\) must be positive and smaller than max_response_length \(20\)"
    ):
        MathDAPORewardFn(
            enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=20
        )
    with pytest.raises(ValueError, match="needs the response's tokens"):
        penalised()("Answer: 34", "34")
    with pytest.raises(ValueError, match=r"format\.response_key"):
        MathDAPORewardFn()("Answer: 34", None)


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.parametrize(
    "wrap",
    [
        lambda a: "Reasoning.\nAnswer: " + a,
        lambda a: "So \\boxed{" + a + "}",
        lambda a: "Answer: \\boxed{" + a + "}",
    ],
    ids=["answer-line", "boxed", "boxed-answer-line"],
)
def test_hostile_answer_is_refused_before_evaluation(
    hostile: str, wrap, spy: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    fn = penalised()
    response = wrap(HOSTILE[hostile])
    with caplog.at_level(logging.DEBUG, logger="trinity_math"):
        start = time.monotonic()
        parts = fn(response, "5", response_token=[0] * 5)
        elapsed = time.monotonic() - start
    assert parts == {"accuracy": 0.0, "format_score": 0.0}
    assert spy == [], "a hostile answer reached math-verify"
    assert (fn.refusals, fn.timeouts) == (1, 0)
    assert any("refused" in record.getMessage() for record in caplog.records)
    assert elapsed < SANITY_SECONDS


def test_hostile_texts_without_an_answer_cost_nothing(spy: list[str]) -> None:
    """Huge responses with no answer form are scored wrong without a comparison."""
    fn = MathDAPORewardFn()
    for response in ("answer" + " " * 1_000_000 + "x", "Answer:" + "\n" * 1_000_000, "x\n" * 500_000):
        start = time.monotonic()
        assert fn(response, "5")["accuracy"] == 0.0
        assert time.monotonic() - start < SANITY_SECONDS
    assert spy == []


# -- through this plugin's workflows: they pass the response's tokens ------------------------


class FixedModel:
    """Replies with one fixed token sequence (prompt 3 tokens, response ``length`` tokens)."""

    model_version = 0

    def __init__(self, text: str, length: int) -> None:
        self.text, self.length = text, length

    def _reply(self, n: int) -> list:
        from trinity.experience import Experience

        return [
            Experience(tokens=torch.arange(3 + self.length), prompt_length=3, response_text=self.text)
            for _ in range(n)
        ]

    def chat(self, messages, **args):
        return self._reply(args.get("n", 1))

    def generate(self, prompts, **args):
        return self._reply(args.get("n", 1))


@pytest.mark.parametrize(
    ("workflow", "use_base"),
    [(MathBoxedWorkflow, True), (MathBoxedWorkflow, False), (MathWorkflow, False), (SimpleWorkflow, False)],
    ids=["math_boxed_workflow-use_base", "math_boxed_workflow", "math_workflow", "simple_workflow"],
)
def test_workflows_pass_the_response_tokens(workflow: type, use_base: bool) -> None:
    task = Task(
        workflow=workflow,
        reward_fn=MathDAPORewardFn,
        raw_task={"prompt": "What is 30+4?", "solution": "34"},
        format_args=FormatConfig(prompt_key="prompt", response_key="solution", system_prompt=DAPO_PROMPT),
        rollout_args=GenerationConfig(temperature=1.0),
        workflow_args={"use_base": True} if use_base else {},
        # as in Trinity-RFT's examples/dapo_math/dapo.yaml, scaled down
        reward_fn_args={
            "enable_overlong_penalty": True,
            "penalty_factor": 1.0,
            "max_response_length": 20,
            "cache_length": 8,
        },
        repeat_times=2,
    )
    exps = task.to_workflow(FixedModel("Reasoning.\nAnswer: 34", 16)).run()
    expected = {
        "accuracy": 1.0,
        "format_score": pytest.approx(-0.5),
        "reward_refused": 0.0,
        "reward_timeout": 0.0,
    }
    assert [e.metrics for e in exps] == [expected] * 2
    assert [e.reward for e in exps] == [pytest.approx(0.5)] * 2
