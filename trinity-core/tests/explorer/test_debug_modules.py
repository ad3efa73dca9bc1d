"""``trinity debug`` modules: inference_model serving the tiny model for workflow runs in another
process (the remote wrapper gives what a local run gives), stale address files, the viewer."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from trinity.explorer.model_wrapper import ModelWrapper
from trinity.plugins import install_hint
from trinity.serving.debug import debug
from trinity.serving.remote_model import RemoteModelWrapper, build_debug_app, probe
from trinity.testing.plugins import isolated_plugin_manager

HELLO = [{"role": "user", "content": "1+1="}]


def _same(a, b):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.prompt_length == b.prompt_length
    assert a.response_text == b.response_text and a.prompt_text == b.prompt_text
    assert a.logprobs.tolist() == pytest.approx(b.logprobs.tolist(), abs=1e-5)
    assert a.info.get("finish_reason") == b.info.get("finish_reason")


# -- the remote wrapper against an in-process debug server -------------------------------------


@pytest.fixture
def served(engine, tiny_model_path):
    from trinity.serving.openai_api.server import OpenAIServer

    model = ModelWrapper(engine, name="rollout", model_path=str(tiny_model_path))
    server = OpenAIServer(model, app=build_debug_app(model))
    server.start()
    try:
        yield model, server.base_url
    finally:
        server.stop()


def test_remote_wrapper_gives_the_local_experiences(served):
    local, url = served
    remote = RemoteModelWrapper(url, enable_history=True)
    assert remote.model_version == local.model_version and remote.model_path == local.model_path
    for wrapper in (local, remote):  # unseeded calls take the task's seeds, as locally
        wrapper.seed_calls("toy#0/v0/attempt0")
    [a], [b] = local.chat(HELLO, max_tokens=6), remote.chat(HELLO, max_tokens=6)
    _same(a, b)
    assert b.tokens.dtype == torch.long and b.logprobs.dtype == torch.float32
    for x, y in zip(
        local.generate(["ab", "cd"], n=2, max_tokens=4), remote.generate(["ab", "cd"], n=2, max_tokens=4)
    ):
        _same(x, y)
    ids = a.tokens.tolist()
    assert remote.logprobs(ids).tolist() == pytest.approx(local.logprobs(ids).tolist(), abs=1e-5)
    convo = [*HELLO, {"role": "assistant", "content": "2"}]
    x, y = local.convert_messages_to_experience(convo), remote.convert_messages_to_experience(convo)
    _same(x, y)
    assert x.action_mask.tolist() == y.action_mask.tolist()
    assert remote.tokenizer.decode(ids) == local.tokenizer.decode(ids)
    with pytest.raises(TypeError, match="unknown rollout argument"):
        remote.chat(HELLO, bogus=1)


def test_remote_history_holds_chat_and_openai_calls_in_order(served):
    openai = pytest.importorskip("openai")
    _, url = served
    remote = RemoteModelWrapper(url, enable_history=True)
    [first] = remote.chat(HELLO, max_tokens=3, seed=1)
    client = remote.get_openai_client()
    assert isinstance(client, openai.OpenAI)
    reply = client.chat.completions.create(model="rollout", messages=HELLO, max_tokens=3, seed=2)
    other = RemoteModelWrapper(url, enable_history=True)  # another debug run: its own history
    other.get_openai_client().chat.completions.create(model="rollout", messages=HELLO, max_tokens=2)
    history = remote.extract_experience_from_history()
    assert len(history) == 2 and history[0] is first
    assert history[1].response_text.startswith(reply.choices[0].message.content or "")
    assert history[1].prompt_length > 0 and len(history[1].logprobs) == history[1].response_length
    assert remote.extract_experience_from_history() == []
    assert len(other.extract_experience_from_history()) == 1


def test_probe_says_none_for_a_dead_server():
    assert probe(f"http://127.0.0.1:{_closed_port()}/v1", timeout=1) is None


# -- the CLI: inference_model in a subprocess, workflow here -----------------------------------

WORKFLOW = textwrap.dedent(
    """
    from trinity import hookimpl
    from trinity.workflow import Workflow

    class ToyWorkflow(Workflow):
        def run(self):
            # No seed: the runner's per-task seeds must reach the served model as they do a local one.
            exps = self.model.chat([{"role": "user", "content": self.task.task_desc}], max_tokens=5)
            for e in exps:
                e.reward = float(len(e.response_text))
                for judge in self.auxiliary_models:
                    [verdict] = judge.chat([{"role": "user", "content": e.response_text}], max_tokens=3, seed=0)
                    e.info.update(judge=judge.model_name, verdict=verdict.tokens.tolist())
            return exps

    @hookimpl
    def register_workflows(register):
        register("toy_modules_wf", ToyWorkflow)
    """
)


def _setup(debug_job):
    rows = [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(2)]
    return debug_job(WORKFLOW, "toy_modules_wf", rows)


def _address_file(tmp_path):
    [path] = list((tmp_path / "ckpt").glob("*/*/debug/inference_model.json")) or [None]
    return path


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def manager():
    with isolated_plugin_manager(autoload=True) as m:
        yield m


def _lines(proc):
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines, text, timeout=90):
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no {text!r} in the output:\n{''.join(seen)}")


def _run_workflow(config, plugins, out, *extra):
    args = ["-c", str(config), "--plugin-dir", str(plugins), "--output-file", str(out), *extra]
    result = CliRunner().invoke(debug, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_workflow_uses_the_served_inference_model(tmp_path, tiny_model_path, debug_job, manager):
    config, plugins = _setup(debug_job)
    judge = (
        f"  auxiliary_models: [{{name: judge, model_path: {tiny_model_path}, engine_type: transformers}}]\n"
    )
    config.write_text(config.read_text() + judge)
    trinity = Path(sys.executable).parent / "trinity"
    proc = subprocess.Popen(
        [
            str(trinity),
            "debug",
            "-c",
            str(config),
            "--module",
            "inference_model",
            "--plugin-dir",
            str(plugins),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = _lines(proc)
        shown = _wait_for(lines, "--module workflow")
        urls = [
            w
            for line in shown.splitlines()
            if line.startswith("serving ")
            for w in line.split()
            if "://" in w
        ]
        url, judge_url = urls
        assert f"serving {tiny_model_path} at {url} (Ctrl-C to stop)" in shown
        path = _address_file(tmp_path)
        address = json.loads(path.read_text())
        assert address["pid"] == proc.pid
        assert address["rollout"] == {"name": "rollout", "model_path": str(tiny_model_path), "url": url}
        assert address["auxiliary_models"] == [
            {"name": "judge", "model_path": str(tiny_model_path), "url": judge_url}
        ]

        output, remote = _run_workflow(config, plugins, tmp_path / "remote.jsonl")
        assert (
            f"using the inference model served at {url} (from trinity debug --module inference_model)"
            in output
        )
        assert "loading" not in output
        output, local = _run_workflow(config, plugins, tmp_path / "local.jsonl", "--no-server")
        assert "using the inference model" not in output and f"loading {tiny_model_path}" in output
        assert len(remote) == len(local) == 2
        for r, loc in zip(remote, local):  # same tasks, same seeds: the same experiences
            assert r["tokens"] == loc["tokens"] and r["prompt_length"] == loc["prompt_length"]
            assert r["logprobs"] == pytest.approx(loc["logprobs"], abs=1e-5)
            assert r["reward"] == loc["reward"] and r["response_text"] == loc["response_text"]
            assert r["prompt_length"] + len(r["logprobs"]) == len(r["tokens"])
            assert r["info"]["judge"] == "judge" and r["info"]["verdict"] == loc["info"]["verdict"]

        # A second server for the same job is refused while the first one answers.
        again = CliRunner().invoke(debug, ["-c", str(config), "--module", "inference_model"])
        assert again.exit_code == 1 and "already served for this job" in again.output

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stale_address_file_falls_back_to_loading_the_model(tmp_path, tiny_model_path, debug_job, manager):
    config, plugins = _setup(debug_job)
    from trinity.config import load_config
    from trinity.plugins import add_plugin_dirs
    from trinity.serving.debug import server_file

    add_plugin_dirs([str(plugins)])  # the config names the plugin's workflow
    path = server_file(load_config(str(config)))
    path.parent.mkdir(parents=True)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    rollout = {"name": "rollout", "model_path": str(tiny_model_path), "url": url}
    path.write_text(json.dumps({"pid": 999999, "rollout": rollout, "auxiliary_models": []}))
    output, exps = _run_workflow(config, plugins, tmp_path / "out.jsonl")
    [line] = [line for line in output.splitlines() if "does not answer" in line]
    assert (
        line == f"the inference model in {path} (pid 999999, {url}) does not answer; loading the model here"
    )
    assert f"loading {tiny_model_path}" in output and len(exps) == 2


# -- viewer ----------------------------------------------------------------------------------


def test_viewer_launches_the_studio_on_the_file(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("trinity_studio")
    fake.launch = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "trinity_studio", fake)
    out = tmp_path / "exps.jsonl"
    out.write_text("{}\n")
    result = CliRunner().invoke(debug, ["--module", "viewer", "--output-file", str(out), "--port", "8123"])
    assert result.exit_code == 0, result.output
    assert calls == [{"host": "127.0.0.1", "port": 8123, "experience_file": str(out)}]
    result = CliRunner().invoke(debug, ["--module", "viewer", "--output-file", str(out), "--host", "0.0.0.0"])
    assert calls[-1] == {"host": "0.0.0.0", "port": 8080, "experience_file": str(out)}


def test_viewer_without_the_studio_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trinity_studio", None)  # import fails with ImportError
    out = tmp_path / "exps.jsonl"
    out.write_text("{}\n")
    result = CliRunner().invoke(debug, ["--module", "viewer", "--output-file", str(out)])
    assert result.exit_code == 1
    hint = install_hint("trinity-studio")
    assert result.output.strip() == f"the viewer needs the studio: {hint}"
    assert hint.startswith("pip install") and "trinity-studio" in hint


def test_viewer_needs_an_existing_output_file(tmp_path):
    result = CliRunner().invoke(debug, ["--module", "viewer"])
    assert result.exit_code == 2 and "--output-file" in result.output
    result = CliRunner().invoke(debug, ["--module", "viewer", "--output-file", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 1 and "no such file" in result.output


def test_workflow_and_inference_model_need_a_config():
    result = CliRunner().invoke(debug, ["--module", "inference_model"])
    assert result.exit_code == 2 and "-c/--config" in result.output
