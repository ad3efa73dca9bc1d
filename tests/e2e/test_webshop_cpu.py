"""End to end: `examples/webshop/cpu.yaml` through `trinity run` — multi-turn GRPO on CPU.

The test runs the commands of the example's header comment, as written, in an empty folder (so
the documented recipe cannot drift from the YAML). The one change to the YAML is a SQLite mirror
of its experience queue, so the test can read back what the explorer wrote and the trainer
consumed.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "webshop" / "cpu.yaml"
END_OF_TURN = "<|im_end|>"  # how the tiny model's chat template closes a turn


def header_commands(text: str) -> list[str]:
    """The shell commands of the example's header (comment lines indented by three spaces)."""
    commands = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   ") and line[4:].strip():
            commands.append(line[4:].strip())
    return commands


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("webshop")
    text = EXAMPLE.read_text()
    commands = header_commands(text)
    assert len(commands) == 3 and commands[-1].endswith("trinity run --config examples/webshop/cpu.yaml")

    # Same YAML, plus the queue's SQL mirror (`path` on a queue buffer) for the assertions below.
    mirrored, n = re.subn(r"(\n      storage_type: queue\n)", r"\1      path: sqlite:///./buffer.db\n", text)
    assert n == 1, "examples/webshop/cpu.yaml no longer has its queue experience buffer"
    (root / "examples" / "webshop").mkdir(parents=True)
    (root / "examples" / "webshop" / "cpu.yaml").write_text(mirrored)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # python, trinity
    for var in ("RAY_ADDRESS", "TINY_MODEL_PATH", "WEBSHOP_TASKS_DIR", "TRINITY_CHECKPOINT_ROOT_DIR"):
        env.pop(var, None)  # the documented defaults, and a Ray of its own
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=root, capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, f"$ {command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert "step 2/2" in proc.stdout + proc.stderr
    return root


def stored_experiences(root: Path) -> list[tuple[int, object]]:
    from trinity.experience import Experience

    with sqlite3.connect(root / "buffer.db") as db:
        rows = db.execute(
            "select e.consumed, b.blob from webshop_buffer e join webshop_buffer_blobs b on b.id = e.id"
        ).fetchall()
    return [(consumed, Experience.deserialize(blob)) for consumed, blob in rows]


def test_episodes_were_written_with_env_info_and_all_trained(job):
    stored = stored_experiences(job)
    # 2 explore steps x batch_size 2 x repeat_times 2, one Experience per episode.
    assert len(stored) == 8
    assert all(consumed for consumed, _ in stored), "the trainer did not read every episode"
    for _, exp in stored:
        turns = sum(m["role"] == "assistant" for m in exp.messages)
        assert exp.info["env_steps"] == turns and 1 <= turns <= 2  # max_env_steps: 2
        assert 0 <= exp.info["invalid_actions"] <= exp.info["env_steps"]
        assert {"session_id", "done"} <= exp.info.keys()
        assert exp.reward is not None and exp.eid.batch in (1, 2)
    # The two rollouts of a task are separate episodes of the same goal.
    by_task: dict[tuple, set] = {}
    for _, exp in stored:
        by_task.setdefault((exp.eid.batch, exp.eid.task), set()).add(exp.info["goal_index"])
    assert len(by_task) == 4 and all(len(goals) == 1 for goals in by_task.values())


def test_action_mask_covers_exactly_the_assistant_turns(job):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job / "tiny-model")
    for _, exp in stored_experiences(job):
        response = exp.tokens[exp.prompt_length :].tolist()
        mask = exp.action_mask.tolist()
        assert len(mask) == len(response) and mask[0]  # the response starts with the first reply
        # Contiguous masked spans, decoded, are the assistant replies (each closed by its
        # end-of-turn token); everything unmasked holds the observations the env wrote.
        spans, unmasked, current = [], [], []
        for token, keep in zip(response, mask):
            if keep:
                current.append(token)
            else:
                if current:
                    spans.append(current)
                    current = []
                unmasked.append(token)
        if current:
            spans.append(current)
        replies = [m["content"] for m in exp.messages if m["role"] == "assistant"]
        assert [tokenizer.decode(s) for s in spans] == [r + END_OF_TURN for r in replies]
        observations = [m["content"] for m in exp.messages[2:] if m["role"] == "user"]
        assert all(o in tokenizer.decode(unmasked) for o in observations)
        assert len(exp.logprobs) == len(response)


def test_checkpoints_exist_and_training_changed_the_weights(job):
    from transformers import AutoModelForCausalLM

    run_dir = job / "checkpoints" / "webshop-cpu" / "tiny-webshop"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (run_dir / "global_step_1").is_dir()
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "global_step_2").state_dict()
    initial = AutoModelForCausalLM.from_pretrained(job / "tiny-model").state_dict()
    assert any((trained[k] - initial[k]).abs().max() > 0 for k in initial if initial[k].is_floating_point())
