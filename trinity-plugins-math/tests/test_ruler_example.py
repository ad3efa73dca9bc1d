"""The RULER CPU example (examples/ruler): its scripted judges read the judge's chat as a served
judge would, its workflows reward with their scores, and its config loads with either judge."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from trinity.config import FormatConfig, load_config, stage_configs
from trinity.experience import Experience
from trinity.workflow import Task
from trinity_math.ruler import ruler_messages

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ruler"


@pytest.fixture(scope="module")
def judges():
    spec = importlib.util.spec_from_file_location("ruler_example_judges", EXAMPLE / "judges.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOLUTIONS = [
    "<think>3+4=7,7+5=12</think><answer>12</answer>",
    "<answer>11</answer>",
    "12",
    "<answer> 12 </answer>",
]


def test_the_scripted_judge_scores_the_right_tagged_answers(judges):
    chat = ruler_messages("3+4+5", SOLUTIONS)
    assert judges.read_chat(chat) == ("3+4+5", SOLUTIONS)
    assert judges.ScriptedJudge().ask(chat).endswith("\n[1, 0, 0, 1]")
    random_reply = judges.RandomJudge().ask(chat)
    assert random_reply == judges.RandomJudge().ask(chat)  # seeded by the chat
    assert random_reply != judges.RandomJudge().ask(ruler_messages("3+4+6", SOLUTIONS))


class Policy:
    model_version = 0

    def chat(self, messages, **args):
        return [
            Experience(tokens=torch.arange(8), prompt_length=4, logprobs=torch.zeros(4), response_text=t)
            for t in SOLUTIONS[: args["n"]]
        ]


@pytest.mark.parametrize(
    ("name", "rewards"), [("ScriptedJudgeRULER", [1.0, 0.0, 0.0, 1.0]), ("RandomJudgeRULER", None)]
)
def test_the_example_workflows_reward_with_their_judge(judges, name, rewards):
    task = Task(
        workflow=getattr(judges, name),
        raw_task={"question": "3+4+5", "answer": "12"},
        format_args=FormatConfig(prompt_key="question", response_key="answer", system_prompt=""),
        reward_fn_args={"format_score": 0.0},
        repeat_times=4,
    )
    workflow = task.to_workflow(Policy())  # no auxiliary model: the judge is scripted
    workflow.set_repeat_times(4, 0)
    exps = workflow.run()
    assert all(e.metrics["judge_success"] == 1.0 for e in exps)
    # the reference (math_reward): the right number in tags, as the scripted judge scores
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0, 0.0, 1.0]
    if rewards is not None:
        assert [e.reward for e in exps] == rewards
    else:
        assert len({e.reward for e in exps}) > 1 and all(0 <= e.reward <= 1 for e in exps)


@pytest.mark.parametrize("judge", ["ruler_scripted_judge", "ruler_random_judge"])
def test_the_config_loads_with_either_judge(monkeypatch, tmp_path, judges, judge):
    from trinity.testing.plugins import registered_plugin

    monkeypatch.setenv("RULER_DIR", str(tmp_path))
    monkeypatch.setenv("RULER_JUDGE", judge)
    with registered_plugin(judges, "ruler-example"):  # as --plugin-dir examples/ruler does
        sft, rl = stage_configs(load_config(EXAMPLE / "ruler.yaml"))
    assert (sft.algorithm.algorithm_type, rl.algorithm.algorithm_type) == ("sft", "grpo")
    assert rl.buffer.explorer_input.tasksets[0].default_workflow_type == judge
    assert [t.default_workflow_type for t in rl.buffer.explorer_input.eval_tasksets] == [judge, judge]
    assert rl.checkpoint_job_dir == str(tmp_path / "checkpoints" / "ruler" / judge / "grpo")
