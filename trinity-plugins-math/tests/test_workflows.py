"""Workflows against a scripted model: real Experiences with real token ids from a real tokenizer."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest
import torch

from trinity.config import FormatConfig, GenerationConfig
from trinity.experience import Experience
from trinity.testing.tiny_model import build_tokenizer
from trinity.workflow import Task
from trinity_math.rewards import CountdownRewardFn, MathBoxedRewardFn, MathRewardFn
from trinity_math.workflows import (
    BOXED_SYSTEM_PROMPT,
    BOXED_THINK_SYSTEM_PROMPT,
    R1_SYSTEM_PROMPT,
    AsyncMathWorkflow,
    AsyncSimpleWorkflow,
    MathBoxedWorkflow,
    MathWorkflow,
    SimpleWorkflow,
)


class ScriptedModel:
    """Stands in for the rollout ModelWrapper: replies with fixed texts, in order, cycling.

    Prompts go through the tokenizer's chat template, so Experiences carry the token ids and
    prompt length the real engine would produce for the same texts; logprobs are a fixed
    -0.5 per response token. Every call is recorded.
    """

    model_version = 0

    def __init__(self, replies: list[str]) -> None:
        self.tokenizer = build_tokenizer()
        self.replies = replies
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []

    def _experiences(self, prompt_text: str, n: int) -> list[Experience]:
        prompt_ids = self.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        out = []
        for i in range(n):
            text = self.replies[i % len(self.replies)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(prompt_ids + ids, dtype=torch.long),
                    prompt_length=len(prompt_ids),
                    logprobs=torch.full((len(ids),), -0.5),
                    prompt_text=prompt_text,
                    response_text=text,
                )
            )
        return out

    def _template(self, messages: list[dict[str, Any]]) -> str:
        continue_final = messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
        )

    def chat(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        self.calls.append(("chat", messages, rollout_args))
        return self._experiences(self._template(messages), rollout_args.get("n", 1))

    def generate(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        self.calls.append(("generate", prompts, rollout_args))
        return [e for p in prompts for e in self._experiences(p, rollout_args.get("n", 1))]

    async def chat_async(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
        self.calls.append(("chat_async", messages, rollout_args))
        return self._experiences(self._template(messages), rollout_args.get("n", 1))

    async def generate_async(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        self.calls.append(("generate_async", prompts, rollout_args))
        return [e for p in prompts for e in self._experiences(p, rollout_args.get("n", 1))]


def make_task(
    workflow: type,
    question: str = "What is 3+4?",
    answer: Any = "7",
    reward_fn: type | None = None,
    repeat_times: int = 4,
    **format_args: Any,
) -> Task:
    return Task(
        workflow=workflow,
        reward_fn=reward_fn,
        raw_task={"question": question, "answer": answer},
        format_args=FormatConfig(prompt_key="question", response_key="answer", **format_args),
        rollout_args=GenerationConfig(temperature=0.7, max_tokens=32),
        repeat_times=repeat_times,
    )


RIGHT = "<think>3+4=7</think><answer>7</answer>"
WRONG = "<think>3+4=8</think><answer>8</answer>"
UNFORMATTED = "7"


def test_math_workflow_one_chat_call_n_samples_scored() -> None:
    model = ScriptedModel([RIGHT, WRONG, UNFORMATTED])
    workflow = make_task(MathWorkflow, repeat_times=4).to_workflow(model)
    workflow.set_repeat_times(4, run_id_base=10)
    exps = workflow.run()

    assert len(model.calls) == 1
    kind, messages, args = model.calls[0]
    assert kind == "chat"
    assert args == {"temperature": 0.7, "max_tokens": 32, "n": 4}
    assert messages == [
        {"role": "system", "content": R1_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 3+4?"},
    ]
    assert [e.reward for e in exps] == pytest.approx([1.1, 0.1, -0.1, 1.1])
    counts = {"reward_refused": 0.0, "reward_timeout": 0.0}  # not reward parts: not summed
    assert exps[0].metrics == {"accuracy": 1.0, "format_score": pytest.approx(0.1), **counts}
    assert exps[2].metrics == {"accuracy": 0.0, "format_score": pytest.approx(-0.1), **counts}
    assert [e.eid.run for e in exps] == [10, 11, 12, 13]
    # The Experiences are the model's own: token ids, prompt split and logprobs intact.
    assert exps[0].response_length == len(RIGHT)  # character-level tokenizer
    assert exps[0].logprobs.shape == (len(RIGHT),)
    assert "<|im_start|>system" in exps[0].prompt_text


def test_system_prompt_and_reply_prefix_come_from_format_args() -> None:
    model = ScriptedModel([RIGHT])
    task = make_task(MathWorkflow, repeat_times=1, system_prompt="Be brief.", reply_prefix="<think>")
    task.to_workflow(model).run()
    _, messages, _ = model.calls[0]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 3+4?"},
        {"role": "assistant", "content": "<think>"},
    ]


def test_math_workflow_takes_the_tasksets_reward_fn_and_args() -> None:
    model = ScriptedModel(["<answer>3*7-5</answer>", "<answer>3+7+5</answer>"])
    task = make_task(
        MathWorkflow, "Use 3 5 7 to make 16", {"target": 16, "numbers": [3, 5, 7]}, CountdownRewardFn, 2
    )
    task.reward_fn_args = {"format_score": 0.2}
    exps = task.to_workflow(model).run()
    assert [e.reward for e in exps] == [1.0, 0.2]
    assert exps[1].metrics == {"score": 0.2}


def test_simple_workflow_has_no_system_prompt_and_needs_a_reward_fn() -> None:
    model = ScriptedModel(["<think>x</think><answer>7</answer>"])
    exps = make_task(SimpleWorkflow, reward_fn=MathRewardFn, repeat_times=1).to_workflow(model).run()
    assert model.calls[0][1] == [{"role": "user", "content": "What is 3+4?"}]
    assert exps[0].reward == pytest.approx(1.1)
    with pytest.raises(ValueError, match="default_reward_fn_type"):
        make_task(SimpleWorkflow).to_workflow(model)


def test_missing_prompt_column_is_a_clear_error() -> None:
    task = make_task(MathWorkflow)
    task.raw_task = {"problem": "1+1", "answer": "2"}
    with pytest.raises(ValueError, match=r"no prompt column 'question'.*\['answer', 'problem'\]"):
        task.to_workflow(ScriptedModel([RIGHT]))


def test_reset_reuses_the_instance_and_its_reward_fn() -> None:
    model = ScriptedModel([RIGHT])
    workflow = make_task(MathWorkflow, repeat_times=1).to_workflow(model)
    reward_fn = workflow.reward_fn
    workflow.reset(make_task(MathWorkflow, "What is 4+4?", "8", repeat_times=1))
    assert workflow.reward_fn is reward_fn
    exps = workflow.run()
    assert model.calls[-1][1][-1]["content"] == "What is 4+4?"
    assert exps[0].metrics["accuracy"] == 0.0  # the reply says 7, the new truth is 8
    other = make_task(MathWorkflow, repeat_times=1)
    other.reward_fn_args = {"format_score": 0.5}
    workflow.reset(other)
    assert workflow.reward_fn is not reward_fn and workflow.reward_fn.format.score == 0.5


@pytest.mark.parametrize(("cls", "expected"), [(AsyncMathWorkflow, 1.1), (AsyncSimpleWorkflow, 1.1)])
def test_async_variants_await_chat_async(cls: type, expected: float) -> None:
    model = ScriptedModel([RIGHT])
    task = make_task(cls, reward_fn=MathRewardFn, repeat_times=3)
    workflow = task.to_workflow(model)
    assert workflow.is_async
    exps = asyncio.run(workflow.run_async())
    assert [c[0] for c in model.calls] == ["chat_async"]
    assert model.calls[0][2]["n"] == 3
    assert [e.reward for e in exps] == pytest.approx([expected] * 3)


def test_math_boxed_workflow_chat_and_base_mode() -> None:
    model = ScriptedModel(["so \\boxed{7}", "\\boxed{8}"])
    exps = make_task(MathBoxedWorkflow, repeat_times=2).to_workflow(model).run()
    assert model.calls[0][0] == "chat"
    assert model.calls[0][1][0] == {"role": "system", "content": BOXED_SYSTEM_PROMPT}
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert isinstance(make_task(MathBoxedWorkflow).to_workflow(model).reward_fn, MathBoxedRewardFn)

    base = make_task(MathBoxedWorkflow, repeat_times=2)
    base.workflow_args = {"use_base": True, "with_think": True, "format_score_coef": 0.3}
    exps = base.to_workflow(model).run()
    kind, prompts, args = model.calls[-1]
    assert kind == "generate" and args["n"] == 2
    assert prompts == [f"System: {BOXED_THINK_SYSTEM_PROMPT}\nUser:\nWhat is 3+4?\nAssistant:\n"]
    # with_think reaches the reward: no <think> block costs format_score_coef
    assert [{k: e.metrics[k] for k in ("accuracy", "format_score")} for e in exps] == [
        {"accuracy": 1.0, "format_score": -0.3},
        {"accuracy": 0.0, "format_score": -0.3},
    ]


def test_math_boxed_workflow_rejects_unknown_workflow_args() -> None:
    task = make_task(MathBoxedWorkflow)
    task.workflow_args = {"use_bse": True}
    with pytest.raises(ValueError, match=r"unknown workflow_args \['use_bse'\]"):
        task.to_workflow(ScriptedModel([RIGHT]))


def test_gsm8k_rows_score_unchanged() -> None:
    """GSM8K's answer column (worked solution + '#### N') is a valid truth as it is."""
    model = ScriptedModel(["<think>48/2=24, 48+24=72</think><answer>72</answer>", "\\boxed{72}"])
    row = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"
    math = make_task(MathWorkflow, "How many clips?", row, repeat_times=1).to_workflow(model).run()
    boxed = make_task(MathBoxedWorkflow, "How many clips?", row, repeat_times=1)
    model.replies = ["\\boxed{72}"]
    assert math[0].metrics["accuracy"] == 1.0
    assert boxed.to_workflow(model).run()[0].metrics["accuracy"] == 1.0


@pytest.mark.skipif(os.name != "posix", reason="the math-verify verifier processes are POSIX only")
def test_math_workflow_starts_the_verifier_before_it_generates() -> None:
    """In a runner thread, math-verify's verifier processes (about a second to start) start
    before the model is called, so their start overlaps the generation instead of delaying the
    rewards."""
    import trinity_math.verify as verify

    class Model(ScriptedModel):
        def chat(self, messages: list[dict[str, Any]], **rollout_args: Any) -> list[Experience]:
            self.worker_at_call = verify._verifiers.processes
            return super().chat(messages, **rollout_args)

    verify._verifiers.close()
    model = Model([RIGHT, WRONG])
    workflow = make_task(MathWorkflow, repeat_times=2).to_workflow(model)
    results: list[list[Experience]] = []
    thread = threading.Thread(target=lambda: results.append(workflow.run()))
    thread.start()
    thread.join(timeout=120)
    try:
        assert model.worker_at_call, "the verifiers were not started before generating"
        assert [e.reward for e in results[0]] == pytest.approx([1.1, 0.1])
    finally:
        verify._verifiers.close()
