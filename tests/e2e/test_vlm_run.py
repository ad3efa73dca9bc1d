"""End to end: upstream's ``mix_vlm`` example (stored unchanged in ``tests/upstream_configs/``)
trains ``mix_chord`` on rows with images, with the tiny Qwen2-VL on CPU: the explorer's
``simple_mm_workflow`` rollouts and the expert SFT rows both carry their images to the trainer."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

UPSTREAM = Path(__file__).parents[1] / "upstream_configs"


def shape_png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(out, format="PNG")
    return out.getvalue()


def write_image_rows(root: Path) -> Path:
    """The tiny Qwen2-VL, and two rows with an image each: tasks (``tasks/``) and expert SFT rows
    (``sft/``) in Trinity-RFT's geometry3k format (``problem``, ``answer``, ``images``)."""
    from trinity.testing.tiny_model import create_tiny_vlm

    model = create_tiny_vlm(root / "model")
    (root / "images").mkdir()
    tasks, sft = [], []
    for i, (colour, answer) in enumerate([((250, 0, 0), "red"), ((0, 0, 250), "blue")]):
        path = root / "images" / f"{i}.png"
        path.write_bytes(shape_png(colour))
        tasks.append({"problem": "<image>Which colour?", "answer": answer, "images": [str(path)]})
        sft.append(
            {"problem": "<image>Which colour?", "response": f"\\boxed{{{answer}}}", "images": [str(path)]}
        )
    (root / "tasks").mkdir()
    (root / "tasks" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks))
    (root / "sft").mkdir()
    (root / "sft" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))

    return model


def image_job(root: Path, upstream_yaml: str, overrides: dict) -> Path:
    """Upstream's ``upstream_yaml`` on CPU (``upstream_on_cpu``) with what both runs here change
    alike (the tiny Qwen2-VL and the image tasks of :func:`write_image_rows`, 2 tasks x 2
    rollouts a step) and ``overrides`` merged in; the job file, written under ``root``."""
    from trinity.testing.jobs import deep_merge, upstream_on_cpu, write_job

    model = write_image_rows(root)
    upstream = yaml.safe_load((UPSTREAM / upstream_yaml).read_text())
    common = {
        "checkpoint_root_dir": f"{root}/ckpt",
        "algorithm": {"repeat_times": 2},
        "model": {"model_path": str(model), "max_response_tokens": 6, "max_model_len": 400},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {"taskset": {"path": f"{root}/tasks", "subset_name": None}},
        },
    }
    # Merged in turn, so that a None in ``overrides`` removes upstream's key.
    return write_job(root / "job.yaml", deep_merge(upstream_on_cpu(upstream, common), overrides))


@pytest.mark.e2e
@pytest.mark.slow
def test_mix_vlm_trains_mix_chord_on_image_rows(tmp_path, trinity_run):
    """Two explore/train steps of upstream's mix_vlm with only what a CPU machine needs changed:
    the tiny Qwen2-VL, local rows with images (tasks and expert SFT rows), small batches, the
    transformers engine and native trainer, the default synchronizer."""
    from trinity.monitor.tensorboard import read_scalars

    root = tmp_path
    job_file = image_job(
        root,
        "mix_vlm/mix_vlm.yaml",
        {
            "algorithm": {
                # Upstream's 256 + 64 rows: left to config resolution (the mix split of 4 rows).
                "policy_loss_fn_args": {
                    "ppo_mini_batch_size": 5,
                    "train_batch_size_usual": None,
                    "train_batch_size_expert": None,
                    "ngpus_trainer": 1,
                },
            },
            "buffer": {
                "total_epochs": 2,  # two explore steps of the 2 tasks: two train steps
                # Upstream's proportions (320 = 256 rollouts + 64 expert rows at ratio 0.2):
                # one explore step's 4 rollouts (2 tasks x 2) plus 1 expert row per train step.
                "train_batch_size": 5,
                "trainer_input": {
                    "experience_buffer": {"storage_type": "sql", "path": f"sqlite:///{root}/buffer.db"},
                    "auxiliary_buffers": {"sft_dataset": {"path": f"{root}/sft", "total_epochs": 2}},
                },
            },
        },
    )
    trinity_run(job_file)

    job = root / "ckpt" / "Trinity-RFT" / "mix_vlm"
    trainer = read_scalars(job / "monitor" / "tensorboard" / "trainer")
    # Each step: one explore step's 4 rollouts plus an expert row (ceil(0.2 x 5)), all with images.
    assert [v for _, v in trainer["sample/usual_count"]] == [4.0, 4.0], trainer["sample/usual_count"]
    assert [v for _, v in trainer["sample/expert_count"]] == [1.0, 1.0]
    assert trainer["trainer/num_experiences"][0][1] == 5.0
    assert trainer["actor/expert/sft_loss"][0][1] > 0  # the expert rows (with their images) trained


@pytest.mark.e2e
@pytest.mark.slow
def test_grpo_vlm_trains_grpo_on_image_rows(tmp_path, trinity_run):
    """One explore/train step of upstream's grpo_vlm (simple_mm_workflow, math_boxed_reward)
    with only what a CPU machine needs changed, as the mix_vlm run above."""
    from trinity.monitor.tensorboard import read_scalars

    root = tmp_path
    trinity_run(image_job(root, "grpo_vlm/vlm.yaml", {"buffer": {"train_batch_size": 4}}))

    tb = root / "ckpt" / "Trinity-RFT" / "grpo_vlm" / "monitor" / "tensorboard"
    trainer = read_scalars(tb / "trainer")
    assert [step for step, _ in trainer["trainer/num_experiences"]] == [1]
    assert trainer["trainer/num_experiences"][0][1] == 4.0  # 2 image tasks x 2 rollouts
    assert "actor/pg_loss" in trainer
    explorer = read_scalars(tb / "explorer")
    assert explorer["rollout/reward_mean"], "the explorer logged no rollout rewards"
