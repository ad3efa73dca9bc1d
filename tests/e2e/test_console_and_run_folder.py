"""A quickstart-shaped job (SFT warm-up, then GRPO with a queue buffer, synced in memory) run
on a terminal (a pseudo-terminal), as a person sees it, and what its run folders hold for the
studio afterwards; and a start that fails before its actors are up, which leaves no folder.

On the terminal: no warning about the job's own sync_method in the warm-up, no Ray start-up
noise, every line whole on a line of its own (never glued to the progress bar), the warm-up's
bar showing its loss (no reward), the RL bar its reward and the last eval, and each stage's
closing ``done:`` line after its bar's final state.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, tiny_taskset, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(root: Path, model: Path) -> dict:
    """The quickstart-shaped job on the model at ``model``."""
    warmup_data = {
        "name": "sft_data",
        "storage_type": "file",
        "path": f"{root}/data/sft",
        "split": "train",
        "format": {"prompt_type": "plaintext", "prompt_key": "prompt", "response_key": "response"},
    }
    return tiny_job(
        root,
        project="console",
        name="job",
        checkpoint_root_dir=f"{root}/checkpoints",
        continue_from_checkpoint=False,
        model={"model_path": str(model), "max_prompt_tokens": 32, "max_response_tokens": 16},
        buffer={
            "total_steps": 3,
            "explorer_input": {
                "taskset": {"name": "arithmetic"},
                "eval_tasksets": [
                    tiny_taskset(root, "heldout", split="test", rollout_args={"temperature": 0.0})
                ],
            },
            "trainer_input": {
                "experience_buffer": {"name": "experiences", "storage_type": "queue", "path": None}
            },
        },
        explorer={
            "eval_interval": 2,
            "eval_on_startup": True,
            "runner_per_model": None,
            "rollout_model": {"seed": 0},
        },
        synchronizer={"sync_method": "memory", "sync_interval": 1},
        trainer={"seed": 0},
        stages=[
            {
                "stage_name": "warmup",
                "mode": "train",
                "algorithm": {"algorithm_type": "sft"},
                "buffer": {
                    "train_batch_size": 4,
                    "total_steps": 3,
                    "trainer_input": {"experience_buffer": warmup_data},
                },
            },
            {"stage_name": "rl", "mode": "both"},
        ],
    )


def screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: ``\\r`` returns to the line's start, ``ESC[2K``
    clears the line, other escape sequences draw nothing."""
    lines: list[str] = []
    line: list[str] = []
    col = 0
    for token in re.split(r"(\r|\n|\x1b\[2K|\x1b\[[0-9;?]*[A-Za-z])", raw):
        if token == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif token == "\r":
            col = 0
        elif token == "\x1b[2K":
            line = [" "] * col
        elif token.startswith("\x1b["):
            continue
        else:
            for char in token:
                line[col : col + 1] = [char]
                col += 1
    return [*lines, "".join(line).rstrip()]


def run_on_a_terminal(command: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the job closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def job(tmp_path_factory, math_job, job_env):
    root = math_job(tmp_path_factory.mktemp("console_job"), train=16, test=4, sft=8)
    config = write_job(root / "job.yaml", _config(root, root / "model"))
    env = {**job_env, "COLUMNS": "200", "TERM": "xterm"}
    code, raw = run_on_a_terminal([sys.executable, "-m", "trinity.cli", "run", "--config", str(config)], env)
    assert code == 0, raw[-4000:]
    return root, raw


def test_the_terminal_shows_whole_lines_and_no_noise(job):
    root, raw = job
    shown = [line for line in screen(raw) if line.strip()]
    text = "\n".join(shown)
    assert "exchanges no weights" not in text  # the job's sync_method is for its RL stage
    assert "Token authentication" not in text and "Started a local Ray instance" not in text
    bars = [i for i, line in enumerate(shown) if line.startswith("trainer ")]
    done = [i for i, line in enumerate(shown) if line.startswith("[trinity] done:")]
    assert len(done) == 2, text
    warmup_bar, rl_bar = shown[done[0] - 1], shown[done[1] - 1]
    # Each stage's bar ends (final state) right before its closing line.
    assert warmup_bar.startswith("trainer ━") and "3/3 loss " in warmup_bar and "reward" not in warmup_bar, (
        text
    )
    assert rl_bar.startswith("trainer ━") and "3/3 reward " in rl_bar and "eval@" in rl_bar, text
    assert sum(1 for i in bars if "3/3" in shown[i]) == 2, text  # no stale copies of a bar
    # The closing lines are whole: the final weights' path on the same line.
    final = root / "checkpoints" / "console" / "job" / "rl" / "global_step_3"
    assert shown[done[1]].endswith(f"final weights {final}"), text
    # Nothing was printed into a bar line: every other line starts as a line of its own.
    for line in shown:
        if not line.startswith("trainer "):
            assert "━" not in line and "─" not in line, line


def test_the_run_folders_hold_what_the_studio_shows(job):
    from fastapi.testclient import TestClient

    from trinity_studio.app import create_app

    root, _ = job
    jobs = root / "checkpoints" / "console" / "job"
    client = TestClient(create_app(str(root / "checkpoints")))
    runs = {r["id"]: r for r in client.get("/api/runs").json()}
    assert set(runs) == {"console/job/warmup", "console/job/rl"}
    for run in runs.values():
        assert run["config_files"] == ["config.yaml"] and run["has_data"], run
    assert runs["console/job/warmup"]["buffer_note"].startswith("an SFT stage")
    (buffer,) = runs["console/job/rl"]["buffers"]
    assert buffer == str(jobs / "rl" / "buffer" / "experiences.db")
    page = client.get("/api/experiences", params={"source": buffer, "limit": 50}).json()
    assert page["total"] == 3 * 2 * 2  # steps x tasks x repeat_times: all trained, all kept
    assert all(r["consumed"] for r in page["rows"])  # read by the trainer
    item = client.get("/api/experiences/item", params={"source": buffer, "id": 1}).json()
    assert item["tokenizer"] == str(jobs / "warmup" / "global_step_3")  # the RL stage's model
    assert item["pieces"] and item["response_text"] in "".join(item["pieces"])
    files = client.get("/api/runs/config", params={"run": "console/job/rl"}).json()["files"]
    assert "mode: both" in files["config.yaml"]


def test_a_start_that_fails_before_its_actors_are_up_leaves_no_folder(job, job_env):
    root, _ = job
    broken = root / "broken-model"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text("{ not json")
    config = write_job(root / "broken.yaml", _config(root, broken))
    before = sorted(p.name for p in (root / "checkpoints" / "console").iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env=job_env,
    )
    assert proc.returncode == 1
    assert sorted(p.name for p in (root / "checkpoints" / "console").iterdir()) == before == ["job"], (
        proc.stdout[-2000:] + proc.stderr[-2000:]
    )
