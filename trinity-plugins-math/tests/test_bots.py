"""BOTS's math workflows and reference-evaluation collection (Trinity-RFT's examples/bots):
chat prompts and nested answer keys, the log each task appends, the merge of logs into the
taskset's pass-rate columns, and the round trip into the ``difficulty_based`` selector of
upstream's bots.yaml. Upstream's configs are stored unchanged in upstream_configs/."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from trinity.buffer.taskset import TasksetReader, TasksetScheduler
from trinity.config import FormatConfig, load_config
from trinity.experience import Experience
from trinity.plugins import get_component
from trinity.workflow import Task
from trinity_math import bots
from trinity_math.bots import (
    BOTSMathBoxedWorkflow,
    BOTSRefEvalCollectMathBoxedWorkflow,
    MergeError,
    merge_ref_eval,
    nested_value,
)
from trinity_math.rewards import MathBoxedRewardFn

UPSTREAM = Path(__file__).parent / "upstream_configs"
# Where upstream's configs read their taskset (a literal path, relative to where the job starts).
TRAIN = "your/data/path/containing/math__combined_54.4k.parquet"
EVAL = "your/data/path/containing/math__math_500.parquet"


def guru_rows(n: int) -> list[dict[str, Any]]:
    """Rows shaped like GURU's math parquet: a chat prompt, the answer under reward_model."""
    return [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? Put the answer in \\boxed{{}}."}],
            "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
            "data_source": "math",
        }
        for i in range(n)
    ]


class ChatModel:
    """The rollout model's stand-in: ``policy(messages, sample)`` gives each sample's reply."""

    def __init__(self, policy, model_version: int = 0) -> None:
        self.policy = policy
        self.model_version = model_version
        self.calls: list[list[dict[str, Any]]] = []
        self._lock = threading.Lock()

    def chat(self, messages, n: int = 1, **_: Any) -> list[Experience]:
        with self._lock:
            self.calls.append(messages)
        return [
            Experience(
                tokens=torch.tensor([1, 2, 3, 4]), prompt_length=2, response_text=self.policy(messages, i)
            )
            for i in range(n)
        ]

    async def chat_async(self, messages, n: int = 1, **kwargs: Any) -> list[Experience]:
        return self.chat(messages, n, **kwargs)


def question_number(messages) -> int:
    return int(messages[-1]["content"].split()[2])


def solves(numbers, of_samples: int = 4):
    """A policy that answers right for ``numbers[q]`` of ``of_samples`` samples of question q."""

    def policy(messages, i):
        q = question_number(messages)
        right = i < numbers.get(q, 0)
        return f"so \\boxed{{{2 * q if right else 2 * q + 1}}}"

    return policy


def guru_task(row: dict, workflow=BOTSRefEvalCollectMathBoxedWorkflow, repeat: int = 4, **fmt) -> Task:
    return Task(
        workflow=workflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="prompt", response_key="reward_model.ground_truth", **fmt),
        repeat_times=repeat,
    )


@pytest.fixture
def log_file(tmp_path, monkeypatch):
    path = tmp_path / "logs" / "ref_eval.jsonl"
    monkeypatch.setenv(bots.LOG_FILE_ENV, str(path))
    return path


# -- reading rows ------------------------------------------------------------------------------


def test_nested_keys():
    row = {"reward_model": {"ground_truth": "4"}, "a.b": 1}
    assert nested_value(row, "reward_model.ground_truth") == "4"
    assert nested_value(row, "a.b") == 1  # a column named with a dot
    assert nested_value(row, "reward_model.style") is None
    assert nested_value(row, "prompt") is None
    assert nested_value(None, "prompt") is None


def test_row_problems_are_named():
    fmt = FormatConfig(prompt_key="prompt", response_key="reward_model.ground_truth")
    [good] = guru_rows(1)
    assert BOTSMathBoxedWorkflow.row_problem(good, fmt) is None
    assert BOTSMathBoxedWorkflow.row_problem({**good, "prompt": "plain text"}, fmt) is None
    cases = {
        "missing prompt 'prompt'": {k: v for k, v in good.items() if k != "prompt"},
        "empty message list": {**good, "prompt": []},
        "role must be one of": {**good, "prompt": [{"role": "robot", "content": "x"}]},
        "must be a chat (list of messages) or a text, got": {**good, "prompt": 7},
        "missing answer 'reward_model.ground_truth'": {**good, "reward_model": {"style": "rule"}},
    }
    for expected, row in cases.items():
        assert expected in BOTSMathBoxedWorkflow.row_problem(row, fmt)


# -- the workflows ------------------------------------------------------------------------------


def test_chat_prompt_is_sent_as_is_and_scored_against_the_nested_truth(log_file):
    row = guru_rows(4)[3]
    model = ChatModel(solves({3: 3}))
    wf = BOTSMathBoxedWorkflow(task=guru_task(row, BOTSMathBoxedWorkflow), model=model)
    exps = wf.run()
    assert model.calls == [row["prompt"]]  # no system prompt added: the chat is the prompt
    assert [e.reward for e in exps] == [1.0, 1.0, 1.0, 0.0]
    assert isinstance(wf.reward_fn, MathBoxedRewardFn)
    assert not log_file.exists()  # only the collecting workflow writes the log


def test_a_system_prompt_beside_chat_prompts_is_reported_once(caplog, monkeypatch):
    import logging

    monkeypatch.setattr(bots, "_warned_unused_format", {})
    rows = guru_rows(2)
    model = ChatModel(solves({}))
    with caplog.at_level(logging.WARNING, logger="trinity_math.bots"):
        for row in rows:
            task = guru_task(row, BOTSMathBoxedWorkflow, system_prompt="Be brief.")
            task.taskset_name = "math-train"
            BOTSMathBoxedWorkflow(task=task, model=model).run()
    assert model.calls == [r["prompt"] for r in rows]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "taskset 'math-train': format.system_prompt not used: its prompts are chats, sent as they are"
    ]


def test_a_text_prompt_gets_the_boxed_messages():
    row = {"question": "What is 2 + 2?", "answer": {"value": "4"}}
    task = Task(
        workflow=BOTSMathBoxedWorkflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="question", response_key="answer.value"),
        repeat_times=1,
    )
    model = ChatModel(lambda m, i: "\\boxed{4}")
    [exp] = BOTSMathBoxedWorkflow(task=task, model=model).run()
    assert [m["role"] for m in model.calls[0]] == ["system", "user"] and exp.reward == 1.0
    chat = guru_task(guru_rows(1)[0], BOTSMathBoxedWorkflow)
    chat.workflow_args = {"use_base": True}
    with pytest.raises(ValueError, match="use_base needs a text prompt"):
        BOTSMathBoxedWorkflow(task=chat, model=model)


@pytest.mark.parametrize("use_async", [False, True])
def test_collecting_appends_one_line_per_task(log_file, use_async):
    import asyncio

    rows = guru_rows(3)
    model = ChatModel(solves({0: 4, 1: 1}), model_version=5)
    for row in rows:
        wf = BOTSRefEvalCollectMathBoxedWorkflow(task=guru_task(row), model=model)
        exps = asyncio.run(wf.run_async()) if use_async else wf.run()
        assert len(exps) == 4
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [line["rewards"] for line in lines] == [[1.0] * 4, [1.0, 0.0, 0.0, 0.0], [0.0] * 4]
    assert [line["question"] for line in lines] == [r["prompt"] for r in rows]
    assert [line["truth"] for line in lines] == ["0", "2", "4"]
    assert {line["model_version"] for line in lines} == {5}


def test_concurrent_runners_write_whole_lines(log_file):
    rows = guru_rows(40)
    model = ChatModel(solves({i: i % 5 for i in range(40)}))
    threads = [
        threading.Thread(
            target=lambda r=r: BOTSRefEvalCollectMathBoxedWorkflow(task=guru_task(r), model=model).run()
        )
        for r in rows
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert sorted(question_number(line["question"]) for line in lines) == list(range(40))


def test_the_log_defaults_to_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(bots.LOG_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    BOTSRefEvalCollectMathBoxedWorkflow(task=guru_task(guru_rows(1)[0]), model=ChatModel(solves({}))).run()
    assert (tmp_path / "bots_ref_eval_log.jsonl").is_file()


# -- merging logs into the taskset ----------------------------------------------------------------


def write_parquet(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def collect(data: Path, log: Path, policy, monkeypatch, fmt=None) -> None:
    """Run the collecting workflow over every usable row of the taskset at ``data``, as
    ref_eval_collect.yaml's explore job does, logging to ``log``."""
    from trinity.config import TasksetConfig

    monkeypatch.setenv(bots.LOG_FILE_ENV, str(log))
    cfg = TasksetConfig(
        name="math-train",
        path=str(data),
        format=fmt or {"prompt_key": "prompt", "response_key": "reward_model.ground_truth"},
        default_workflow_type="bots_ref_eval_collect_math_boxed_workflow",
        repeat_times=4,
    )
    reader = TasksetReader(cfg)
    model = ChatModel(policy)
    for task in reader.read_batch(len(reader)):
        task.to_workflow(model).run()


def test_merge_writes_pass_rates_and_counts_what_it_could_not_match(tmp_path, monkeypatch, capsys):
    data = tmp_path / "train.parquet"
    write_parquet(data, guru_rows(6))
    log = tmp_path / "log.jsonl"
    collect(data, log, solves({0: 4, 1: 2, 2: 1}), monkeypatch)
    # Rows 4 and 5 were not evaluated; an extra prompt and a broken line are in the log too.
    kept = [
        line for line in log.read_text().splitlines() if question_number(json.loads(line)["question"]) < 4
    ]
    other = {
        "rewards": [1.0],
        "question": [{"role": "user", "content": "What is 99 + 99? x"}],
        "truth": "198",
    }
    # A second line for row 3 pools with the first (4 rollouts at 0, 4 at 1).
    again = {"rewards": [1.0] * 4, "question": guru_rows(4)[3]["prompt"], "truth": "6", "model_version": 0}
    log.write_text("\n".join([*kept, json.dumps(other), "{not json", json.dumps(again)]) + "\n")
    assert (
        bots.main(["--data-path", str(data), "--ref-eval-path", str(log), "--ref-eval-key", "ref_pass"]) == 0
    )
    out = capsys.readouterr().out
    assert (
        "6 rows (4 evaluated, 2 not in the log: set to 0.0); 1 logged prompts match no row, 1 log lines"
        in out
    )
    import pandas as pd

    frame = pd.read_parquet(data)
    assert frame["ref_pass"].tolist() == [1.0, 0.5, 0.25, 0.5, 0.0, 0.0]
    assert frame["reward_model"].iloc[2]["ground_truth"] == "4"  # the other columns unchanged


def test_merge_into_jsonl_keeps_unreadable_lines(tmp_path, monkeypatch):
    data = tmp_path / "train.jsonl"
    rows = guru_rows(3)
    data.write_text(
        json.dumps(rows[0]) + "\n{broken\n" + json.dumps(rows[1]) + "\n\n" + json.dumps(rows[2]) + "\n"
    )
    log = tmp_path / "log.jsonl"
    collect(data, log, solves({1: 3}), monkeypatch)
    report = merge_ref_eval(str(data), str(log), "p")
    assert report == {"rows": 4, "matched": 3, "unmatched": 1, "unknown_prompts": 0, "bad_lines": 0}
    lines = data.read_text().splitlines()
    assert lines[1] == "{broken" and lines[3] == ""
    assert [json.loads(lines[i])["p"] for i in (0, 2, 4)] == [0.0, 0.75, 0.0]


def test_merge_refuses_a_log_that_matches_nothing(tmp_path, monkeypatch, capsys):
    data = tmp_path / "train.parquet"
    write_parquet(data, guru_rows(2))
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"rewards": [1.0], "question": "another dataset", "truth": "1"}) + "\n")
    with pytest.raises(MergeError, match=r"none of the 2 rows .* has a prompt \('prompt'\) found in"):
        merge_ref_eval(str(data), str(log), "p")
    assert bots.main(["--data-path", str(tmp_path), "--ref-eval-path", str(log), "--ref-eval-key", "p"]) == 1
    assert "give the taskset's .parquet or .jsonl file" in capsys.readouterr().err


# -- Trinity-RFT's configs, unchanged ----------------------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)  # their taskset paths are relative to where the job starts
    return tmp_path


def test_ref_eval_collect_config_loads_unchanged(upstream_env, monkeypatch):
    write_parquet(upstream_env / TRAIN, guru_rows(3))
    # It names sync_method nccl in mode explore: without a Ray cluster both jobs join, the job
    # syncs through checkpoints (with a warning), as upstream switches it; on one it keeps nccl.
    assert load_config(UPSTREAM / "bots_ref_eval_collect.yaml").synchronizer.sync_method == "checkpoint"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    config = load_config(UPSTREAM / "bots_ref_eval_collect.yaml")
    assert config.mode == "explore"
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is BOTSRefEvalCollectMathBoxedWorkflow
    reader = TasksetReader(taskset, config.buffer)
    assert len(reader) == 3 and not reader.skipped
    assert reader.read_batch(3)[0].repeat_times == 16


def test_ref_eval_logs_become_the_features_bots_selects_by(upstream_env, monkeypatch):
    """The round trip of upstream's BOTS example: collect a weaker and a stronger reference
    model's evaluation with ref_eval_collect's workflow, merge each log into the column
    bots.yaml names, and bots.yaml's difficulty_based selector reads them as its anchors."""
    pytest.importorskip("trinity_algos", reason="difficulty_based (BOTS) is trinity-plugins-algos'")
    from trinity_algos.selector import DifficultyBasedSelector

    rows = guru_rows(8)
    write_parquet(upstream_env / TRAIN, rows)
    write_parquet(upstream_env / EVAL, rows[:2])
    weak = {i: i % 3 for i in range(8)}  # correct samples of 4, per question
    strong = {i: min(4, 1 + i % 3 + i % 2) for i in range(8)}
    for column, right in (("qwen2.5_7b_pass_rate", weak), ("qwen3_30b_pass_rate", strong)):
        log = upstream_env / f"{column}.jsonl"
        collect(upstream_env / TRAIN, log, solves(right), monkeypatch)
        merge_ref_eval(str(upstream_env / TRAIN), str(log), column)

    config = load_config(UPSTREAM / "bots.yaml")
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is BOTSMathBoxedWorkflow
    scheduler = TasksetScheduler([taskset], config.buffer)
    selector = scheduler.readers[0].selector
    assert isinstance(selector, DifficultyBasedSelector)
    expected = [[weak[i] / 4, strong[i] / 4] for i in range(8)]
    assert selector.anchors.tolist() == expected
    # bots.yaml trains on those rows with the same workflow: the tasks it selects run.
    batch = scheduler.read_batch(2)
    exps = batch[0].to_workflow(ChatModel(solves(strong))).run()
    assert len(exps) == 16 and {e.reward for e in exps} <= {0.0, 1.0}
