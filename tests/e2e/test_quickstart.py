"""The quickstart example, CI-sized, through the real thing (``run.py``: SFT warm-up then GRPO,
tiny model, real Ray), and its OPMD variant (``trinity run``), which starts from the quickstart's
own warm-up checkpoint (the two YAMLs differ only in the RL algorithm: tests/test_cpu_examples.py).

Each run is the shipped YAML with fewer steps; the tests read the run's tensorboard files and
assert learning signals (loss falls, reward rises), not exact numbers. The DPO example's run is
in test_dpo_example.py (its own module, so that the two xdist workers share the examples' runs).
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
#: The CI-sized runs' steps (each RL step costs about a second). Reward rises steadily from about
#: step 6 (seeds 0-2): over 20 GRPO steps the halves' means differ by 0.055-0.099 (per-step noise
#: about 0.01); OPMD rises more slowly on seed 2, so it gets 24 steps (0.053-0.108).
SFT_STEPS, RL_STEPS, OPMD_STEPS = 20, 20, 24


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


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("quickstart")
    config = QUICKSTART / "quickstart.yaml"
    small = shrink(
        config, tmp_path / config.name, sft_steps=SFT_STEPS, rl_steps=RL_STEPS, eval_interval=RL_STEPS
    )
    work = tmp_path / "work"
    proc = run([sys.executable, str(QUICKSTART / "run.py"), "--work-dir", str(work), "--config", str(small)])
    return proc, work / "checkpoints" / "quickstart"


def test_quickstart_prints_accuracy_before_and_after_rl_and_where_results_are(quickstart):
    proc, jobs = quickstart
    out = proc.stdout
    assert "held-out accuracy after SFT, before RL:" in out and "(RL step 0)" in out
    assert "held-out accuracy after RL:" in out and f"(RL step {RL_STEPS})" in out
    assert f"step {RL_STEPS}/{RL_STEPS}" in out + proc.stderr  # the console progress line of the RL stage
    assert f"tensorboard --logdir {jobs / 'arithmetic'}" in out
    assert (jobs / "arithmetic" / "grpo" / f"global_step_{RL_STEPS}" / "model.safetensors").is_file()


def test_quickstart_prints_a_snippet_that_uses_the_trained_model(quickstart):
    proc, jobs = quickstart
    lines = proc.stdout.split("use the trained model (transformers):\n", 1)[1].splitlines()
    snippet = "\n".join(lines[:5])
    assert str(jobs / "arithmetic" / "grpo" / f"global_step_{RL_STEPS}") in snippet
    assert "trinity studio --root" in proc.stdout
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip(), "the snippet printed no answer"


def test_quickstart_sft_loss_falls(quickstart):
    _, jobs = quickstart
    loss = scalars(jobs / "arithmetic" / "sft_warmup", "trainer")["actor/sft_loss"]
    assert len(loss) == SFT_STEPS
    first, last = halves(loss)
    assert last < 0.5 * first, loss


def test_quickstart_rl_reward_rises(quickstart):
    _, jobs = quickstart
    explorer = scalars(jobs / "arithmetic" / "grpo", "explorer")
    reward = explorer["rollout/reward_mean"]
    assert len(reward) == RL_STEPS
    first, last = halves(reward)
    assert last > first, reward
    # Evaluated before the first step (the SFT-only model) and after the last one.
    assert len(explorer["eval/heldout/accuracy"]) == 2


def test_opmd_variant_learns(quickstart, tmp_path):
    # opmd.yaml's RL stage alone, from the checkpoint of the warm-up stage it shares with the
    # quickstart (tests/test_cpu_examples.py checks that opmd.yaml is quickstart.yaml but for its
    # algorithm): the warm-up is not trained a second time. Its rewards are those of the whole
    # opmd.yaml run's RL stage (compared step by step when this was written).
    _, jobs = quickstart
    work = jobs.parents[1]
    config = shrink(
        QUICKSTART / "opmd.yaml",
        tmp_path / "opmd.yaml",
        sft_steps=SFT_STEPS,
        rl_steps=OPMD_STEPS,
        eval_interval=OPMD_STEPS,
    )
    data = yaml.safe_load(config.read_text())
    data["stages"] = [s for s in data["stages"] if s["stage_name"] != "sft_warmup"]
    data["model"]["model_path"] = str(jobs / "arithmetic" / "sft_warmup" / f"global_step_{SFT_STEPS}")
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run([sys.executable, "-m", "trinity.cli", "run", "--config", str(config)], QUICKSTART_DIR=str(work))
    reward = scalars(jobs / "arithmetic-opmd" / "opmd", "explorer")["rollout/reward_mean"]
    assert len(reward) == OPMD_STEPS
    first, last = halves(reward)
    assert last > first, reward
