"""math_rm_workflow and rm_gallery_reward (RM-Gallery, PyPI rm-gallery), as Trinity-RFT's
grpo_math example uses them (stored unchanged in upstream_configs/grpo_math.yaml).

The tests marked ``needs_rm_gallery`` run RM-Gallery itself; they skip where it is not installed:
its releases pin transformers<5 and math-verify<0.8, so the main test venv cannot have it, and
``nox -s rm_gallery`` installs it (``--no-deps``, with the ``rm-gallery`` extra) and runs this
file. Elsewhere the workflow is tested with a reward double."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from trinity.buffer.taskset import TasksetReader
from trinity.config import FormatConfig, load_config
from trinity.experience import Experience
from trinity.plugins import get_component
from trinity.workflow import RewardFn, Task
from trinity_math import reward_model
from trinity_math.reward_model import (
    AsyncMathRMWorkflow,
    MathRMWorkflow,
    RMGalleryMissingError,
    RMGalleryRewardFn,
)
from trinity_math.rewards import MathRewardFn

UPSTREAM = Path(__file__).parent / "upstream_configs"

needs_rm_gallery = pytest.mark.skipif(
    importlib.util.find_spec("rm_gallery") is None,
    reason="rm-gallery is not installed here (it pins transformers<5 and math-verify<0.8, which this "
    "venv cannot have); `nox -s rm_gallery` installs it and runs these tests",
)


class ChatModel:
    """The rollout model's stand-in: fixed replies, one per sample; records the chats."""

    model_version = 0

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.calls: list[list[dict[str, Any]]] = []

    def chat(self, messages, n: int = 1, **_: Any) -> list[Experience]:
        self.calls.append(messages)
        return [
            Experience(
                tokens=torch.tensor([1, 2, 3]),
                prompt_length=1,
                response_text=self.replies[i % len(self.replies)],
            )
            for i in range(n)
        ]

    async def chat_async(self, messages, n: int = 1, **kwargs: Any) -> list[Experience]:
        return self.chat(messages, n, **kwargs)


def math_task(reward_fn: type, reward_fn_args: dict | None = None, workflow: type = MathRMWorkflow) -> Task:
    return Task(
        workflow=workflow,
        reward_fn=reward_fn,
        raw_task={"question": "What is 1 + 1?", "gt_answer": "2"},
        format_args=FormatConfig(prompt_key="question", response_key="gt_answer", system_prompt="Be brief."),
        reward_fn_args=reward_fn_args or {},
        repeat_times=2,
    )


class RecordingReward(RewardFn):
    """A reward model's double: scores by a substring, records what it was given."""

    takes_messages = True

    def __init__(self, **kwargs: Any) -> None:
        self.args = kwargs
        self.calls: list[tuple[str, str | None, Any]] = []

    def __call__(self, response, truth=None, *, messages=None, **kwargs):
        self.calls.append((response, truth, messages))
        return {"judge": 1.0 if truth in response else 0.0, "style": 0.25}

    def take_metrics(self):
        return {"reward_failed": 0.0}


# -- the workflow ------------------------------------------------------------------------------


@pytest.mark.parametrize("workflow", [MathRMWorkflow, AsyncMathRMWorkflow])
def test_the_reward_gets_the_chat_the_truth_and_each_response(workflow):
    import asyncio

    model = ChatModel(["it is 2", "it is 3"])
    wf = workflow(task=math_task(RecordingReward, {"reward_name": "x"}, workflow), model=model)
    exps = asyncio.run(wf.run_async()) if workflow.is_async else wf.run()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"}]
    assert model.calls == [chat]
    assert wf.reward_fn.args == {"reward_name": "x"}
    assert wf.reward_fn.calls == [("it is 2", "2", chat), ("it is 3", "2", chat)]
    assert [e.reward for e in exps] == [1.25, 0.25]
    assert exps[0].metrics == {"judge": 1.0, "style": 0.25, "reward_failed": 0.0}
    assert [e.eid.run for e in exps] == [0, 1]


def test_a_reward_that_takes_no_chat_is_called_as_usual():
    exps = MathRMWorkflow(
        task=math_task(MathRewardFn), model=ChatModel(["<think>x</think><answer>2</answer>"])
    ).run()
    assert exps[0].metrics["accuracy"] == 1.0


def test_the_workflow_needs_a_reward():
    with pytest.raises(ValueError, match="needs a reward function"):
        MathRMWorkflow(task=math_task(None), model=ChatModel(["2"]))


def test_grpo_math_config_loads_unchanged(monkeypatch, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "1+1", "gt_answer": "2"}\n')
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "data"))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    config = load_config(UPSTREAM / "grpo_math.yaml")
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is MathRMWorkflow
    assert get_component("reward_fn", taskset.default_reward_fn_type) is RMGalleryRewardFn
    assert taskset.reward_fn_args == {"reward_name": "math_verify_reward"}
    [task] = TasksetReader(taskset, config.buffer).read_batch(1)
    assert (task.workflow, task.reward_fn, task.truth) == (MathRMWorkflow, RMGalleryRewardFn, "2")


def test_without_rm_gallery_the_reward_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rm_gallery", None)  # as if not installed
    with pytest.raises(RMGalleryMissingError) as info:
        RMGalleryRewardFn(reward_name="math_verify_reward")
    message = str(info.value)
    assert "\n" not in message and message.startswith("rm_gallery_reward needs RM-Gallery (PyPI rm-gallery)")
    assert "pip install --no-deps rm-gallery==0.1.7 && pip install" in message
    assert "trinity-plugins-math[rm-gallery]" in message
    with pytest.raises(ValueError, match="reward_name must name an RM-Gallery reward"):
        RMGalleryRewardFn(reward_name="")


def test_the_hooks_stay_light():
    import subprocess

    code = "import sys, trinity_math.hooks; print([m for m in ('rm_gallery', 'torch', 'pandas') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the real package ---------------------------------------------------------------------------


@pytest.fixture
def reward():
    fn = RMGalleryRewardFn(reward_name="math_verify_reward")
    yield fn
    fn.close()


@needs_rm_gallery
def test_math_verify_reward_scores_in_a_runner_thread(reward, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # importing RM-Gallery here (below) writes ./log
    chat = [{"role": "user", "content": "What is 1 + 1?"}]
    results: list[dict] = []

    def score():  # the runner calls sync workflows in a thread of their own
        results.append(reward("so \\boxed{2}", "2", messages=chat))
        results.append(reward("so \\boxed{3}", "2", messages=chat))
        results.append(reward("\\frac{1}{2}", "0.5", messages=chat))

    thread = threading.Thread(target=score)
    thread.start()
    thread.join()
    assert results == [{"math_verify": 1.0}, {"math_verify": 0.0}, {"math_verify": 1.0}]
    assert reward.take_metrics() == {"reward_failed": 0.0} and reward.failures == 0

    # Why the reward process: in a thread, RM-Gallery's math_verify_reward cannot use
    # math-verify's signal-based timeout and scores every answer timeout_score.
    from rm_gallery.core.data.schema import DataOutput, DataSample, Step
    from rm_gallery.core.reward.registry import RewardRegistry

    direct = RewardRegistry.get("math_verify_reward")()
    sample = DataSample(
        unique_id="x",
        output=[DataOutput(answer=Step(role="assistant", content="\\boxed{2}", label={"reference": "2"}))],
    )
    in_thread: list[float] = []
    thread = threading.Thread(
        target=lambda: in_thread.append(direct.evaluate(sample).output[0].answer.reward.score)
    )
    thread.start()
    thread.join()
    assert in_thread == [0.0]


@needs_rm_gallery
def test_the_reward_process_leaves_nothing_in_the_jobs_folder(tmp_path, monkeypatch):
    # RM-Gallery's import opens ./log/rm_gallery.log; the reward process imports it elsewhere.
    monkeypatch.chdir(tmp_path)
    fn = RMGalleryRewardFn(reward_name="math_verify_reward")
    try:
        assert fn("so \\boxed{2}", "2", messages=[{"role": "user", "content": "1 + 1?"}]) == {
            "math_verify": 1.0
        }
    finally:
        fn.close()
    assert list(tmp_path.iterdir()) == []


@needs_rm_gallery
def test_the_grpo_math_workflow_on_rm_gallery(reward):
    task = math_task(RMGalleryRewardFn, {"reward_name": "math_verify_reward"})
    exps = MathRMWorkflow(task=task, model=ChatModel(["\\boxed{2}", "\\boxed{4}"])).run()
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert exps[0].metrics == {"math_verify": 1.0, "reward_failed": 0.0}


@needs_rm_gallery
def test_rewards_with_other_dimensions_and_arguments():
    fn = RMGalleryRewardFn(reward_name="math_verify_reward", name="mv", timeout_score=-1.0)
    try:
        assert fn("\\boxed{2}", "2") == {"mv": 1.0}
    finally:
        fn.close()
    fn = RMGalleryRewardFn(reward_name="reasoning_format")
    try:
        parts = fn("<think>a</think><answer>2</answer>", "2")
        assert list(parts) == ["format_reward"] and parts["format_reward"] == 1.0
        assert fn("no tags", "2")["format_reward"] == 0.0
    finally:
        fn.close()


@needs_rm_gallery
def test_unknown_rewards_and_arguments_fail_in_one_line():
    with pytest.raises(ValueError) as info:
        RMGalleryRewardFn(reward_name="math_verfy_reward")
    assert "did you mean 'math_verify_reward'?" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(
        ValueError, match=r"unknown argument\(s\) 'timeout' of RM-Gallery's 'math_verify_reward'"
    ):
        RMGalleryRewardFn(reward_name="math_verify_reward", timeout=3)
    with pytest.raises(ValueError) as info:
        RMGalleryRewardFn(reward_name="math_verify_reward", timeout_score="high")
    assert "invalid reward_fn_args" in str(info.value) and "\n" not in str(info.value)


@needs_rm_gallery
def test_failed_calls_score_zero_and_are_counted(reward, monkeypatch, caplog):
    # The reward raises (an unknown chat role): counted, logged, scored 0 with no parts.
    assert reward("\\boxed{2}", "2", messages=[{"role": "robot", "content": "x"}]) == {}
    assert reward.take_metrics() == {"reward_failed": 1.0} and reward.failures == 1
    assert "rm_gallery_reward 'math_verify_reward' failed (1 so far), scored 0: ValueError" in caplog.text
    # The process dies between calls: the next call starts another.
    reward._process.proc.kill()
    reward._process.proc.wait()
    assert reward("\\boxed{2}", "2") == {"math_verify": 1.0}
    assert reward.take_metrics() == {"reward_failed": 0.0}
    # No answer in time: the process is killed, the call counted; the next one gets a new process.
    monkeypatch.setattr(reward_model, "CALL_TIMEOUT_SECONDS", 0.05)
    slow = reward._process.proc
    assert reward("\\boxed{9^{9^{9^{9^{9}}}}} " * 50, "2") == {}
    assert reward.failures == 2 and "no answer within 0.05 s (reward process killed)" in caplog.text
    assert slow.wait(timeout=10) is not None
    monkeypatch.setattr(reward_model, "CALL_TIMEOUT_SECONDS", 120.0)
    assert reward("\\boxed{2}", "2") == {"math_verify": 1.0}
