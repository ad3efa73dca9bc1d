"""on_policy_distill_workflow / on_policy_distill_math_workflow with tiny student and teacher models.

The student and the teacher are two tiny math models (same tokenizer, different seeds) on the
transformers engine (CPU); the teacher's log-probs are checked against a forward pass of the
teacher's weights loaded separately with transformers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from trinity.config import FormatConfig, GenerationConfig
from trinity.experience import Experience
from trinity.workflow import Task
from trinity_math.distill import (
    QWEN_MATH_INSTRUCTION,
    QWEN_MATH_SYSTEM_PROMPT,
    OnPolicyDistillMathWorkflow,
    OnPolicyDistillWorkflow,
)
from trinity_math.tiny import create_math_model

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = Path(tmp_path_factory.mktemp("distill"))
    return {
        "student": create_math_model(root / "student", seed=0),
        "teacher": create_math_model(root / "teacher", seed=1),
    }


@pytest.fixture(scope="module")
def student(paths):
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout.transformers_engine import TransformersEngine

    return ModelWrapper(TransformersEngine(paths["student"], dtype="float32", device="cpu", seed=0))


@pytest.fixture(scope="module")
def teacher(paths):
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout.transformers_engine import TransformersEngine

    return ModelWrapper(TransformersEngine(paths["teacher"], dtype="float32", device="cpu", seed=0))


@pytest.fixture(scope="module")
def teacher_reference(paths):
    """The teacher's log-probs of ``tokens[prompt_length:]``, from its own forward pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(paths["teacher"], dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(exp: Experience, temperature: float = 1.0) -> torch.Tensor:
        logits = model(input_ids=exp.tokens[None]).logits[0].float() / temperature
        targets = exp.tokens[exp.prompt_length :]
        rows = logits[exp.prompt_length - 1 : exp.tokens.shape[0] - 1]  # row t predicts token t+1
        return torch.log_softmax(rows, dim=-1)[torch.arange(targets.shape[0]), targets]

    return logprobs


def make_task(workflow: type, answer: Any = "7", repeat_times: int = 3, **kwargs: Any) -> Task:
    return Task(
        workflow=workflow,
        raw_task={"question": "3+4", "answer": answer},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(temperature=1.0, max_tokens=MAX_TOKENS),
        repeat_times=repeat_times,
        **kwargs,
    )


def check_against_teacher(exps: list[Experience], reference, temperature: float = 1.0) -> None:
    for i, exp in enumerate(exps):
        assert exp.teacher_logprobs is not None
        assert exp.teacher_logprobs.shape == exp.logprobs.shape == (exp.response_length,)
        expected = reference(exp, temperature)
        torch.testing.assert_close(exp.teacher_logprobs, expected, atol=1e-5, rtol=1e-5)
        # the student is another model: its own log-probs differ
        assert not torch.allclose(exp.teacher_logprobs, exp.logprobs, atol=1e-3)
        assert exp.metrics["kl_divergence"] == pytest.approx(float((exp.logprobs - expected).sum()), abs=1e-4)
        assert exp.eid.run == 5 + i


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run", "run_async"])
def test_teacher_logprobs_on_the_engine(student, teacher, teacher_reference, asynchronous: bool) -> None:
    workflow = make_task(OnPolicyDistillWorkflow).to_workflow(student, [teacher])
    assert workflow.is_async and workflow.can_repeat and workflow.can_reset
    workflow.set_repeat_times(3, run_id_base=5)
    exps = asyncio.run(workflow.run_async()) if asynchronous else workflow.run()
    assert len(exps) == 3
    assert all(0 < e.response_length <= MAX_TOKENS for e in exps)
    check_against_teacher(exps, teacher_reference)
    assert [e.reward for e in exps] == [0.0] * 3
    assert all(set(e.metrics) == {"kl_divergence"} for e in exps)


def test_teacher_temperature_from_workflow_args(student, teacher, teacher_reference) -> None:
    workflow = make_task(OnPolicyDistillWorkflow, workflow_args={"temperature": 0.5}).to_workflow(
        student, [teacher]
    )
    workflow.set_repeat_times(2, run_id_base=5)
    check_against_teacher(workflow.run(), teacher_reference, temperature=0.5)


def test_math_variant_on_the_engine(student, teacher, teacher_reference) -> None:
    workflow = make_task(OnPolicyDistillMathWorkflow).to_workflow(student, [teacher])
    workflow.set_repeat_times(2, run_id_base=5)
    exps = asyncio.run(workflow.run_async())
    check_against_teacher(exps, teacher_reference)
    # an untrained student boxes nothing: accuracy 0
    assert all(e.reward == e.metrics["accuracy"] == 0.0 for e in exps)


# -- a scripted student: chosen replies, tokenised with the teacher's tokenizer ---------------


class ScriptedStudent:
    """Replies with fixed texts (cycling); logprobs -0.5 per token; records the messages."""

    model_version = 0

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.calls: list[list[dict[str, Any]]] = []

    def chat(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        self.calls.append(messages)
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = []
        for i in range(rollout_args["n"]):
            text = self.replies[i % len(self.replies)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(prompt_ids + ids),
                    prompt_length=len(prompt_ids),
                    logprobs=torch.full((len(ids),), -0.5),
                    response_text=text,
                )
            )
        return out

    async def chat_async(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        return self.chat(messages, **rollout_args)


def test_math_variant_prompt_and_accuracy(teacher, teacher_reference) -> None:
    replies = ["3+4=7, so \\boxed{7}", "\\boxed{8}", "7"]
    model = ScriptedStudent(teacher.tokenizer, replies)
    gsm8k = "3 and 4 make <<3+4=7>>7.\n#### 7"
    workflow = make_task(OnPolicyDistillMathWorkflow, answer=gsm8k).to_workflow(model, [teacher])
    workflow.set_repeat_times(3, run_id_base=5)
    exps = workflow.run()
    assert model.calls[0] == [
        {"role": "system", "content": QWEN_MATH_SYSTEM_PROMPT},
        {"role": "user", "content": "3+4\n" + QWEN_MATH_INSTRUCTION},
    ]
    assert QWEN_MATH_INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    # accuracy_reward: the box, else math-verify's extraction (a bare "7")
    assert [e.reward for e in exps] == [1.0, 0.0, 1.0]
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0, 1.0]
    check_against_teacher(exps, teacher_reference)
    for exp, reply in zip(exps, replies):
        assert exp.response_length == len(reply)  # character-level tokenizer
        assert exp.metrics["kl_divergence"] == pytest.approx(
            float((-0.5 - exp.teacher_logprobs).sum()), abs=1e-4
        )


def test_plain_variant_uses_format_args(teacher) -> None:
    model = ScriptedStudent(teacher.tokenizer, ["ok"])
    task = make_task(OnPolicyDistillWorkflow, repeat_times=1)
    task.format_args = FormatConfig(
        prompt_key="question", response_key="answer", system_prompt="Be brief.", reply_prefix="Sure"
    )
    exps = task.to_workflow(model, [teacher]).run()
    assert model.calls[0] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "3+4"},
        {"role": "assistant", "content": "Sure"},
    ]
    assert exps[0].reward == 0.0


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [OnPolicyDistillWorkflow, OnPolicyDistillMathWorkflow])
@pytest.mark.parametrize("auxiliary", [None, []])
def test_missing_teacher_is_a_clear_error(cls: type, auxiliary) -> None:
    with pytest.raises(
        ValueError, match=r"needs a teacher model: configure one in explorer\.auxiliary_models"
    ):
        make_task(cls).to_workflow(ScriptedStudent(None, ["x"]), auxiliary)


class ShortTeacher:
    """A teacher that scores one token too few."""

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        return torch.zeros(len(tokens) - 2)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run", "run_async"])
def test_length_mismatch_names_both_lengths(teacher, asynchronous: bool) -> None:
    model = ScriptedStudent(teacher.tokenizer, ["abcd"])
    workflow = make_task(OnPolicyDistillWorkflow, repeat_times=1).to_workflow(model, [ShortTeacher()])
    with pytest.raises(ValueError, match=r"cover 3 response tokens but the response has 4"):
        asyncio.run(workflow.run_async()) if asynchronous else workflow.run()


def test_bad_task_settings_are_clear_errors(teacher) -> None:
    model = ScriptedStudent(teacher.tokenizer, ["x"])
    with pytest.raises(ValueError, match=r"unknown workflow_args \['temprature'\]"):
        make_task(OnPolicyDistillWorkflow, workflow_args={"temprature": 0.5}).to_workflow(model, [teacher])
    with pytest.raises(ValueError, match=r"format\.response_key"):
        make_task(OnPolicyDistillMathWorkflow, answer=None).to_workflow(model, [teacher])
    task = make_task(OnPolicyDistillWorkflow)
    task.raw_task = {"problem": "1+1"}
    with pytest.raises(ValueError, match=r"no prompt column 'question'"):
        task.to_workflow(model, [teacher])


def test_reset_keeps_the_teacher(teacher) -> None:
    model = ScriptedStudent(teacher.tokenizer, ["\\boxed{8}"])
    workflow = make_task(OnPolicyDistillMathWorkflow, repeat_times=1).to_workflow(model, [teacher])
    workflow.reset(make_task(OnPolicyDistillMathWorkflow, answer="8", repeat_times=1))
    assert workflow.teacher is teacher
    assert workflow.run()[0].reward == 1.0
