"""The ``data_juicer`` operator: real Data-Juicer recipes of CPU-only operators, in-process, on
experiences (stats into ``info``, filtered rows dropped) and on task rows (a recipe file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("data_juicer", reason="Data-Juicer is the optional extra trinity-core[data-juicer]")

from trinity.data.data_juicer import DataJuicerOperator
from trinity.data.experience_ops import EXPERIENCE_OPERATORS
from trinity.data.pipeline import ExperiencePipeline
from trinity.experience import EID, Experience
from trinity.plugins import get_component
from trinity.testing import check_component

RECIPE = [
    {"text_length_filter": {"min_len": 10, "max_len": 60}},
    {"word_repetition_filter": {"rep_len": 1, "min_ratio": 0.0, "max_ratio": 0.5}},
]


def _exp(task: int, run: int, response: str) -> Experience:
    return Experience(
        tokens=torch.arange(6),
        prompt_length=3,
        reward=1.0,
        eid=EID(batch=1, task=task, run=run),
        prompt_text=f"question {task}",
        response_text=response,
    )


def test_it_is_registered_and_conforms():
    assert get_component("operator", "data_juicer") is DataJuicerOperator
    check_component("operator", DataJuicerOperator, init_args={"process": RECIPE[:1]})


def test_a_recipe_on_experiences_drops_filtered_rows_and_keeps_stats_for_reward_shaping():
    exps = [
        _exp(0, 0, "The answer is twelve, because 3+4+5=12."),
        _exp(0, 1, "short"),  # text_length_filter: under 10 characters
        _exp(1, 0, "no no no no no no no no no no"),  # word_repetition_filter: all repeats
        _exp(1, 1, "Seven plus five makes twelve in total."),
    ]
    pipeline = ExperiencePipeline(
        [
            ("data_juicer", DataJuicerOperator(process=RECIPE)),
            (
                "reward_shaping_mapper",
                EXPERIENCE_OPERATORS["reward_shaping_mapper"](
                    [{"stats_key": "text_len", "op_type": "ADD", "weight": 0.01}]
                ),
            ),
        ]
    )
    kept, metrics = pipeline.process(exps)
    assert [(e.eid.task, e.eid.run) for e in kept] == [(0, 0), (1, 1)]
    assert metrics["pipeline/data_juicer/dropped"] == 2.0
    for exp in kept:
        assert exp.info["text_len"] == len(exp.response_text)
        assert 0.0 <= exp.info["word_rep_ratio"] <= 0.5
        assert exp.reward == pytest.approx(1.0 + 0.01 * len(exp.response_text))


def test_a_recipe_file_on_task_rows_through_the_task_pipeline(tmp_path):
    from trinity.config import load_config
    from trinity.data.tasks import run_task_pipeline

    (tmp_path / "recipe.yaml").write_text(
        "project_name: tasks\nnp: 1\nprocess:\n  - text_length_filter:\n      text_key: question\n      min_len: 8\n"
    )
    rows = [{"question": "What is 3+4+5?", "answer": "12"}, {"question": "2+2?", "answer": "4"}]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "project": "p",
        "name": "dj",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model"), "max_model_len": 64},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {
            "batch_size": 1,
            "explorer_input": {"taskset": {"name": "t", "path": str(tmp_path / "x")}},
        },
        "data_processor": {
            "task_pipeline": {
                "inputs": [str(tmp_path / "raw.jsonl")],
                "operators": [
                    {"name": "data_juicer", "args": {"config_path": str(tmp_path / "recipe.yaml")}}
                ],
            }
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(config))
    folder, counts = run_task_pipeline(load_config(tmp_path / "job.yaml"))
    out = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    assert [r["question"] for r in out] == ["What is 3+4+5?"] and out[0]["answer"] == "12"
    assert counts["data_juicer/dropped"] == 1.0


def test_bad_recipes_fail_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="exactly one of config_path"):
        DataJuicerOperator()
    with pytest.raises(ValueError, match="no recipe at"):
        DataJuicerOperator(config_path=str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match=r"process\[0\] must be one"):
        DataJuicerOperator(process=[{"a": {}, "b": {}}])


def test_data_juicer_may_not_install_packages_while_a_job_runs():
    from data_juicer.utils.lazy_loader import LazyLoader

    from trinity.data.data_juicer import _load_data_juicer

    _load_data_juicer()
    with pytest.raises(
        ImportError, match="nothing is installed while a job runs: pip install 'some-package'"
    ):
        LazyLoader._install_package("some-package")
