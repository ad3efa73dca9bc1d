"""The examples, CI-sized, through the real thing: the quickstart (``run.py``: SFT warm-up then
GRPO, tiny model, real Ray), its OPMD variant and the DPO example (``trinity run``).

Each run is the shipped YAML with fewer steps; the tests read the run's tensorboard files and
assert learning signals (loss falls, reward rises), not exact numbers.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"


def shrink(config: Path, out: Path, *, sft_steps: int, rl_steps: int, eval_interval: int) -> Path:
    """A copy of a quickstart YAML with fewer SFT and RL steps (``${oc.env:...}`` kept as text).

    The short SFT leaves the model's answers unsure (sampled at temperature 1, many are wrong or
    malformed), and the RL reward gets back the format bonus, so a few RL steps show a clear rise;
    the full quickstart rewards accuracy only.
    """
    data = yaml.safe_load(config.read_text())
    data["buffer"]["total_steps"] = rl_steps
    data["buffer"]["explorer_input"]["taskset"]["reward_fn_args"] = {}
    data["explorer"]["eval_interval"] = eval_interval
    sft = next(s for s in data["stages"] if s["stage_name"] == "sft_warmup")
    sft["buffer"]["total_steps"] = sft_steps
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
    full_env.pop("RAY_ADDRESS", None)  # a Ray of its own, not a cluster another test left behind
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=full_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def scalars(job_dir: Path, role: str) -> dict[str, list[float]]:
    from trinity.monitor.tensorboard import read_scalars

    return {
        tag: [v for _, v in points]
        for tag, points in read_scalars(job_dir / "monitor" / "tensorboard" / role).items()
    }


def halves(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the second half of a series."""
    half = len(values) // 2
    return statistics.fmean(values[:half]), statistics.fmean(values[half:])


def quickstart_run(tmp_path: Path, config: Path) -> tuple[subprocess.CompletedProcess, Path]:
    small = shrink(config, tmp_path / config.name, sft_steps=20, rl_steps=30, eval_interval=30)
    work = tmp_path / "work"
    proc = run([sys.executable, str(QUICKSTART / "run.py"), "--work-dir", str(work), "--config", str(small)])
    return proc, work / "checkpoints" / "quickstart"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    return quickstart_run(tmp_path_factory.mktemp("quickstart"), QUICKSTART / "quickstart.yaml")


def test_quickstart_prints_accuracy_before_and_after_rl_and_where_results_are(quickstart):
    proc, jobs = quickstart
    out = proc.stdout
    assert "held-out accuracy after SFT, before RL:" in out and "(RL step 0)" in out
    assert "held-out accuracy after RL:" in out and "(RL step 30)" in out
    assert "step 30/30" in out + proc.stderr  # the console progress line of the RL stage
    assert f"tensorboard --logdir {jobs / 'arithmetic'}" in out
    assert (jobs / "arithmetic" / "grpo" / "global_step_30" / "model.safetensors").is_file()


def test_quickstart_prints_a_snippet_that_uses_the_trained_model(quickstart):
    proc, jobs = quickstart
    lines = proc.stdout.split("use the trained model (transformers):\n", 1)[1].splitlines()
    snippet = "\n".join(lines[:5])
    assert str(jobs / "arithmetic" / "grpo" / "global_step_30") in snippet
    assert "trinity studio --root" in proc.stdout
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip(), "the snippet printed no answer"


def test_quickstart_sft_loss_falls(quickstart):
    _, jobs = quickstart
    loss = scalars(jobs / "arithmetic" / "sft_warmup", "trainer")["actor/sft_loss"]
    assert len(loss) == 20
    first, last = halves(loss)
    assert last < 0.5 * first, loss


def test_quickstart_rl_reward_rises(quickstart):
    _, jobs = quickstart
    explorer = scalars(jobs / "arithmetic" / "grpo", "explorer")
    reward = explorer["rollout/reward_mean"]
    assert len(reward) == 30
    first, last = halves(reward)
    assert last > first, reward
    # Evaluated before the first step (the SFT-only model) and after the last one.
    assert len(explorer["eval/heldout/accuracy"]) == 2


def test_opmd_variant_learns(tmp_path):
    _, jobs = quickstart_run(tmp_path, QUICKSTART / "opmd.yaml")
    reward = scalars(jobs / "arithmetic-opmd" / "opmd", "explorer")["rollout/reward_mean"]
    first, last = halves(reward)
    assert last > first, reward


def test_dpo_example_loss_falls_and_prefers_chosen(tmp_path, math_job):
    math_job(tmp_path, train=200, test=55, difficulty=3, dpo=200)
    data = yaml.safe_load((ROOT / "examples" / "dpo" / "dpo.yaml").read_text())
    data["buffer"]["total_steps"] = 30
    config = tmp_path / "dpo.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run([sys.executable, "-m", "trinity.cli", "run", "--config", str(config)], DPO_DIR=str(tmp_path))

    trainer = scalars(tmp_path / "checkpoints" / "dpo-cpu" / "arithmetic", "trainer")
    loss, accuracy = trainer["actor/dpo_loss"], trainer["actor/accuracy"]
    assert len(loss) == 30
    assert loss[0] == pytest.approx(0.693, abs=0.01)  # log 2: the policy starts as its reference
    first, last = halves(loss)
    assert last < first, loss
    first, last = halves(accuracy)
    assert last > first, accuracy
