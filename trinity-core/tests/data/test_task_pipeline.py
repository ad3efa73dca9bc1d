"""The task pipeline: built-in task operators, reading inputs, the cached output and its reuse,
worker processes, and the LLM difficulty filter against a stub OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.data.operator import OperatorContext
from trinity.data.task_ops import TASK_OPERATORS
from trinity.data.tasks import apply_task_pipeline, run_task_pipeline
from trinity.testing import check_component


def _rows(n: int) -> list[dict]:
    # Rows i and i + n/2 ask the same question; even rows ask a short one ("q4"), odd a long one.
    return [
        {"question": f"{'long ' * (i % 2)}q{i % (n // 2)}", "answer": str(i), "extra": i} for i in range(n)
    ]


def _config(tmp_path: Path, operators: list[dict], **pipeline) -> object:
    data = tmp_path / "raw.jsonl"
    tmp_path.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        data.write_text("".join(json.dumps(r) + "\n" for r in _rows(20)) + "not json\n")
    text = {
        "project": "p",
        "name": "tp",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model"), "max_model_len": 64},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {
                "taskset": {"name": "t", "path": str(tmp_path / "out_should_be_replaced"), "split": "train"}
            },
        },
        "data_processor": {
            "task_pipeline": {
                "operators": operators,
                "inputs": [str(data)],
                "target_fields": ["question", "answer"],
                **pipeline,
            }
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(text))
    return load_config(tmp_path / "job.yaml")


@pytest.mark.parametrize("name", ["length_filter", "deduplicator"])
def test_builtin_task_operators_conform(name):
    check_component("operator", TASK_OPERATORS[name])


def test_length_filter_and_deduplicator(tmp_path):
    config = _config(
        tmp_path,
        [
            {"name": "length_filter", "args": {"text_keys": ["question"], "min_len": 3, "max_len": 12}},
            {"name": "deduplicator", "args": {"text_keys": "question"}},
        ],
    )
    folder, counts = run_task_pipeline(config)
    rows = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    assert all(set(r) == {"question", "answer"} for r in rows), "only target_fields are kept"
    assert all(3 <= len(r["question"]) <= 12 for r in rows)
    assert len({r["question"].lower() for r in rows}) == len(rows)
    assert counts["input_rows"] == 21 and counts["skipped_rows"] == 1
    assert counts["length_filter/too_short"] == counts["length_filter/dropped"] == 10  # the "q4" rows
    assert counts["deduplicator/dropped"] == 5 and counts["output_rows"] == len(rows) == 5


def test_the_output_is_reused_until_inputs_or_operators_change(tmp_path, monkeypatch):
    ops = [{"name": "length_filter", "args": {"min_len": 3}}]
    config = _config(tmp_path, ops)
    folder, first = run_task_pipeline(config)
    calls = []
    real = TASK_OPERATORS["length_filter"].process
    monkeypatch.setattr(
        TASK_OPERATORS["length_filter"], "process", lambda self, rows: calls.append(1) or real(self, rows)
    )
    assert run_task_pipeline(config) == (folder, first) and calls == [], "unchanged pipeline recomputed"
    changed = _config(tmp_path, [{"name": "length_filter", "args": {"min_len": 4}}])
    run_task_pipeline(changed)
    assert calls, "changed operator args must recompute"


def test_apply_points_the_explorer_taskset_at_the_output(tmp_path, capsys):
    config = _config(tmp_path, [{"name": "deduplicator"}])
    applied = apply_task_pipeline(config)
    [taskset] = applied.buffer.explorer_input.tasksets
    assert taskset.path == str(tmp_path / "ckpt" / "p" / "tp" / "task_pipeline")
    assert "[trinity] task pipeline: 21 rows -> 10 tasks" in capsys.readouterr().out
    assert config.buffer.explorer_input.tasksets[0].path.endswith("out_should_be_replaced")


def test_worker_processes_give_the_same_rows(tmp_path):
    ops = [{"name": "length_filter", "args": {"min_len": 3}}]
    one, _ = run_task_pipeline(_config(tmp_path / "a", ops, num_process=1))
    many_config = _config(tmp_path / "b", ops, num_process=2)
    TASK_OPERATORS["length_filter"].batch_size = 3  # several batches, spread over 2 processes
    try:
        many, _ = run_task_pipeline(many_config)
    finally:
        TASK_OPERATORS["length_filter"].batch_size = 256
    assert (Path(one) / "train.jsonl").read_text() == (Path(many) / "train.jsonl").read_text()


def test_an_operator_of_the_wrong_contract_is_named_at_load(tmp_path):
    from trinity.config.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"operators\[0\]: operator 'reward_filter' is an experience operator"
    ):
        _config(tmp_path, [{"name": "reward_filter"}])


class _Scorer(BaseHTTPRequestHandler):
    """A stub OpenAI server: difficulty = (number in the question) / 10; 'q3' gets no number."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        number = int(prompt.split("Question: ")[1].split("\n")[0].split("q")[-1])
        content = "no idea" if number == 3 else json.dumps({"difficulty": number / 10})
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def scorer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scorer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_llm_difficulty_score_filter_keeps_a_score_range(tmp_path, scorer, monkeypatch):
    pytest.importorskip("openai", reason="the filter talks to the scoring model with the openai client")
    monkeypatch.setenv("OPENAI_BASE_URL", scorer)
    op = {
        "name": "llm_difficulty_score_filter",
        "args": {
            "api_or_hf_model": "scorer",
            "min_score": 0.2,
            "max_score": 0.6,
            "input_keys": ["question", "answer"],
            "field_names": ["Question", "Answer"],
        },
    }
    folder, counts = run_task_pipeline(_config(tmp_path, [op]))
    rows = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    numbers = sorted({int(r["question"].split("q")[-1]) for r in rows})
    assert numbers == [2, 4, 5, 6], "scores 0.2..0.6 kept; q3 (no score) dropped"
    assert all(r["difficulty_score"] == int(r["question"].split("q")[-1]) / 10 for r in rows)
    assert counts["llm_difficulty_score_filter/unscored"] == 2.0  # q3 appears twice in 20 rows


def test_llm_difficulty_score_filter_needs_a_model_and_an_address(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    cls = TASK_OPERATORS["llm_difficulty_score_filter"]
    with pytest.raises(ValueError, match="needs api_or_hf_model"):
        cls()
    op = cls(api_or_hf_model="m")  # the address is resolved when the job binds it
    with pytest.raises(
        ValueError, match=r"'m' is not one of explorer.auxiliary_models .* args.base_url or \$OPENAI_BASE_URL"
    ):
        op.bind(OperatorContext())
    op.bind(OperatorContext(model_url={"m": "http://127.0.0.1:9/v1"}.get))  # served by the job
    assert op.base_url == "http://127.0.0.1:9/v1"


def test_priority_weights_order_the_tasks_before_top_k(tmp_path, caplog):
    rows = [
        # difficulty from the LLM filter's difficulty_score; quality from Data-Juicer stats.
        {"question": "q0", "difficulty_score": 0.2, "__dj__stats__": {"word_rep_ratio": 0.0}},
        {"question": "q1", "difficulty_score": 0.9, "__dj__stats__": {"word_rep_ratio": 0.8}},
        {"question": "q2", "difficulty_score": 0.6, "__dj__stats__": {"word_rep_ratio": 0.1}},
        {"question": "q3"},  # no stats: neutral 0.5 on both
    ]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keep_all = [{"name": "length_filter", "args": {"min_len": 0}}]
    weights = {"difficulty": 1.0, "quality": 0.5}
    config = _config(tmp_path, keep_all, target_fields=[], priority_weights=weights, top_k=3)
    folder, counts = run_task_pipeline(config)
    out = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    # priority = difficulty + 0.5 * (1 - word_rep_ratio): q2 1.05, q1 1.0, q3 0.75, q0 0.7
    assert [r["question"] for r in out] == ["q2", "q1", "q3"]
    assert [r["priority"] for r in out] == pytest.approx([1.05, 1.0, 0.75])
    assert counts["priority/rows_with_difficulty"] == 3.0 and counts["priority/rows_with_quality"] == 3.0
    # A weighted score no row has a stat for adds nothing, and says so once.
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps({"question": f"q{i}"}) + "\n" for i in range(3)))
    config = _config(
        tmp_path / "again",
        keep_all,
        inputs=[str(tmp_path / "raw.jsonl")],
        target_fields=[],
        priority_weights={"quality": 1.0},
    )
    with caplog.at_level("WARNING", logger="trinity.data.priority"):
        folder, _ = run_task_pipeline(config)
    assert "priority_weights.quality has no effect: no row has a quality stat" in caplog.text
    out = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    assert [r["question"] for r in out] == ["q0", "q1", "q2"], "equal priorities keep their order"


def test_an_unknown_priority_weight_fails_at_load(tmp_path):
    from trinity.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"priority_weights: no score 'diversity'"):
        _config(tmp_path, [{"name": "deduplicator"}], priority_weights={"diversity": 0.8})
