"""The CPU image example (examples/vlm_shapes): its config loads as documented, its images hold
exactly the shapes their answers count, held-out images are never trained on, and the warm-up
rows and RL tasks are read with their images by the SFT reader and simple_mm_workflow within the
run's token limits. The example itself is not run here (its README has the measured numbers)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from trinity.config import load_config, stage_configs

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "vlm_shapes"

pytest.importorskip("trinity_math")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("vlm_shapes_run", EXAMPLE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_is_sft_with_images_then_grpo_with_simple_mm_workflow(monkeypatch, tmp_path):
    monkeypatch.setenv("VLM_SHAPES_DIR", str(tmp_path))
    sft, rl = stage_configs(load_config(EXAMPLE / "vlm_shapes.yaml"))
    assert (sft.mode, sft.algorithm.algorithm_type) == ("train", "sft")
    sft_data = sft.buffer.trainer_input.experience_buffer
    assert (sft_data.schema_type, sft_data.path, sft_data.format.image_key) == (
        "sft",
        f"{tmp_path}/data/sft",
        "images",
    )
    assert (rl.mode, rl.algorithm.algorithm_type) == ("both", "grpo")
    assert rl.explorer.eval_on_startup  # the first eval is the SFT-only model
    assert rl.explorer.rollout_model.engine_type == "transformers"
    assert rl.trainer.trainer_type == "native"
    [taskset] = rl.buffer.explorer_input.tasksets
    assert taskset.path == f"{tmp_path}/data/rl" and taskset.default_workflow_type == "simple_mm_workflow"
    assert (taskset.format.image_key, taskset.default_reward_fn_type) == ("images", "math_boxed_reward")
    evals = {t.name: t for t in rl.buffer.explorer_input.eval_tasksets}
    assert list(evals) == ["heldout", "heldout_any_form", "practice"]
    for name in ("heldout", "heldout_any_form"):  # the held-out images, never trained on
        assert (evals[name].path, evals[name].split) == (f"{tmp_path}/data", "test")
    assert evals["heldout"].default_reward_fn_type == "math_boxed_reward"  # scored as RL is
    assert evals["heldout_any_form"].default_reward_fn_type == "accuracy_reward"
    assert all(t.rollout_args.temperature == 0.0 and t.format.image_key == "images" for t in evals.values())
    assert rl.explorer.eval_interval == rl.buffer.total_steps  # before RL and after it


def cell_colours(image, example) -> list[str | None]:
    """The colour filling each cell of ``image`` (None: empty), read from its pixels."""
    names = {rgb: name for name, rgb in example.COLOURS.items()}
    out = []
    for cell in range(example.GRID * example.GRID):
        x0, y0 = (cell % example.GRID) * example.CELL, (cell // example.GRID) * example.CELL
        seen = {
            image.getpixel((x, y)) for x in range(x0, x0 + example.CELL) for y in range(y0, y0 + example.CELL)
        }
        found = {names[p] for p in seen if p in names}
        assert len(found) <= 1 and seen <= {(255, 255, 255), *example.COLOURS.values()}
        out.append(found.pop() if found else None)
    return out


def test_images_hold_exactly_the_shapes_their_answer_counts(example):
    rng = random.Random(0)
    for count in range(example.GRID * example.GRID + 1):
        for colour in example.COLOURS:
            image, shapes = example.draw(rng, colour, count)
            cells = cell_colours(image, example)
            assert cells.count(colour) == count
            assert [c for c in cells if c] == [c for c, _ in shapes]
    with pytest.raises(ValueError, match="count must be"):
        example.draw(rng, "red", example.GRID * example.GRID + 1)


def test_prepare_writes_heldout_images_apart_and_rows_the_run_reads(example, monkeypatch, tmp_path):
    from trinity.buffer.sft import SFTDatasetReader
    from trinity.config import ExperienceBufferConfig, FormatConfig
    from trinity.multimodal import MultiModalProcessor
    from trinity_math.mm_workflow import SimpleMMWorkflow

    for name, value in (("TEST_IMAGES", 20), ("SFT_IMAGES", 40), ("RL_IMAGES", 12), ("PRACTICE_IMAGES", 4)):
        monkeypatch.setattr(example, name, value)
    work = tmp_path / "run"
    example.prepare(work, seed=3)
    files = {
        "test": "test.jsonl",
        "sft": "sft/train.jsonl",
        "rl": "rl/train.jsonl",
        "practice": "practice/train.jsonl",
    }
    rows = {
        name: [json.loads(line) for line in (work / "data" / path).read_text().splitlines()]
        for name, path in files.items()
    }
    assert [len(rows[n]) for n in ("test", "sft", "rl", "practice")] == [20, 40, 12, 4]
    assert rows["practice"] == rows["rl"][:4]
    images = {n: {r["images"][0] for r in rows[n]} for n in ("test", "sft", "rl")}
    assert not images["test"] & (images["sft"] | images["rl"])  # held-out images are never trained on
    assert not {Path(p).read_bytes() for p in images["test"]} & {
        Path(p).read_bytes() for p in images["sft"] | images["rl"]
    }
    from PIL import Image

    for row in rows["test"][:5]:  # the answer is what the image shows
        colour = row["question"].split()[2]
        with Image.open(row["images"][0]) as image:
            assert cell_colours(image.convert("RGB"), example).count(colour) == int(row["answer"])
    bare = [r for r in rows["sft"] if r["response"] == r["answer"]]
    boxed = [r for r in rows["sft"] if r["response"] == f"\\boxed{{{r['answer']}}}"]
    assert (len(bare), len(boxed)) == (30, 10)  # three in four warm-up answers unboxed
    # the same seed draws the same images and answers
    a, b = (example.question_rows(tmp_path / name, "x", 6, random.Random(3)) for name in ("a", "b"))
    assert [{**r, "images": None} for r in a] == [{**r, "images": None} for r in b]
    assert [Path(r["images"][0]).read_bytes() for r in a] == [Path(r["images"][0]).read_bytes() for r in b]

    # The warm-up rows train with their images; every prompt (4 image tokens, one per cell) and
    # answer fits the run's token limits.
    monkeypatch.setenv("VLM_SHAPES_DIR", str(work))
    sft, rl = stage_configs(load_config(EXAMPLE / "vlm_shapes.yaml"))
    sft_data = sft.buffer.trainer_input.experience_buffer.model_dump()
    reader = SFTDatasetReader(ExperienceBufferConfig(**{**sft_data, "tokenizer_path": str(work / "model")}))
    assert len(reader.samples) == 40 and not reader.skipped
    pad = MultiModalProcessor(work / "model").image_pad_id
    for exp in reader.samples:
        assert exp.tokens[: exp.prompt_length].tolist().count(pad) == 4
        assert exp.prompt_length <= rl.model.max_prompt_tokens
        assert len(exp.tokens) - exp.prompt_length <= rl.model.max_response_tokens
        assert exp.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    fmt = FormatConfig(**rl.buffer.explorer_input.tasksets[0].format.model_dump())
    assert all(SimpleMMWorkflow.row_problem(r, fmt) is None for r in rows["rl"] + rows["test"])
