"""Trinity-RFT's grpo_toolcall and grpo_frozen_lake configs, unchanged, load here and their
tasksets (rows in Trinity-RFT's shapes: no prompt column, ``tools`` / ``answer`` as JSON text)
are read by the core's taskset reader into tasks the workflows solve. The configs are byte-for-byte
copies (see upstream_configs/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import load_config
from trinity_agents.agents import frozen_lake_oracle, toolcall_oracle
from trinity_agents.frozen_lake import FrozenLakeWorkflow
from trinity_agents.scripted import scripted_model
from trinity_agents.tasks import main as tasks_main
from trinity_agents.toolcall import ToolCallWorkflow

UPSTREAM = Path(__file__).parent / "upstream_configs"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "frozen_lake"))


def test_grpo_toolcall_config_reads_toolace_rows(tmp_path, monkeypatch):
    # Its taskset path is the relative literal examples/grpo_toolcall/toolace_data.
    monkeypatch.chdir(tmp_path)
    tasks_main(["toolcall", "examples/grpo_toolcall/toolace_data", "--train", "6", "--test", "2"])
    config = load_config(UPSTREAM / "grpo_toolcall_toolace.yaml")
    [taskset] = config.buffer.explorer_input.tasksets
    reader = TasksetReader(taskset, config.buffer)
    assert len(reader) == 6 and not reader.skipped
    tasks = reader.read_batch(6)
    assert all(isinstance(t.raw_task["tools"], str) and "prompt" not in t.raw_task for t in tasks)
    for task in tasks[:2]:
        assert task.workflow is ToolCallWorkflow and task.repeat_times == 8
        exps = ToolCallWorkflow(
            task=task, model=scripted_model(toolcall_oracle(task.raw_task["answer"]))
        ).run()
        assert [e.reward for e in exps] == [1.0] * 8


def test_grpo_frozen_lake_config_reads_its_train_and_eval_splits(tmp_path):
    tasks_main(
        ["frozen_lake", str(tmp_path / "frozen_lake"), "--train", "4", "--test", "3", "--map-max-size", "4"]
    )
    config = load_config(UPSTREAM / "grpo_frozen_lake.yaml")
    inputs = config.buffer.explorer_input
    # Both tasksets are named "frozenlake" in Trinity-RFT's file.
    assert [t.name for t in inputs.tasksets] == [t.name for t in inputs.eval_tasksets] == ["frozenlake"]
    train = TasksetReader(inputs.tasksets[0], config.buffer)
    evals = TasksetReader(inputs.eval_tasksets[0], config.buffer)
    assert (len(train), len(evals)) == (4, 3) and not train.skipped and not evals.skipped
    for task in evals.read_batch(3):
        assert task.workflow is FrozenLakeWorkflow and task.repeat_times == 4
        [exp] = FrozenLakeWorkflow(task=task, model=scripted_model(frozen_lake_oracle)).run()
        assert exp.reward == 1.0


def test_rows_the_workflows_cannot_run_are_counted_skips(tmp_path, monkeypatch):
    data = tmp_path / "frozen_lake"
    data.mkdir()
    rows = [
        {"seed": 1, "size": 3, "p": 0.8},
        {"seed": "x", "size": 3},
        {"seed": 2, "size": 1},
        {"seed": 3, "size": 4, "p": 0.8},
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(UPSTREAM / "grpo_frozen_lake.yaml")
    reader = TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer)
    assert [t.raw_task["seed"] for t in reader.read_batch(4)] == [1, 3]
    reasons = " | ".join(reader.skipped)
    assert (
        "seed, size and p must be numbers" in reasons
        and reader.metrics()["buffer/frozenlake/skipped_rows"] == 2
    )
    assert "size must be at least 2" in reasons

    toolace = tmp_path / "examples" / "grpo_toolcall" / "toolace_data"
    toolace.mkdir(parents=True)
    good = {
        "tools": json.dumps([{"name": "ping", "parameters": {}}]),
        "conversations": [{"from": "user", "value": "ping"}],
        "answer": json.dumps([{"name": "ping", "arguments": {}}]),
    }
    bad = [
        {**good, "answer": None},
        {**good, "tools": "{not json"},
        {**good, "conversations": [{"from": "robot"}]},
    ]
    (toolace / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [good, *bad, good, good, good])
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(UPSTREAM / "grpo_toolcall_toolace.yaml")
    reader = TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer)
    assert len(reader) == 4 and sum(reader.skipped.values()) == 3
    reasons = " | ".join(reader.skipped)
    for fragment in ("no 'answer' column", "tools is not valid JSON", "unknown 'from'"):
        assert fragment in reasons, reasons
