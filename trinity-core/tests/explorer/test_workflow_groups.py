"""A workflow may put some of its experiences in a group of their own within the task
(Trinity-RFT's trainable RULER trains its judging turns as a group ``<task>-ruler``): the
explorer keeps a label the workflow set in ``eid.task`` after the task's position."""

from __future__ import annotations

import json

import pytest

from trinity import hookimpl
from trinity.buffer.base import WriterBase
from trinity.config import Config
from trinity.experience import group_ids_of
from trinity.explorer.explorer import Explorer
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.workflow import Workflow


class AnswerThenJudge(Workflow):
    """``repeat_times`` answers, then as many judgings labelled ``-judge``."""

    can_repeat = True

    def run(self):
        messages = [{"role": "user", "content": self.task.task_desc}]
        answers = self.model.chat(messages, n=self.repeat_times, max_tokens=3)
        judgings = self.model.chat(messages, n=self.repeat_times, max_tokens=3)
        for i, (answer, judging) in enumerate(zip(answers, judgings)):
            answer.reward, judging.reward = 1.0, 0.0
            answer.eid.run = judging.eid.run = i
            judging.eid.task = "-judge"
        return answers + judgings


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("answer_then_judge", AnswerThenJudge)


class ListWriter(WriterBase):
    def __init__(self):
        self.batches = []

    def write(self, experiences):
        self.batches.append(list(experiences))


@pytest.fixture
def plugins():
    with isolated_plugin_manager(), registered_plugin(_Plugin(), "groups-test"):
        yield


def test_a_label_in_eid_task_is_a_group_of_its_own(tmp_path, tiny_model_path, engine, plugins):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(2)))
    config = Config.model_validate(
        {
            "buffer": {
                "batch_size": 2,
                "explorer_input": {
                    "tasksets": [
                        {
                            "name": "t",
                            "path": str(data),
                            "repeat_times": 2,
                            "default_workflow_type": "answer_then_judge",
                        }
                    ]
                },
            },
            "explorer": {
                "runner_per_model": 1,
                "max_retry_times": 0,
                "rollout_model": {
                    "model_path": str(tiny_model_path),
                    "engine_type": "transformers",
                    "dtype": "float32",
                },
            },
        }
    )
    writer = ListWriter()
    Explorer(config, engines=[engine], writer=writer).explore_step()
    [batch] = writer.batches
    assert sorted((str(e.eid.task), e.eid.run, e.reward) for e in batch) == [
        ("0", 0, 1.0),
        ("0", 1, 1.0),
        ("0-judge", 0, 0.0),
        ("0-judge", 1, 0.0),
        ("1", 0, 1.0),
        ("1", 1, 1.0),
        ("1-judge", 0, 0.0),
        ("1-judge", 1, 0.0),
    ]
    # Four groups of two: each task's answers, and apart from them its judgings.
    groups = group_ids_of(batch).tolist()
    assert sorted(groups.count(g) for g in set(groups)) == [2, 2, 2, 2]
    assert len({e.eid.uid for e in batch}) == 8
