"""The math workflows on the real transformers engine with the tiny math model (CPU, seconds)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from trinity.config import FormatConfig, GenerationConfig
from trinity.workflow import Task
from trinity_math.rewards import CountdownRewardFn
from trinity_math.tasks import countdown_problems
from trinity_math.tiny import MATH_VOCAB_CHARS
from trinity_math.workflows import AsyncMathWorkflow, MathBoxedWorkflow, MathWorkflow


@pytest.fixture(scope="module")
def model(tiny_model):
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout.transformers_engine import TransformersEngine

    path = tiny_model(vocab_chars=MATH_VOCAB_CHARS, seed=0)  # what create_math_model(path) saves
    return ModelWrapper(TransformersEngine(path, dtype="float32", device="cpu", seed=0))


def task(workflow: type, row: dict, **kwargs) -> Task:
    return Task(
        workflow=workflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="question", response_key="answer", system_prompt=""),
        rollout_args=GenerationConfig(temperature=1.0, max_tokens=12),
        repeat_times=4,
        **kwargs,
    )


def check(exps, n: int = 4) -> None:
    assert len(exps) == n
    assert [e.eid.run for e in exps] == list(range(n))
    for e in exps:
        assert e.reward is not None and e.reward == pytest.approx(sum(e.metrics.values()))
        assert e.logprobs is not None and e.logprobs.shape == (e.response_length,)
        assert 0 < e.response_length <= 12


def test_math_workflow_runs_on_the_engine(model) -> None:
    exps = task(MathWorkflow, {"question": "3+4", "answer": "7"}).to_workflow(model).run()
    check(exps)
    # an untrained model writes no tags: format penalty, no accuracy
    parts = {
        "accuracy": 0.0,
        "format_score": pytest.approx(-0.1),
        "reward_refused": 0.0,
        "reward_timeout": 0.0,
    }
    assert all(e.metrics == parts for e in exps)


def test_async_and_boxed_and_countdown_on_the_engine(model) -> None:
    check(
        asyncio.run(
            task(AsyncMathWorkflow, {"question": "3+4", "answer": "7"}).to_workflow(model).run_async()
        )
    )
    base = task(MathBoxedWorkflow, {"question": "3+4", "answer": "7"}, workflow_args={"use_base": True})
    check(base.to_workflow(model).run())
    row = countdown_problems(1)[0].row()
    check(task(MathWorkflow, row, reward_fn=CountdownRewardFn).to_workflow(model).run())


def test_workflow_in_a_runner_thread(model) -> None:
    """Runners call workflows off the main thread: rewards must still work there."""
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            task(MathWorkflow, {"question": "1+1", "answer": "2"}).to_workflow(model).run()
        )
    )
    worker.start()
    worker.join(timeout=120)
    check(results[0])
