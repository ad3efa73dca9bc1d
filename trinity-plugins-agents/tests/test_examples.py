"""The example configs validate, and their tasksets (generated here, or in Trinity-RFT's files'
shape) load through the core's taskset reader into tasks the workflows solve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import load_config
from trinity_agents.agents import frozen_lake_oracle, toolcall_oracle
from trinity_agents.frozen_lake import FrozenLakeWorkflow
from trinity_agents.scripted import scripted_model
from trinity_agents.tasks import main as tasks_main
from trinity_agents.toolcall import ToolCallWorkflow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TINY_MODEL_PATH", "/models/tiny")
    monkeypatch.setenv("TOOLCALL_TASKS_DIR", str(tmp_path / "toolcall"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "frozen_lake"))


@pytest.mark.parametrize(
    ("name", "workflow", "algorithm", "engine", "step_wise"),
    [
        ("toolcall.yaml", "toolcall_workflow", "grpo", "vllm", None),
        ("frozen_lake.yaml", "frozen_lake_workflow", "grpo", "vllm", None),
        ("frozen_lake_gigpo.yaml", "frozen_lake_workflow", "gigpo", "vllm", True),
        ("frozen_lake_cpu.yaml", "frozen_lake_workflow", "gigpo", "transformers", True),
    ],
)
def test_example_configs_validate(name, workflow, algorithm, engine, step_wise):
    config = load_config(EXAMPLES / name)
    [taskset] = config.buffer.explorer_input.tasksets
    assert taskset.default_workflow_type == workflow
    assert config.algorithm.algorithm_type == algorithm
    assert config.explorer.rollout_model.engine_type == engine
    assert taskset.workflow_args.get("step_wise") == step_wise
    if workflow == "frozen_lake_workflow":
        assert taskset.workflow_args["max_model_len"] == config.model.max_model_len
        args = taskset.workflow_args
        if step_wise:  # a training step holds every turn of an explore step
            per_step = config.buffer.batch_size * config.algorithm.repeat_times * args["agent_max_steps"]
            assert config.buffer.train_batch_size >= per_step


def test_header_commands_name_the_example():
    for path in EXAMPLES.glob("*.yaml"):
        commands = [line[4:] for line in path.read_text().splitlines() if re.match(r"#   \S", line)]
        assert commands and commands[-1].endswith(f"trinity run --config {path.name}"), path.name


def reader(name, tmp_path, split="train"):
    config = load_config(EXAMPLES / name)
    [taskset] = config.buffer.explorer_input.tasksets
    taskset.split = split
    return TasksetReader(taskset, config.buffer)


def test_generated_toolcall_taskset_loads_and_the_oracle_solves_it(tmp_path):
    tasks_main(["toolcall", str(tmp_path / "toolcall"), "--train", "6", "--test", "2"])
    r = reader("toolcall.yaml", tmp_path)
    assert len(r) == 6 and not r.skipped
    for task in r.read_batch(6):
        assert task.workflow is ToolCallWorkflow and task.repeat_times == 8
        exps = ToolCallWorkflow(
            task=task, model=scripted_model(toolcall_oracle(task.raw_task["answer"]))
        ).run()
        assert [e.reward for e in exps] == [1.0] * 8


def test_generated_frozen_lake_taskset_loads_and_the_oracle_solves_it(tmp_path):
    tasks_main(
        ["frozen_lake", str(tmp_path / "frozen_lake"), "--train", "4", "--test", "2", "--map-max-size", "5"]
    )
    r = reader("frozen_lake_gigpo.yaml", tmp_path, split="test")
    assert len(r) == 2 and not r.skipped
    for task in r.read_batch(2):
        assert task.workflow is FrozenLakeWorkflow
        exps = FrozenLakeWorkflow(task=task, model=scripted_model(frozen_lake_oracle)).run()
        assert [e.eid.step for e in exps] == list(range(len(exps))) and exps[-1].reward == 1.0


def test_trinity_rft_shaped_files_load(tmp_path):
    """Rows as Trinity-RFT's data scripts write them: FrozenLake as parquet with numpy ints,
    ToolACE as a JSON array with ``tools`` / ``answer`` JSON text."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    import numpy as np

    (tmp_path / "frozen_lake").mkdir()
    frame = pd.DataFrame(
        {
            "seed": np.array([17, 23]),
            "size": np.array([3, 4]),
            "p": [0.7, 0.8],
            "index": [0, 1],
            "uid": ["17_3_0.7", "23_4_0.8"],
        }
    )
    frame.to_parquet(tmp_path / "frozen_lake" / "train.parquet")
    r = reader("frozen_lake.yaml", tmp_path)
    assert len(r) == 2 and not r.skipped
    for task in r.read_batch(2):
        [exp] = FrozenLakeWorkflow(task=task, model=scripted_model(frozen_lake_oracle)).run()
        assert exp.reward == 1.0

    (tmp_path / "toolcall").mkdir()
    row = {
        "tools": json.dumps(
            [
                {
                    "name": "ping",
                    "description": "Ping a host.",
                    "parameters": {"type": "dict", "properties": {"host": {"type": "string"}}},
                }
            ]
        ),
        "conversations": [{"from": "user", "value": "ping example.org"}],
        "answer": json.dumps([{"name": "ping", "arguments": {"host": "example.org"}}]),
        "raw_system": "You can call functions.\n",
    }
    (tmp_path / "toolcall" / "train.json").write_text(json.dumps([row, row], indent=4))
    r = reader("toolcall.yaml", tmp_path)
    assert len(r) == 2 and not r.skipped
    [task, _] = r.read_batch(2)
    exps = ToolCallWorkflow(task=task, model=scripted_model(toolcall_oracle(row["answer"]))).run()
    assert [e.reward for e in exps] == [1.0] * task.repeat_times
