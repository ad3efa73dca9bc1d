"""End to end: `mode: serve` answers an application's two-turn chats and records its feedback in
an SQL buffer; a `mode: train` job (same config, another process) trains on it step-wise
(multi-step GRPO: a conversation is one trajectory); the serve job picks up each new checkpoint,
and every rewarded call is trained exactly once. Run with the transformers engine in the main
suite and with the real vLLM engine (its CPU build) in ``nox -s vllm``."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

openai = pytest.importorskip("openai")


def _write(root: Path, mode: str, engine: str) -> Path:
    """The online job's config in ``mode`` (serve or train): no taskset, the served calls are the data."""
    config = tiny_job(
        root,
        name="online",
        mode=mode,
        algorithm={"algorithm_type": "multi_step_grpo", "optimizer": {"lr": 1.0e-3}},
        # Step-wise: train_batch_size is an upper bound; a train step takes one explorer step.
        buffer={"train_batch_size": 16, "explorer_input": None},
        explorer={
            "proxy_port": 0,
            "service_status_check_interval": 1,
            "eval_on_startup": None,
            "runner_per_model": None,
            "rollout_model": {"engine_type": engine},
        },
        trainer={"save_interval": 1, "total_steps": 2},
    )
    return write_job(root / f"{mode}.yaml", config)


class _Job:
    """A `trinity run` subprocess whose output is collected by a thread (never a full pipe)."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            assert self.proc.poll() is None, f"job exited ({self.proc.returncode}):\n{self.output[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.output[-3000:]}")

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _status(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/status", timeout=30) as response:
        return json.loads(response.read())


def _wait_version(base: str, version: int, job: _Job, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _status(base)["model_version"] < version:
        assert time.monotonic() < deadline, f"serve never loaded version {version}:\n{job.output[-3000:]}"
        time.sleep(0.5)


_NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.mark.parametrize(
    "engine",
    [
        "transformers",
        pytest.param(
            "vllm",
            marks=pytest.mark.skipif(_NO_VLLM, reason="vLLM is installed only in the `nox -s vllm` session"),
        ),
    ],
)
def test_serve_and_train(tmp_path, math_job, job_env, engine):
    # The tiny model (its taskset is not used); vLLM's CPU attention needs 32-wide heads.
    math_job(tmp_path, train=2, test=1, **({"hidden_size": 128, "num_heads": 4} if engine == "vllm" else {}))
    serve_config, train_config = _write(tmp_path, "serve", engine), _write(tmp_path, "train", engine)

    serve = _Job(serve_config, job_env)
    train = None
    try:
        base = serve.wait_for(r"serving .* at (http://127\.0\.0\.1:\d+/v1)", timeout=180).group(1)
        client = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=60)

        def chat(conversation: str, question: str, turns: int = 1) -> list[str]:
            messages, ids = [{"role": "user", "content": question}], []
            for _ in range(turns):
                answer = client.chat.completions.create(
                    model=str(tmp_path / "model"),  # the served model's path
                    messages=messages,
                    max_tokens=6,
                    extra_headers={"X-Trinity-Conversation": conversation},
                )
                ids.append(answer.id)
                reply = {"role": "assistant", "content": answer.choices[0].message.content}
                messages += [reply, {"role": "user", "content": "and?"}]
            return ids

        def episode(step: int) -> list[str]:
            """Two tasks, two 2-turn conversations each (groups of repeat_times 2), rewarded 0 and 1."""
            ids = []
            for task in range(2):
                for run in range(2):
                    conversation = f"s{step}-t{task}-r{run}"
                    ids += chat(conversation, f"{task + step}+{run}=", turns=2)
                    answer = _post(
                        f"{base}/feedback",
                        {
                            "reward": float(run),
                            "conversation_id": conversation,
                            "task_id": f"s{step}t{task}",
                            "commit": True,
                        },
                    )
                    assert answer["commit"]["experiences_written"] == 2
            return ids

        rewarded = episode(1)  # 4 conversations: explorer step 1 ends
        assert _status(base)["explorer_step"] == 2
        # Calls that get no reward are never trained: one committed without, one left open.
        unrewarded = chat("no-reward", "1+1=") + chat("left-open", "2+2=")
        assert _post(f"{base}/commit", {"conversation_id": "no-reward"})["calls_dropped"] == 1

        train = _Job(train_config, job_env)
        _wait_version(base, 1, serve)  # the trainer's step-1 checkpoint is served
        rewarded += episode(2)
        # A re-sent feedback + commit (a client retry) is answered and writes nothing.
        again = _post(f"{base}/feedback", {"reward": 1.0, "conversation_id": "s2-t0-r1", "commit": True})
        assert again["status"] == "already_committed"

        assert train.finish(timeout=300) == 0, train.output[-3000:]
        assert "done: 2 train steps" in train.output
        _wait_version(base, 2, serve)
    finally:
        if train is not None:
            train.kill()
        if serve.proc.poll() is None:
            serve.proc.send_signal(signal.SIGTERM)
        code = serve.finish(timeout=60)
    assert code == 0, serve.output[-3000:]
    assert (
        "serve stopped: 18 calls, 9 conversations committed, 16 experiences written in 2 steps"
        in serve.output
    )

    with sqlite3.connect(tmp_path / "buffer.db") as db:
        rows = db.execute(
            "select uid, reward, consumed, consumed_step, explorer_step, model_version from exp"
        ).fetchall()
    stored = {uid.rsplit("/", 1)[1]: row for row in rows for uid in [row[0]]}
    assert len(rows) == 16 and sorted(stored) == sorted(rewarded)  # each rewarded call stored once
    assert not set(unrewarded) & set(stored)
    for i, response_id in enumerate(rewarded):  # 2 calls per conversation, 4 conversations per step
        uid, reward, consumed, consumed_step, explorer_step, version = stored[response_id]
        step, conversation, turn = 1 + i // 8, i // 2, i % 2
        # Trained once, by the train step that matches its explorer step, sampled with the
        # weights the serve job held then (step 2's calls: the trainer's step-1 checkpoint).
        assert (reward, consumed, consumed_step, explorer_step, version) == (
            float(conversation % 2),
            1,
            step,
            step,
            step - 1,
        )
        assert uid.split(":", 1)[1].split("/")[3] == str(turn)  # eid.step: the turn
