"""``simple_mm_workflow``: from a jsonl row with an image to a gradient step, on the tiny Qwen2-VL."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from PIL import Image

from trinity.buffer.taskset import TasksetReader
from trinity.config import FormatConfig, resolve_config
from trinity.config.validation import validate_config
from trinity.multimodal import image_bytes
from trinity.workflow import Task
from trinity_math.mm_workflow import SimpleMMWorkflow


def png(colour: tuple[int, int, int], size: tuple[int, int] = (48, 32)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def job(tmp_path, model_path: str, rows: list[dict]) -> object:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return resolve_config(
        validate_config(
            {
                "checkpoint_root_dir": str(tmp_path / "ckpt"),
                "model": {"model_path": model_path, "max_prompt_tokens": 96, "max_response_tokens": 6},
                "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-2}},
                "buffer": {
                    "batch_size": 1,
                    "explorer_input": {
                        "taskset": {
                            "name": "shapes",
                            "storage_type": "file",
                            "path": str(data),
                            "format": {
                                "prompt_key": "problem",
                                "response_key": "answer",
                                "image_key": "images",
                            },
                            "rollout_args": {"temperature": 1.0},
                        },
                        "default_workflow_type": "simple_mm_workflow",
                        "default_reward_fn_type": "math_boxed_reward",
                    },
                    "trainer_input": {
                        "experience_buffer": {
                            "name": "exp",
                            "storage_type": "sql",
                            "path": f"sqlite:///{tmp_path / 'buffer.db'}",
                        }
                    },
                },
                "explorer": {"rollout_model": {"engine_type": "transformers"}},
                "trainer": {"trainer_type": "native", "use_dynamic_bsz": False},
            }
        )
    )


def test_messages_put_the_rows_images_in_the_user_turn(tmp_path):
    (tmp_path / "a.png").write_bytes(png((1, 2, 3)))
    row = {"problem": "<image> How many?", "answer": "2", "images": [str(tmp_path / "a.png"), "ZmFrZQ=="]}
    task = Task(
        workflow=SimpleMMWorkflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="problem", response_key="answer", image_key="images"),
    )
    from trinity_math.rewards import MathBoxedRewardFn

    task.reward_fn = MathBoxedRewardFn
    messages = SimpleMMWorkflow(task=task, model=None).format_messages()
    assert messages[0]["role"] == "system" and "boxed" in messages[0]["content"]
    assert messages[1] == {
        "role": "user",
        "content": [
            {"type": "image", "image": "ZmFrZQ=="},  # untagged: first
            {"type": "image", "image": str(tmp_path / "a.png")},
            {"type": "text", "text": " How many?"},
        ],
    }


def test_rows_with_unreadable_images_are_skipped_and_counted(tmp_path, tiny_model):
    good = {"problem": "<image> n?", "answer": "1", "images": [base64.b64encode(png((9, 9, 9))).decode()]}
    rows = [
        *[good] * 8,
        {"problem": "<image> n?", "answer": "1", "images": ["missing.png"]},
        {
            "problem": "<image><image> n?",
            "answer": "1",
            "images": [base64.b64encode(png((9, 9, 9))).decode()],
        },
    ]
    config = job(tmp_path, str(tiny_model()), rows)
    reader = TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer)
    assert len(reader.rows) == 8
    reasons = " | ".join(reader.skipped)
    assert "image 0 of column 'images'" in reasons and "2 <image> tags but column 'images' has 1" in reasons


@pytest.mark.slow
def test_from_a_jsonl_row_with_an_image_to_a_gradient_step(tmp_path, monkeypatch):
    from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.testing.tiny_model import create_tiny_vlm
    from trinity.trainer.batch import build_batch, to_device
    from trinity.trainer.forward import forward_logprobs
    from trinity.trainer.native import NativeTrainer

    model_path = create_tiny_vlm(tmp_path / "vlm")
    (tmp_path / "red.png").write_bytes(png((220, 0, 0)))
    monkeypatch.chdir(tmp_path)  # the row names its image relative to the working directory
    config = job(
        tmp_path, str(model_path), [{"problem": "<image>How many?", "answer": "1", "images": "red.png"}]
    )
    [task] = TasksetReader(config.buffer.explorer_input.tasksets[0], config.buffer).read_batch(1)
    assert task.workflow is SimpleMMWorkflow

    engine = TransformersEngine(model_path, dtype="float32", device="cpu", seed=0)
    task.repeat_times = 4
    exps = task.to_workflow(ModelWrapper(engine)).run()
    assert len(exps) == 4 and all(e.reward is not None for e in exps)
    assert all(e.images == [png((220, 0, 0))] for e in exps)
    for e in exps:
        e.eid.batch = 0
    exps[0].reward = 1.0  # an untrained model earns nothing: give the group a signal

    storage = SQLStorage(config.buffer.trainer_input.experience_buffer.path, "exp")
    SQLWriter(storage).write(exps)
    read = SQLReader(storage, max_read_timeout=0).read(4)
    assert all(torch.equal(r.multi_modal_inputs["pixel_values"], e.multi_modal_inputs["pixel_values"])
               for r, e in zip(read, exps))  # fmt: skip

    trainer = NativeTrainer(config)
    batch = to_device(build_batch(read, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        logprob, _ = forward_logprobs(trainer.model, batch)
    for i, e in enumerate(read):
        assert torch.allclose(logprob[i, : e.response_length], e.logprobs, atol=1e-4)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.train_step(read)
    assert metrics["actor/pg_loss"] != 0.0
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    assert image_bytes(str(tmp_path / "red.png")) == read[0].images[0]
