"""The GPU example configs that use this plugin pass `trinity run --dry-run` (no GPU needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trinity_math.hooks import REWARD_FNS, WORKFLOWS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("config", "workflow", "reward_fn", "repeat_times"),
    [
        ("gsm8k/grpo.yaml", "math_workflow", "math_reward", 8),
        ("countdown/ppo.yaml", "math_workflow", "countdown_reward", 5),
    ],
)
def test_example_dry_run(
    config: str, workflow: str, reward_fn: str, repeat_times: int, tmp_path: Path
) -> None:
    # --dry-run does not look components up, so check the names against this plugin here
    assert workflow in WORKFLOWS and reward_fn in REWARD_FNS
    trinity = shutil.which("trinity")
    assert trinity, "the `trinity` command is not installed (pip install -e ./trinity-core)"
    # `trinity run --dry-run` checks that the model folder and the taskset are there.
    (tmp_path / "my-qwen").mkdir()
    (tmp_path / "my-qwen" / "config.json").write_text("{}")
    (tmp_path / "tasks").mkdir()
    env = {
        **os.environ,
        "MODEL_PATH": str(tmp_path / "my-qwen"),
        "TRINITY_TASKSET_PATH": str(tmp_path / "tasks"),
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "ckpt"),
    }
    out = subprocess.run(
        [trinity, "run", "--config", str(EXAMPLES / config), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    resolved = out.stdout
    assert f"model_path: {tmp_path / 'my-qwen'}" in resolved
    assert f"path: {tmp_path / 'tasks'}" in resolved
    assert f"default_workflow_type: {workflow}" in resolved
    assert f"default_reward_fn_type: {reward_fn}" in resolved
    assert f"n: {repeat_times}" in resolved
    assert "engine_type: vllm" in resolved and "trainer_type: verl" in resolved
