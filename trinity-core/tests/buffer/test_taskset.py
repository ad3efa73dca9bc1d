"""Taskset readers: formats, per-row overrides, selectors, epochs, resume, and bad data."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trinity import hookimpl
from trinity.buffer.base import BufferExhausted
from trinity.buffer.taskset import TasksetError, TasksetReader, TasksetScheduler
from trinity.config import BufferConfig, TasksetConfig
from trinity.workflow import RewardFn, Workflow


class EchoWorkflow(Workflow):
    def run(self):
        return []


class OtherWorkflow(EchoWorkflow):
    pass


class EnvWorkflow(EchoWorkflow):
    """Reads its own columns (an environment seed), like FrozenLake or ALFWorld workflows."""

    @classmethod
    def row_problem(cls, row, format_args):
        if not isinstance(row.get("seed"), int):
            return f"an environment row needs an integer 'seed', got {row.get('seed')!r}"
        if row["seed"] < 0:
            raise ValueError("negative seeds are not allowed")
        return None


class ExactReward(RewardFn):
    def __call__(self, response, truth=None, **kw):
        return {"exact": float(response == truth)}


class FakePlugin:
    @hookimpl
    def register_workflows(self, register):
        register("echo", EchoWorkflow)
        register("other", OtherWorkflow)
        register("env", EnvWorkflow)

    @hookimpl
    def register_reward_fns(self, register):
        register("exact", ExactReward)


@pytest.fixture(autouse=True)
def components(register_plugin):
    register_plugin(FakePlugin(), "fake-buffer-components")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def qa(n: int, start: int = 0) -> list[dict]:
    return [{"question": f"q{i}", "answer": str(i)} for i in range(start, start + n)]


def make_config(path: Path | str, **kw) -> TasksetConfig:
    fmt = kw.pop("format", {})
    return TasksetConfig(
        name=kw.pop("name", "math"),
        path=str(path),
        format={"prompt_key": "question", "response_key": "answer", **fmt},
        default_workflow_type=kw.pop("default_workflow_type", "echo"),
        default_reward_fn_type=kw.pop("default_reward_fn_type", "exact"),
        **kw,
    )


def prompts(tasks) -> list[str]:
    return [t.task_desc for t in tasks]


def test_jsonl_rows_become_tasks(tmp_path):
    cfg = make_config(
        write_jsonl(tmp_path / "t.jsonl", qa(3)),
        workflow_args={"k": 1},
        reward_fn_args={"r": 2},
        repeat_times=4,
        rollout_args={"temperature": 0.7},
    )
    tasks = TasksetReader(cfg).read_batch(2)
    t = tasks[1]
    assert (t.workflow, t.reward_fn) == (EchoWorkflow, ExactReward)
    assert (t.task_desc, t.truth, t.index, t.taskset_name) == ("q1", "1", 1, "math")
    assert (t.workflow_args, t.reward_fn_args, t.repeat_times) == ({"k": 1}, {"r": 2}, 4)
    assert t.rollout_args.temperature == 0.7


def test_json_list_parquet_and_hf_folder(tmp_path):
    import datasets

    (tmp_path / "list.json").write_text(json.dumps(qa(2)))
    assert prompts(TasksetReader(make_config(tmp_path / "list.json")).read_batch(5)) == ["q0", "q1"]
    datasets.Dataset.from_list(qa(3)).to_parquet(str(tmp_path / "t.parquet"))
    assert prompts(TasksetReader(make_config(tmp_path / "t.parquet")).read_batch(5)) == ["q0", "q1", "q2"]
    folder = tmp_path / "hf"
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(qa(2)).to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(qa(1, start=10)).to_parquet(
        str(folder / "data" / "test-00000-of-00001.parquet")
    )
    assert prompts(TasksetReader(make_config(folder, split="test")).read_batch(5)) == ["q10"]
    plain = tmp_path / "plain"
    plain.mkdir()
    write_jsonl(plain / "train.jsonl", qa(2))
    assert prompts(TasksetReader(make_config(plain)).read_batch(5)) == ["q0", "q1"]


def test_per_row_workflow_and_reward_override_defaults(tmp_path):
    rows = [{"question": "a", "wf": "other"}, {"question": "b"}]
    cfg = make_config(write_jsonl(tmp_path / "t.jsonl", rows), format={"workflow_key": "wf"})
    a, b = TasksetReader(cfg).read_batch(2)
    assert (a.workflow, b.workflow) == (OtherWorkflow, EchoWorkflow)


def test_buffer_level_defaults_apply_when_taskset_sets_none(tmp_path):
    cfg = make_config(
        write_jsonl(tmp_path / "t.jsonl", qa(1)), default_workflow_type=None, default_reward_fn_type=None
    )
    task = TasksetReader(
        cfg, BufferConfig(default_workflow_type="other", default_reward_fn_type="exact")
    ).read_batch()[0]
    assert (task.workflow, task.reward_fn) == (OtherWorkflow, ExactReward)


def test_sequential_epochs_then_exhausted(tmp_path):
    reader = TasksetReader(make_config(write_jsonl(tmp_path / "t.jsonl", qa(3)), total_epochs=2))
    batches = [prompts(reader.read_batch(2)) for _ in range(3)]
    assert batches == [["q0", "q1"], ["q2", "q0"], ["q1", "q2"]]
    with pytest.raises(BufferExhausted, match="2 epoch"):
        reader.read_batch(2)


def test_total_steps_overrides_epochs(tmp_path):
    reader = TasksetReader(
        make_config(write_jsonl(tmp_path / "t.jsonl", qa(2)), total_epochs=1, total_steps=3)
    )
    assert [prompts(reader.read_batch(2)) for _ in range(3)] == [["q0", "q1"]] * 3
    with pytest.raises(BufferExhausted, match="total_steps"):
        reader.read_batch(2)


def test_shuffle_is_seeded_per_epoch_and_covers_every_row(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", qa(10))

    def order(seed: int) -> list[str]:
        cfg = make_config(path, total_epochs=2, data_selector={"selector_type": "shuffle", "seed": seed})
        return prompts(TasksetReader(cfg).read_batch(20))

    a, b, c = order(1), order(1), order(2)
    assert a == b and a != c
    assert sorted(a[:10]) == sorted(a[10:]) == sorted(f"q{i}" for i in range(10))
    assert a[:10] != a[10:], "each epoch gets its own permutation"


def test_random_selector_draws_with_replacement_deterministically(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", qa(5))
    cfg = make_config(path, total_epochs=4, data_selector={"selector_type": "random", "seed": 3})
    first, second = (prompts(TasksetReader(cfg).read_batch(20)) for _ in range(2))
    assert first == second
    assert len(set(first)) < 5 or sorted(first) != sorted(f"q{i}" for i in range(5)) * 4


def test_state_dict_resumes_the_exact_order(tmp_path):
    cfg = make_config(
        write_jsonl(tmp_path / "t.jsonl", qa(7)), total_epochs=3, data_selector={"selector_type": "shuffle"}
    )
    reader = TasksetReader(cfg)
    reader.read_batch(5)
    state = reader.state_dict()
    rest = [prompts(reader.read_batch(4)) for _ in range(3)]
    resumed = TasksetReader(cfg)
    resumed.load_state_dict(state)
    assert [prompts(resumed.read_batch(4)) for _ in range(3)] == rest


def test_eval_taskset_is_read_once_in_order(tmp_path):
    cfg = make_config(
        write_jsonl(tmp_path / "t.jsonl", qa(3)),
        is_eval=True,
        total_epochs=5,
        data_selector={"selector_type": "shuffle"},
    )
    reader = TasksetReader(cfg)
    assert prompts(reader.read_batch(10)) == ["q0", "q1", "q2"]
    with pytest.raises(BufferExhausted):
        reader.read_batch(10)


def test_scheduler_interleaves_tasksets_and_resumes(tmp_path):
    a = make_config(write_jsonl(tmp_path / "a.jsonl", qa(3)), name="a")
    b = make_config(write_jsonl(tmp_path / "b.jsonl", qa(1, start=100)), name="b")
    sched = TasksetScheduler([a, b])
    first = sched.read_batch(3)
    assert [(t.taskset_name, t.task_desc) for t in first] == [("a", "q0"), ("b", "q100"), ("a", "q1")]
    state = sched.state_dict()
    assert prompts(sched.read_batch(3)) == ["q2"]
    again = TasksetScheduler([a, b])
    again.load_state_dict(state)
    assert prompts(again.read_batch(3)) == ["q2"]
    with pytest.raises(BufferExhausted):
        again.read_batch(3)
    with pytest.raises(TasksetError, match="unique"):
        TasksetScheduler([a, a])


# -- bad data --------------------------------------------------------------------------------

BAD_ROWS = {
    "invalid JSON": '{"question": "broken',
    "row must be a JSON object": "[1, 2]",
    "missing prompt key": {"prompt": "wrong key"},
    "must be a string, got int": {"question": 42},
    "prompt 'question' is empty": {"question": "   "},
    "must be a string, got null": {"question": None},
    "response 'answer' must be a string or number": {"question": "q", "answer": {"x": 1}},
    "must be a list of messages": {"message": "not a list"},
    "role must be one of": {"message": [{"role": "robot", "content": "hi"}]},
    "empty message list": {"message": []},
    "tools 'tools' must be a list of objects": {"question": "q", "tools": "grep"},
    "Unknown workflow 'nope'": {"question": "q", "wf": "nope"},
    "workflow name 'wf' must be a string": {"question": "q", "wf": 3},
    "system prompt 'sys' must be a string": {"question": "q", "sys": ["x"]},
}


def test_each_kind_of_bad_row_is_skipped_counted_and_logged(tmp_path, caplog):
    # More good rows than bad: a taskset that is mostly bad rows stops at construction instead.
    good = qa(len(BAD_ROWS) + 1)
    rows = [*good, *BAD_ROWS.values()]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    cfg = make_config(path, format={"workflow_key": "wf", "system_prompt_key": "sys"})
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.taskset"):
        reader = TasksetReader(cfg)
    assert len(reader) == len(good)
    metrics = reader.metrics()
    assert metrics["buffer/math/skipped_rows"] == len(BAD_ROWS)
    assert metrics["buffer/math/rows"] == len(good)
    log = caplog.text
    for lineno, expected in enumerate(BAD_ROWS, start=len(good) + 1):
        assert f"{path}:{lineno}: " in log, f"row {lineno} not logged"
        line = next(entry for entry in log.splitlines() if f"{path}:{lineno}: " in entry)
        assert expected in line, (expected, line)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: make_config(p / "missing.jsonl"), "taskset 'math': .*missing.jsonl does not exist"),
        (
            lambda p: make_config(p / "t.jsonl", default_workflow_type="nope"),
            "taskset 'math': default_workflow_type: Unknown workflow 'nope'",
        ),
        (lambda p: make_config(p / "t.jsonl", default_reward_fn_type="exakt"), "Did you mean 'exact'"),
        (lambda p: make_config(p / "t.jsonl", default_workflow_type=None), "taskset 'math': no workflow"),
        (lambda p: make_config(p / "empty.jsonl"), "taskset 'math': .*holds no rows"),
        (lambda p: make_config(p / "bad.jsonl"), "none of the 2 rows .* is usable"),
        (lambda p: make_config(p / "t.txt"), "unsupported file type"),
        (lambda p: make_config(p, split="validation"), "no split 'validation'|cannot load"),
        (lambda p: make_config(p / "obj.json"), "exactly one list"),
    ],
)
def test_unusable_tasksets_fail_at_construction_naming_the_taskset(tmp_path, setup, message):
    write_jsonl(tmp_path / "t.jsonl", qa(2))
    (tmp_path / "empty.jsonl").write_text("")
    write_jsonl(tmp_path / "bad.jsonl", [{"x": 1}, "nonsense{"])
    (tmp_path / "t.txt").write_text("q0\n")
    (tmp_path / "obj.json").write_text(json.dumps({"a": [], "b": []}))
    with pytest.raises(TasksetError, match=message):
        TasksetReader(setup(tmp_path))


# -- hostile rows: one row must never stop the job ----------------------------------------------

DEEP_LIST = "[" * 200_000 + "]" * 200_000
DEEP_OBJECT = '{"a":' * 200_000 + "1" + "}" * 200_000
HUGE_INT = "1234567890" * 500  # 5000 digits: over Python's int <-> str limit (4300)


def write_lines(path: Path, lines: list) -> Path:
    """Write raw jsonl lines: ``bytes`` as they are, ``str`` as UTF-8, anything else as JSON."""
    out = b""
    for line in lines:
        if isinstance(line, dict):
            line = json.dumps(line, ensure_ascii=False)
        out += (line if isinstance(line, bytes) else line.encode()) + b"\n"
    path.write_bytes(out)
    return path


def load_logged(cfg: TasksetConfig, caplog) -> TasksetReader:
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.taskset"):
        return TasksetReader(cfg)


def skip_line(caplog, where: str) -> str:
    """The log line that skips the row at ``where`` (``file:line``)."""
    return next(line for line in caplog.text.splitlines() if f"{where}: " in line)


def test_deeply_nested_rows_are_skipped_and_counted(tmp_path, caplog):
    deep_prompt = '{"question": ' + DEEP_LIST + ', "answer": "1"}'
    # Deep enough for some later repr()/deepcopy() to hit the recursion limit, too shallow for json.
    nested_meta = '{"question": "q", "meta": ' + "[" * 300 + "]" * 300 + "}"
    path = write_lines(
        tmp_path / "t.jsonl", [*qa(4), DEEP_LIST, DEEP_OBJECT, deep_prompt, nested_meta, *qa(1, 4)]
    )
    reader = load_logged(make_config(path), caplog)
    assert prompts(reader.read_batch(10)) == ["q0", "q1", "q2", "q3", "q4"]
    metrics = reader.metrics()
    assert metrics["buffer/math/skipped_rows"] == 4
    assert metrics["buffer/math/skipped/nested too deeply"] == 4
    for lineno in (5, 6, 7, 8):
        assert "nested too deeply" in skip_line(caplog, f"{path}:{lineno}")


@pytest.mark.parametrize(
    "row",
    [
        '{"question": "x", "answer": ' + HUGE_INT + "}",
        '{"question": ' + HUGE_INT + ', "answer": "1"}',
        '{"message": [{"role": "user", "content": ' + HUGE_INT + "}]}",
    ],
    ids=["answer", "prompt", "message-content"],
)
def test_huge_integer_row_is_skipped_and_counted(tmp_path, caplog, row):
    path = write_lines(tmp_path / "t.jsonl", [*qa(2), row, *qa(1, 2)])
    reader = load_logged(make_config(path), caplog)
    assert prompts(reader.read_batch(10)) == ["q0", "q1", "q2"]
    assert reader.metrics()["buffer/math/skipped/integer too long"] == 1
    assert "integer too long (more than 4300 digits" in skip_line(caplog, f"{path}:3")


def test_invalid_utf8_line_is_skipped_and_neighbours_are_read(tmp_path, caplog):
    bad = b'{"question": "caf\xe9", "answer": "1"}'  # Latin-1 bytes in a UTF-8 file
    path = write_lines(
        tmp_path / "t.jsonl", [qa(1)[0], bad, {"question": "café ☕", "answer": "2"}, *qa(1, 5)]
    )
    reader = load_logged(make_config(path), caplog)
    assert prompts(reader.read_batch(10)) == ["q0", "café ☕", "q5"]
    metrics = reader.metrics()
    assert metrics["buffer/math/skipped_rows"] == 1
    assert metrics["buffer/math/skipped/invalid UTF-8"] == 1
    assert "invalid UTF-8 (byte 0xe9 at column 18)" in skip_line(caplog, f"{path}:2")


def _json_list(elements: list) -> bytes:
    """A pretty-printed JSON list, one element per line; ``bytes``/``str`` elements go in raw."""
    parts = [
        e if isinstance(e, bytes) else (e if isinstance(e, str) else json.dumps(e)).encode() for e in elements
    ]
    return b"[\n  " + b",\n  ".join(parts) + b"\n]\n"


@pytest.mark.parametrize("wrapped", [False, True], ids=["list", "object-with-list"])
def test_json_list_file_skips_its_bad_elements(tmp_path, caplog, wrapped):
    elements = [
        *qa(3),
        '{"question": "x", "answer": ' + HUGE_INT + "}",
        DEEP_LIST,
        b'{"question": "caf\xe9"}',
        '{"question": broken}',
        *qa(2, 3),
        {"question": 'a, [b] {c} "d" \\', "answer": "]"},  # brackets, commas, quotes in strings
    ]
    data = _json_list(elements)
    if wrapped:
        data = b'{"meta": "v1", "data": ' + data + b"}"
    path = tmp_path / "t.json"
    path.write_bytes(data)
    reader = load_logged(make_config(path), caplog)
    tasks = reader.read_batch(10)
    assert prompts(tasks) == ["q0", "q1", "q2", "q3", "q4", 'a, [b] {c} "d" \\']
    assert [t.index for t in tasks] == [0, 1, 2, 7, 8, 9]
    metrics = reader.metrics()
    assert metrics["buffer/math/skipped_rows"] == 4
    for reason in ("integer too long", "nested too deeply", "invalid UTF-8", "invalid JSON"):
        assert metrics[f"buffer/math/skipped/{reason}"] == 1, reason
    # Rows of a JSON list are numbered by element; the detail names the line in the file.
    assert "invalid UTF-8 (byte 0xe9 at line 7 column 20)" in skip_line(caplog, f"{path}:6")
    assert "invalid JSON (Expecting value at line 8 column 16)" in skip_line(caplog, f"{path}:7")


def test_valid_utf8_json_list_with_one_huge_integer_keeps_the_rest(tmp_path, caplog):
    path = tmp_path / "t.json"
    path.write_bytes(_json_list([*qa(2), '{"question": "x", "answer": ' + HUGE_INT + "}", *qa(1, 2)]))
    reader = load_logged(make_config(path), caplog)
    assert prompts(reader.read_batch(10)) == ["q0", "q1", "q2"]
    assert reader.metrics()["buffer/math/skipped/integer too long"] == 1
    assert "integer too long" in skip_line(caplog, f"{path}:3")


def test_majority_of_bad_rows_stops_the_taskset_with_one_line(tmp_path):
    rows = [*qa(2), {"prompt": "a"}, {"prompt": "b"}, "nonsense{", {"question": " "}]
    path = write_lines(tmp_path / "t.jsonl", rows)
    with pytest.raises(TasksetError) as info:
        TasksetReader(make_config(path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("taskset 'math': ")
    assert "4 of 6 rows are unusable" in message and str(path) in message
    assert "2x missing prompt key 'question'" in message
    assert "1x invalid JSON" in message and "1x prompt 'question' is empty" in message
    assert f"first bad row {path}:3" in message
    assert "format.prompt_key" in message and "response_key" in message


def test_minority_of_bad_rows_loads_and_counts_them(tmp_path, caplog):
    # Exactly half unusable still loads: the taskset stops only when *more* than half are bad.
    rows = [*qa(3), DEEP_LIST, b"\xff\xfe", '{"question": ' + HUGE_INT + "}"]
    reader = load_logged(make_config(write_lines(tmp_path / "t.jsonl", rows)), caplog)
    assert len(reader) == 3
    metrics = reader.metrics()
    assert metrics["buffer/math/rows"] == 3
    assert metrics["buffer/math/skipped_rows"] == 3
    assert "skipped 3 of 6 rows" in caplog.text


def test_a_workflow_checks_its_own_rows(tmp_path, caplog):
    # No prompt column: the default check would refuse every row; the workflow's own accepts
    # them, and skips (counted, logged) the rows it cannot run, including one its check raised on.
    rows = [{"seed": 1}, {"seed": "two"}, {"seed": 3, "size": 4}, {"seed": -1}, {"seed": 5}]
    cfg = make_config(write_jsonl(tmp_path / "env.jsonl", rows), default_workflow_type="env")
    reader = load_logged(cfg, caplog)
    tasks = reader.read_batch(10)
    assert [t.raw_task["seed"] for t in tasks] == [1, 3, 5]
    assert all(t.workflow is EnvWorkflow for t in tasks)
    metrics = reader.metrics()
    assert metrics["buffer/math/skipped_rows"] == 2
    assert "an environment row needs an integer 'seed', got 'two'" in skip_line(
        caplog, f"{tmp_path / 'env.jsonl'}:2"
    )
    assert "ValueError: negative seeds are not allowed" in skip_line(caplog, f"{tmp_path / 'env.jsonl'}:4")


def test_the_row_check_follows_each_rows_workflow(tmp_path):
    # A per-row workflow column picks the check: prompt rows for echo, seed rows for env.
    rows = [{"question": "q0", "wf": "echo"}, {"seed": 7, "wf": "env"}, {"seed": 8, "wf": "echo"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    reader = TasksetReader(make_config(path, format={"workflow_key": "wf"}))
    tasks = reader.read_batch(10)
    assert [(t.workflow, t.raw_task.get("seed")) for t in tasks] == [(EchoWorkflow, None), (EnvWorkflow, 7)]
    assert reader.metrics()["buffer/math/skipped/missing prompt key 'question'"] == 1
