"""``mode: serve``: the feedback ledger's rules, the feedback routes over HTTP with the real
OpenAI client and an SQL buffer, and weights picked up between requests."""

from __future__ import annotations

import json
import sqlite3
import threading
import urllib.error
import urllib.request

import pytest
import torch

from trinity.buffer.base import WriterBase
from trinity.config import Config
from trinity.config.errors import ConfigError
from trinity.config.resolve import resolve_config
from trinity.experience import Experience
from trinity.serving.serve import ServeJob
from trinity.serving.serve_feedback import FeedbackError, FeedbackLedger

openai = pytest.importorskip("openai")

HELLO = [{"role": "user", "content": "hi"}]


# -- the ledger --------------------------------------------------------------------------------


class ListWriter(WriterBase):
    def __init__(self):
        self.batches: list[list[Experience]] = []
        self.ended: list[int] = []
        self.finished = False

    def write(self, experiences):
        self.batches.append(list(experiences))

    def end_step(self, step):
        self.ended.append(step)

    def finish(self):
        self.finished = True

    @property
    def written(self) -> list[Experience]:
        return [e for batch in self.batches for e in batch]


def _exp(n: int = 1) -> list[Experience]:
    return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2) for _ in range(n)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_committed_conversation_is_one_step_wise_trajectory():
    writer = ListWriter()
    ledger = FeedbackLedger(writer, trajectories_per_step=4, first_step=3)
    ledger.record(_exp(), "r1", "c1")
    ledger.record(_exp(), "r2", "c1")
    ledger.record(_exp(), "r3", "c1")
    assert ledger.feedback(1.0, conversation_id="c1")["rewarded_calls"] == 3
    ledger.feedback(0.5, response_ids=["r3"])  # a call's own reward wins
    assert writer.written == []  # nothing goes to the buffer before the commit
    answer = ledger.commit("c1")
    assert answer["experiences_written"] == 3
    exps = writer.written
    assert [(e.eid.batch, e.eid.task, e.eid.run, e.eid.step, e.eid.suffix) for e in exps] == [
        (3, "c1", 0, 0, "r1"),
        (3, "c1", 0, 1, "r2"),
        (3, "c1", 0, 2, "r3"),
    ]
    assert [e.reward for e in exps] == [1.0, 1.0, 0.5]
    assert exps[0].info["conversation_id"] == "c1" and exps[2].info["response_id"] == "r3"
    assert writer.ended == []  # 1 of 4 conversations of the step


def test_unrewarded_calls_are_dropped_and_counted():
    writer = ListWriter()
    ledger = FeedbackLedger(writer, trajectories_per_step=8)
    ledger.record(_exp(), "r1", "c1")
    ledger.record(_exp(), "r2", "c1")
    ledger.record(_exp(), "r3", None)  # a conversation of its own, named by its response id
    ledger.feedback(1.0, response_ids=["r2"])
    answer = ledger.commit(response_ids=["r1"])  # closes r1's conversation
    assert (answer["experiences_written"], answer["calls_dropped"]) == (1, 1)
    assert [e.eid.suffix for e in writer.written] == ["r2"]
    assert writer.written[0].eid.step == 0  # turns count the trained calls
    assert ledger.status()["calls_awaiting_feedback"] == 1
    assert ledger.counts["calls_dropped_unrewarded"] == 1


def test_resent_feedback_and_commits_write_nothing_twice():
    writer = ListWriter()
    ledger = FeedbackLedger(writer, trajectories_per_step=8)
    ledger.record(_exp(2), "r1", "c1")  # n=2: two choices of one call
    answer = ledger.feedback(1.0, conversation_id="c1", commit=True)
    assert answer["commit"]["experiences_written"] == 2
    assert [e.eid.suffix for e in writer.written] == ["r1.0", "r1.1"]
    assert ledger.commit("c1")["already_committed"] == 1
    assert ledger.commit(response_ids=["r1"])["experiences_written"] == 0
    assert ledger.feedback(1.0, conversation_id="c1", commit=True)["status"] == "already_committed"
    assert ledger.feedback(1.0, response_ids=["r1"])["status"] == "already_committed"
    with pytest.raises(FeedbackError, match=r"committed with reward 1\.0") as info:
        ledger.feedback(0.0, conversation_id="c1")
    assert info.value.status == 409
    assert len(writer.written) == 2
    # A call that raced the commit is not kept.
    ledger.record(_exp(), "r9", "c1")
    assert ledger.counts["calls_refused_after_commit"] == 1 and ledger.is_committed("c1")


@pytest.mark.parametrize(
    ("kwargs", "status", "match"),
    [
        ({"reward": float("nan"), "conversation_id": "c1"}, 400, "finite number"),
        ({"reward": True, "conversation_id": "c1"}, 400, "finite number"),
        ({"reward": 1.0}, 400, "exactly one of"),
        ({"reward": 1.0, "conversation_id": "c1", "response_ids": ["r1"]}, 400, "exactly one of"),
        ({"reward": 1.0, "conversation_id": "nope"}, 404, "no open call or conversation"),
        ({"reward": 1.0, "response_ids": ["nope"]}, 404, "response id 'nope'"),
    ],
)
def test_bad_feedback(kwargs, status, match):
    ledger = FeedbackLedger(ListWriter(), trajectories_per_step=1)
    ledger.record(_exp(), "r1", "c1")
    reward = kwargs.pop("reward")
    with pytest.raises(FeedbackError, match=match) as info:
        ledger.feedback(reward, **kwargs)
    assert info.value.status == status


def test_feedback_with_an_unknown_id_changes_nothing():
    writer = ListWriter()
    ledger = FeedbackLedger(writer, trajectories_per_step=1)
    ledger.record(_exp(), "r1", "c1")
    with pytest.raises(FeedbackError, match="'nope'"):
        ledger.feedback(1.0, response_ids=["r1", "nope"], commit=True)
    assert ledger.commit("c1")["calls_dropped"] == 1 and writer.written == []  # r1 got no reward


def test_steps_end_after_a_batch_of_conversations_or_a_flush():
    writer = ListWriter()
    ledger = FeedbackLedger(writer, trajectories_per_step=3)
    for i in range(4):
        ledger.record(_exp(), f"r{i}", f"c{i}")
        ledger.feedback(float(i), conversation_id=f"c{i}", task_id="t")  # one group
    ledger.commit("c0")
    ledger.commit("c1")
    assert writer.ended == []
    ledger.commit(response_ids=["r2"])
    assert writer.ended == [1]  # 3 conversations: step 1 ended
    assert [(e.eid.batch, e.eid.task, e.eid.run) for e in writer.written] == [
        (1, "t", 0),
        (1, "t", 1),
        (1, "t", 2),
    ]
    # A commit without ids commits every rewarded conversation and ends the step.
    ledger.record(_exp(), "r9", "unrewarded")
    answer = ledger.commit()
    assert answer["conversations"] == 1 and answer["ended_steps"] == [2]
    assert writer.written[-1].eid.batch == 2 and writer.written[-1].eid.run == 0
    assert ledger.commit()["ended_steps"] == []  # nothing in the step: no empty step
    assert writer.ended == [1, 2]
    assert ledger.status()["open_conversations"] == 1


def test_idle_conversations_close_and_finish_flushes():
    writer, clock = ListWriter(), Clock()
    ledger = FeedbackLedger(writer, trajectories_per_step=10, clock=clock)
    ledger.record(_exp(), "r1", "old")
    ledger.feedback(1.0, conversation_id="old")
    ledger.record(_exp(), "r2", "old-unrewarded")
    clock.now = 50.0
    ledger.record(_exp(), "r3", "new")
    ledger.feedback(2.0, conversation_id="new")
    ledger.record(_exp(), "r4", "new-unrewarded")
    answer = ledger.close_idle(40.0)
    assert (answer["conversations"], answer["dropped_conversations"]) == (1, 1)
    assert [e.eid.suffix for e in writer.written] == ["r1"]
    assert writer.ended == []
    ledger.finish()
    assert [e.eid.suffix for e in writer.written] == ["r1", "r3"]
    assert writer.ended == [1] and writer.finished
    assert ledger.counts["calls_dropped_unrewarded"] == 2
    assert ledger.counts["conversations_auto_closed"] == 4


# -- over HTTP -----------------------------------------------------------------------------------


def _serve_config(tmp_path, model_path, **explorer):
    return resolve_config(
        Config.model_validate(
            {
                "mode": "serve",
                "name": "serve",
                "checkpoint_root_dir": str(tmp_path / "ckpt"),
                "model": {"model_path": str(model_path), "max_prompt_tokens": 64, "max_response_tokens": 8},
                "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
                "buffer": {
                    "batch_size": 1,
                    "trainer_input": {
                        "experience_buffer": {
                            "name": "exp",
                            "storage_type": "sql",
                            "path": f"sqlite:///{tmp_path}/buffer.db",
                        }
                    },
                },
                "explorer": {
                    "proxy_port": 0,
                    **explorer,
                    "rollout_model": {"engine_type": "transformers", "dtype": "float32"},
                },
            }
        )
    )


def _post(url, body, headers=None):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def serving(tmp_path, tiny_model_path, engine):
    job = ServeJob(_serve_config(tmp_path, tiny_model_path), engine=engine)
    job.start()
    try:
        yield job
    finally:
        job.stop()


def _rows(tmp_path):
    with sqlite3.connect(tmp_path / "buffer.db") as db:
        return db.execute("select uid, reward, explorer_step from exp order by id").fetchall()


def test_chats_feedback_and_commits_reach_the_sql_buffer(serving, tmp_path):
    url = serving.base_url
    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    conv = {"X-Trinity-Conversation": "chat-1"}
    first = client.chat.completions.create(
        model=serving.model.model_name, messages=HELLO, max_tokens=4, extra_headers=conv
    )
    second = client.chat.completions.create(
        model=serving.model.model_name,
        messages=HELLO,
        max_tokens=4,
        stream=True,
        extra_body={"conversation_id": "chat-1"},
    )
    streamed_id = {chunk.id for chunk in second}.pop()
    lone = client.chat.completions.create(model=serving.model.model_name, messages=HELLO, max_tokens=4)
    assert _get(f"{url}/status")["calls_awaiting_feedback"] == 3

    assert _post(f"{url}/feedback", {"reward": 1.0, "conversation_id": "chat-1", "task_id": "t1"})[0] == 200
    status, body = _post(f"{url}/commit", {"conversation_id": "chat-1"})
    assert status == 200 and body["experiences_written"] == 2 and body["ended_steps"] == []
    rows = _rows(tmp_path)
    assert [uid.split(":", 1)[1] for uid, _, _ in rows] == [f"1/t1/0/0/{first.id}", f"1/t1/0/1/{streamed_id}"]
    assert [(reward, step) for _, reward, step in rows] == [(1.0, 1), (1.0, 1)]

    # Re-sent feedback and commits change nothing; a new reward for it is a conflict.
    assert _post(f"{url}/feedback", {"reward": 1.0, "conversation_id": "chat-1", "commit": True})[0] == 200
    assert _post(f"{url}/commit", {"conversation_id": "chat-1"})[1]["already_committed"] == 1
    status, body = _post(f"{url}/feedback", {"reward": 0.0, "conversation_id": "chat-1"})
    assert status == 409 and body["error"]["code"] == "already_committed"
    # The committed conversation takes no more calls.
    with pytest.raises(openai.ConflictError, match="is committed"):
        client.chat.completions.create(
            model=serving.model.model_name, messages=HELLO, max_tokens=2, extra_headers=conv
        )

    # Trinity-RFT's client: msg_ids, then a commit without ids closes the step.
    assert _post(f"{url.removesuffix('/v1')}/feedback", {"reward": 0.0, "msg_ids": [lone.id]})[0] == 200
    status, body = _post(f"{url.removesuffix('/v1')}/commit", {})
    assert status == 200 and body["conversations"] == 1 and body["ended_steps"] == [1]  # 2 per step
    assert len(_rows(tmp_path)) == 3
    status = _get(f"{url}/status")
    assert status["model_version"] == 0 and status["explorer_step"] == 2 and status["open_conversations"] == 0


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        ("feedback", {"conversation_id": "x"}, 400, "reward"),
        ("feedback", {"reward": "good", "conversation_id": "x"}, 400, "reward"),
        ("feedback", {"reward": 1, "conversation_id": "x", "run_id": 0}, 400, "run_id"),
        ("feedback", {"reward": 1, "msg_ids": "chatcmpl-1"}, 400, "msg_ids"),
        ("feedback", {"reward": 1, "conversation_id": "x", "commit": "yes"}, 400, "commit"),
        ("feedback", {"reward": 1, "conversation_id": "unknown"}, 404, "conversation_id"),
        ("commit", {"response_ids": ["chatcmpl-unknown"]}, 404, "response_ids"),
        ("commit", [1, 2], 400, None),
    ],
)
def test_bad_feedback_requests_get_openai_errors(serving, path, body, code, param):
    status, answer = _post(f"{serving.base_url}/{path}", body)
    assert status == code
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["param"] == param
    assert answer["error"]["message"]


def test_new_weights_are_picked_up_between_requests(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM

    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.trainer.checkpoint import save_checkpoint

    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)  # own weights
    config = _serve_config(tmp_path, tiny_model_path)
    job = ServeJob(config, engine=engine)
    job.start()
    try:
        url = job.base_url
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
        tokens = list(range(3, 12))
        before = engine.logprobs(tokens)
        # A streaming call holds the engine while it samples; the checkpoint arrives mid-call.
        stream = client.chat.completions.create(
            model=job.model.model_name,
            messages=HELLO,
            max_tokens=8,
            stream=True,
            temperature=1.0,
            extra_body={"min_tokens": 8},
        )
        chunks = iter(stream)
        first = next(chunks)
        trained = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        with torch.no_grad():
            for p in trained.parameters():
                p.mul_(0.5)
        save_checkpoint(config.checkpoint_job_dir, 1, model=trained, state={})
        loaded = []
        loader = threading.Thread(target=lambda: loaded.append(job.watcher.poll()))
        loader.start()
        rest = list(chunks)  # the call in flight finishes
        loader.join(timeout=60)
        assert loaded == [1] and engine.model_version == 1
        assert rest and rest[-1].choices[0].finish_reason is not None
        after = client.chat.completions.create(model=job.model.model_name, messages=HELLO, max_tokens=2)
        assert _get(f"{url}/status")["model_version"] == 1
        versions = {
            rid: [e.model_version for c in conv.calls for e in c.experiences]
            for rid, conv in job.ledger._open.items()
        }
        assert versions == {first.id: [0], after.id: [1]}
        assert not torch.allclose(before, engine.logprobs(tokens))
        assert job.watcher.poll() is None  # nothing newer
    finally:
        job.stop()
        engine.shutdown()


def test_a_restarted_serve_job_starts_from_the_latest_checkpoint(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM

    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.trainer.checkpoint import save_checkpoint

    config = _serve_config(tmp_path, tiny_model_path)
    save_checkpoint(
        config.checkpoint_job_dir, 2, model=AutoModelForCausalLM.from_pretrained(tiny_model_path), state={}
    )
    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)
    job = ServeJob(config, engine=engine)
    try:
        assert engine.model_version == 2
        assert job.ledger.step == 3  # what the trainer's next step (3) expects
    finally:
        job.stop()
        engine.shutdown()


# -- config ----------------------------------------------------------------------------------------


def test_serve_config_keys(tmp_path, tiny_model_path):
    config = _serve_config(tmp_path, tiny_model_path)
    assert config.explorer.listen_address == "127.0.0.1"
    assert config.synchronizer.sync_method == "checkpoint"
    with pytest.raises(
        ConfigError, match="shares its queue with a separate train job: give the queue a path"
    ):
        resolve_config(
            Config.model_validate(
                {"mode": "serve", "model": {"model_path": str(tiny_model_path), "max_model_len": 64}}
            )
        )
    base = config._source
    with pytest.raises(ConfigError, match="serves one engine"):
        resolve_config(
            Config.model_validate(
                {**base, "explorer": {"rollout_model": {"engine_type": "transformers", "engine_num": 2}}}
            )
        )
    with pytest.raises(ConfigError, match="checkpoints from disk"):
        resolve_config(Config.model_validate({**base, "synchronizer": {"sync_method": "memory"}}))


def test_first_step_follows_the_trainers_batches(tmp_path, tiny_model_path):
    from trinity.serving.serve import first_step_after

    config = _serve_config(tmp_path, tiny_model_path)  # batch 1 x repeat 2 = train_batch_size
    assert [first_step_after(config, step) for step in (0, 1, 5)] == [1, 2, 6]
    source = config._source
    doubled = resolve_config(
        Config.model_validate({**source, "buffer": {**source["buffer"], "train_batch_size": 4}})
    )
    assert first_step_after(doubled, 3) == 7  # trainer step 3 took explorer steps 1-6


def test_a_taken_port_is_one_clear_line(tmp_path, tiny_model_path):
    import socket

    from trinity.job import JobFailed
    from trinity.serving.serve import run_serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = _serve_config(tmp_path, tiny_model_path, proxy_port=port)
        with pytest.raises(JobFailed, match=rf"cannot serve on 127\.0\.0\.1:{port}: .*explorer\.proxy_port"):
            run_serve(config)


def test_completions_are_calls_too_and_unknown_routes_name_the_feedback_ones(serving, tmp_path):
    url = serving.base_url
    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    completion = client.completions.create(model=serving.model.model_name, prompt="1+1=", max_tokens=3, n=2)
    status, body = _post(f"{url}/feedback", {"reward": 0.5, "response_id": completion.id, "commit": True})
    assert status == 200 and body["commit"]["experiences_written"] == 2
    assert [uid.rsplit("/", 1)[1] for uid, _, _ in _rows(tmp_path)] == [
        f"{completion.id}.0",
        f"{completion.id}.1",
    ]
    status, body = _post(f"{url}/feedbak", {})
    assert status == 404
    assert "POST /v1/feedback" in body["error"]["message"] and "GET /v1/status" in body["error"]["message"]
