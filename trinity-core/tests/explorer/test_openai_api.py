"""The OpenAI-compatible API with the real ``openai`` client, ``enable_openai_api`` in the
Explorer, and auxiliary models (an LLM judge) reaching workflows."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import urllib.error
import urllib.request

import pytest
import torch

from trinity import hookimpl
from trinity.buffer.base import WriterBase
from trinity.config import Config
from trinity.explorer.explorer import Explorer
from trinity.explorer.model_wrapper import ModelWrapper
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.testing.tiny_model import create_tiny_model
from trinity.workflow import Workflow

openai = pytest.importorskip("openai")  # in trinity-core[dev]

HELLO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


# -- the client against one wrapper's server -------------------------------------------------


def test_openai_client_matches_the_engine_and_the_history(engine):
    model = ModelWrapper(engine, enable_history=True, name="tiny", model_path="/models/tiny")
    try:
        client = model.get_openai_client()
        assert str(client.base_url).rstrip("/") == model.base_url
        completion = client.chat.completions.create(
            model=model.model_name, messages=HELLO, n=2, max_tokens=6, seed=3, logprobs=True
        )
        history = model.extract_experience_from_history()
        assert [c.message.content for c in completion.choices] == [e.response_text for e in history]
        assert [c.finish_reason for c in completion.choices] == [e.info["finish_reason"] for e in history]
        assert completion.usage.completion_tokens == sum(e.response_length for e in history)
        lps = [t.logprob for t in completion.choices[1].logprobs.content]
        assert lps == pytest.approx(history[1].logprobs.tolist(), abs=1e-6)
        assert [m.id for m in client.models.list()] == ["tiny"]
        # Greedy decoding: the API and a direct chat give the same reply.
        greedy = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=8)
        assert (
            greedy.choices[0].message.content
            == model.chat(HELLO, temperature=0, max_tokens=8)[0].response_text
        )
        with pytest.raises(openai.BadRequestError, match="messages"):
            client.chat.completions.create(model="tiny", messages=[])
    finally:
        model.close()


def test_async_openai_client(engine):
    model = ModelWrapper(engine, enable_history=True)

    async def ask():
        client = model.get_openai_async_client()
        try:
            return await client.chat.completions.create(model="rollout", messages=HELLO, max_tokens=4, seed=1)
        finally:
            await client.close()

    try:
        completion = asyncio.run(ask())
        [exp] = model.extract_experience_from_history()
        assert completion.choices[0].message.content == exp.response_text
    finally:
        model.close()


def test_api_key_is_required_when_configured(engine):
    model = ModelWrapper(engine, api_key="s3cret")
    try:
        request = urllib.request.Request(
            f"{model.base_url}/chat/completions",
            data=json.dumps({"messages": HELLO, "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 401 and "api_key" in json.loads(err.value.read())["error"]["message"]
        assert (
            model.get_openai_client()
            .chat.completions.create(model="rollout", messages=HELLO, max_tokens=2)
            .choices
        )
        wrong = openai.OpenAI(base_url=model.base_url, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    finally:
        model.close()


def test_missing_openai_package_is_named(engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now raises ImportError
    model = ModelWrapper(engine)
    try:
        with pytest.raises(ImportError, match="pip install openai"):
            model.get_openai_client()
        with pytest.raises(ImportError, match="get_openai_async_client"):
            model.get_openai_async_client()
    finally:
        model.close()


# -- through the Explorer --------------------------------------------------------------------


class OpenAIAgent(Workflow):
    """Agent code that only speaks OpenAI; the Experiences come from the wrapper's history.

    Both tasks of the batch make their call before either extracts (``calls_done``) so that,
    were the wrapper shared by the two runners, one task's history would hold both calls.
    """

    calls_done = threading.Barrier(2)

    def run(self):
        client = self.model.get_openai_client()
        question = self.task.task_desc
        client.chat.completions.create(
            model=self.model.model_name,
            messages=[{"role": "user", "content": question}],
            max_tokens=4,
            seed=self.task.index,
        )
        self.calls_done.wait(timeout=60)
        experiences = self.model.extract_experience_from_history()
        for exp in experiences:
            exp.reward = 1.0
            exp.info["question"] = question
            exp.info["base_url"] = self.model.base_url
        return experiences


class JudgedAnswer(Workflow):
    """LLM-as-a-judge, as Trinity-RFT's judge workflows use ``auxiliary_models``: the policy
    answers, the judge (``auxiliary_models[0]``) is asked over its OpenAI API and directly."""

    JUDGE_ARGS = {"temperature": 0.0, "max_tokens": 8}

    def run(self):
        [answer] = self.model.chat([{"role": "user", "content": self.task.task_desc}], max_tokens=4, seed=0)
        judge = self.auxiliary_models[0]
        prompt = [{"role": "user", "content": f"Rate: {answer.response_text}"}]
        client = openai.OpenAI(base_url=judge.base_url, api_key=judge.api_key)
        verdict = client.chat.completions.create(model=judge.model_name, messages=prompt, **self.JUDGE_ARGS)
        direct = judge.chat(prompt, **self.JUDGE_ARGS)[0].response_text
        answer.reward = float(len(verdict.choices[0].message.content) % 2)
        answer.info.update(
            judge_prompt=prompt,
            judge_reply=verdict.choices[0].message.content,
            judge_direct=direct,
            judge_name=judge.model_name,
            judge_path=judge.model_path,
            n_auxiliary=len(self.auxiliary_models),
        )
        return [answer]


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("openai_agent", OpenAIAgent)
        register("judged_answer", JudgedAnswer)


@pytest.fixture
def plugins():
    with isolated_plugin_manager(), registered_plugin(_Plugin(), "openai-api-test"):
        yield


class ListWriter(WriterBase):
    def __init__(self):
        self.batches = []

    def write(self, experiences):
        self.batches.append(list(experiences))

    def finish(self):
        pass


def _config(tmp_path, model_path, workflow, rows, **explorer):
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"question {i}?", "response": ""}) + "\n" for i in range(rows))
    )
    taskset = {"name": "train", "path": str(data), "repeat_times": 1, "default_workflow_type": workflow}
    rollout = {"model_path": str(model_path), "engine_type": "transformers", "dtype": "float32"}
    rollout.update(explorer.pop("rollout_model", {}))
    return Config.model_validate(
        {
            "buffer": {"batch_size": rows, "explorer_input": {"tasksets": [taskset]}},
            "explorer": {"max_retry_times": 0, "rollout_model": rollout, **explorer},
        }
    )


def _free_port_pair() -> int:
    """A port p with p and p + 1 free right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    pytest.skip("no two adjacent free ports")


def test_enable_openai_api_starts_a_server_per_runner_with_the_engines(
    tmp_path, tiny_model_path, engine, plugins
):
    base = _free_port_pair()
    config = _config(
        tmp_path,
        tiny_model_path,
        "openai_agent",
        rows=2,
        runner_per_model=2,
        rollout_model={"enable_openai_api": True, "enable_history": True, "base_port": base},
    )
    explorer = Explorer(config, engines=[engine], writer=ListWriter())
    try:
        # Up before any workflow ran, on base_port + runner index.
        urls = [f"http://127.0.0.1:{base + k}/v1" for k in range(2)]
        assert [m.base_url for m in explorer.models] == urls
        for url in urls:
            with urllib.request.urlopen(f"{url}/models", timeout=30) as response:
                assert json.loads(response.read())["data"][0]["id"] == "rollout"

        metrics = explorer.explore_step()
        assert metrics["rollout/failed_tasks"] == 0.0
        [batch] = explorer.writer.batches
        # Each task got exactly its own call, although both ran at once on one engine.
        assert len(batch) == 2
        for exp in batch:
            assert exp.info["question"] in exp.prompt_text
        assert {e.info["base_url"] for e in batch} == set(urls)
    finally:
        explorer.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{base}/v1/models", timeout=5)


def test_taken_base_port_is_an_error_naming_the_key(tmp_path, tiny_model_path, engine, plugins):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(
            tmp_path,
            tiny_model_path,
            "openai_agent",
            rows=1,
            rollout_model={"enable_openai_api": True, "base_port": port},
        )
        with pytest.raises(OSError, match="base_port"):
            Explorer(config, engines=[engine], writer=ListWriter())


def test_auxiliary_judge_model_reaches_the_workflow(tmp_path, tiny_model_path, plugins):
    judge_path = create_tiny_model(tmp_path / "judge", seed=11)
    config = _config(
        tmp_path,
        tiny_model_path,
        "judged_answer",
        rows=3,
        runner_per_model=2,
        auxiliary_models=[
            {
                "name": "judge",
                "model_path": str(judge_path),
                "engine_type": "transformers",
                "dtype": "float32",
            }
        ],
    )
    explorer = Explorer(config, writer=ListWriter())  # both engines built from the config
    try:
        assert len(explorer.auxiliary_engines) == 1 and len(explorer.auxiliary_models) == 2  # per runner
        metrics = explorer.explore_step()
        assert metrics["rollout/failed_tasks"] == 0.0
        [batch] = explorer.writer.batches
        assert len(batch) == 3
        judge_engine, [policy_engine] = explorer.auxiliary_engines[0], explorer.engines
        for exp in batch:
            info = exp.info
            assert info["n_auxiliary"] == 1
            assert (info["judge_name"], info["judge_path"]) == ("judge", str(judge_path))
            # The judge's reply came from the judge engine (greedy: reproducible), not the policy.
            expected = judge_engine.chat(info["judge_prompt"], **JudgedAnswer.JUDGE_ARGS)[0].response_text
            assert info["judge_reply"] == info["judge_direct"] == expected
            policy = policy_engine.chat(info["judge_prompt"], **JudgedAnswer.JUDGE_ARGS)[0].response_text
            assert policy != expected
            assert exp.reward == float(len(expected) % 2)
    finally:
        explorer.shutdown()


def test_auxiliary_engines_must_match_the_config(tmp_path, tiny_model_path, engine, plugins):
    config = _config(
        tmp_path,
        tiny_model_path,
        "judged_answer",
        rows=1,
        auxiliary_models=[{"name": "judge", "model_path": str(tiny_model_path), "engine_num": 2}],
    )
    with pytest.raises(ValueError, match="engine_num"):
        Explorer(config, engines=[engine], auxiliary_engines=[engine], writer=ListWriter())


# -- streaming, seeding, tools with the real tiny model --------------------------------------


def test_stream_matches_the_whole_reply(engine):
    model = ModelWrapper(engine, enable_history=True)
    try:
        client = model.get_openai_client()
        args = {"model": "rollout", "messages": HELLO, "max_tokens": 12, "seed": 7, "logprobs": True, "n": 2}
        whole = client.chat.completions.create(**args)
        chunks = list(
            client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
        )
        for i, choice in enumerate(whole.choices):
            mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
            assert "".join(c.delta.content or "" for c in mine) == choice.message.content
            assert mine[-1].finish_reason == choice.finish_reason
            lps = [t.logprob for c in mine if c.logprobs for t in c.logprobs.content]
            assert lps == [t.logprob for t in choice.logprobs.content]
        assert chunks[-1].usage == whole.usage
        history = model.extract_experience_from_history()
        assert len(history) == 4  # a streamed call is recorded like any other (same seed: same tokens)
        for plain, streamed in zip(history[:2], history[2:]):
            assert torch.equal(plain.tokens, streamed.tokens)
    finally:
        model.close()


def test_api_calls_are_seeded_per_task_like_chat(engine):
    """With ``seed_calls`` (what the runner does per task) a call without a seed samples the same
    through the API as through ``chat``, and again on a rerun of the task."""
    model = ModelWrapper(engine, enable_history=True)
    try:
        client = model.get_openai_client()

        def api_reply():
            return (
                client.chat.completions.create(model="rollout", messages=HELLO, max_tokens=10)
                .choices[0]
                .message.content
            )

        model.seed_calls("task-7")
        first = [api_reply(), api_reply()]
        model.seed_calls("task-7")
        again = [api_reply(), api_reply()]
        model.seed_calls("task-7")
        direct = [model.chat(HELLO, max_tokens=10)[0].response_text for _ in range(2)]
        assert first == again == direct
        assert first[0] != first[1]  # one seed per call, not one per task
        model.seed_calls("task-8")
        assert [api_reply(), api_reply()] != first
    finally:
        model.close()


def test_server_restarts_and_frees_its_port(engine):
    model = ModelWrapper(engine)
    url = model.base_url
    model.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/models", timeout=5)
    try:
        with urllib.request.urlopen(f"{model.base_url}/models", timeout=30) as response:  # a new server
            assert response.status == 200
    finally:
        model.close()


def test_log_requests(engine, caplog):
    model = ModelWrapper(engine, name="judge", log_requests=True)
    try:
        with caplog.at_level("INFO", logger="trinity.serving.openai_api"):
            model.get_openai_client().models.list()
        assert any(
            r.name == "trinity.serving.openai_api" and "judge GET /v1/models 200" in r.getMessage()
            for r in caplog.records
        )
    finally:
        model.close()


def test_parser_keys_reach_the_wrappers(tmp_path, tiny_model_path, engine, plugins):
    config = _config(
        tmp_path,
        tiny_model_path,
        "openai_agent",
        rows=1,
        rollout_model={
            "tool_call_parser": "hermes",
            "enable_auto_tool_choice": True,
            "reasoning_parser": "deepseek_r1",
            "enable_log_requests": True,
        },
    )
    explorer = Explorer(config, engines=[engine], writer=ListWriter())
    try:
        for model in explorer.models:
            assert (model.tool_call_parser, model.reasoning_parser) == ("hermes", "deepseek_r1")
            assert model.enable_auto_tool_choice and model.log_requests
    finally:
        explorer.shutdown()


def test_cli_and_wrapper_import_no_web_stack():
    """fastapi / uvicorn load when a server starts, not for `trinity --help` or a wrapper."""
    import subprocess

    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from trinity.cli import cli\n"
        "for args in (['--help'], ['plugins']):\n"
        "    assert CliRunner().invoke(cli, args).exit_code == 0\n"
        "import trinity.explorer.model_wrapper, trinity.serving.openai_api.tool_parsers, trinity.config\n"
        "print(' '.join(m for m in ('fastapi', 'uvicorn', 'starlette', 'torch') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
