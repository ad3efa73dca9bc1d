"""A CPU example with images: a tiny vision-language model learns to count coloured shapes.

    python examples/vlm_shapes/run.py [--work-dir ./vlm-shapes-run] [--seed 0]

1. draws images of coloured circles and squares with PIL (train / held-out split, never
   overlapping), writes the question rows and a warm-up corpus, and builds a fresh, randomly
   initialised tiny Qwen2-VL (``trinity.testing.tiny_model.create_tiny_vlm``) into the work
   folder; nothing is downloaded;
2. runs ``trinity run --config examples/vlm_shapes/vlm_shapes.yaml``: stage ``sft_warmup``
   (supervised warm-up on rows with images) then stage ``grpo`` (RL with ``simple_mm_workflow``
   on other train images, evaluated on the held-out ones before the first step and at the end);
3. reads the eval accuracy from the run's tensorboard files and prints it before and after RL.

The work folder is recreated on every run (it must be empty or an earlier run's of this script).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARKER = ".trinity-vlm-shapes"  # marks a work folder this script made, so it may recreate it

# The images: a 2x2 grid of 28-pixel cells (56x56 pixels), each cell empty or holding one circle
# or square of one of three colours, of random size and place within its cell. The tiny model's
# vision tower cuts 14-pixel patches and merges 2x2 of them, so each cell is one image token.
# The question asks for one colour ("How many red shapes?"); its answer (0 to 4) is drawn first,
# uniformly, so that no count is a good guess.
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 40), "blue": (40, 60, 220)}
KINDS = ("circle", "square")
CELL = 28
GRID = 2
TEST_IMAGES = 100
SFT_IMAGES = 1000
RL_IMAGES = 400
PRACTICE_IMAGES = 100  # of the RL images, evaluated as "practice"
# As in the text quickstart, the warm-up gives knowledge and a first try at the task: it teaches
# the counts, but three in four of its answers are the bare number ("2"), as most text does; the
# rest answer in \boxed{} as the task's reward (math_boxed_reward) reads. RL, rewarded for a right
# answer in \boxed{} only, teaches it to answer the way it is asked to.
UNBOXED = 0.75
MODEL = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vision_dim": 32}
PIXELS = (CELL * GRID) ** 2  # min_pixels = max_pixels: the processor never resizes


def draw(rng: random.Random, colour: str, count: int) -> tuple[Any, list[tuple[str, str]]]:
    """A PIL image with exactly ``count`` shapes of ``colour`` (and others of other colours or
    empty cells elsewhere) and the ``(colour, kind)`` of each shape drawn, row by row."""
    from PIL import Image, ImageDraw

    cells = GRID * GRID
    if not 0 <= count <= cells:
        raise ValueError(f"count must be 0..{cells}, got {count}")
    asked = set(rng.sample(range(cells), count))
    others = [c for c in COLOURS if c != colour]
    image = Image.new("RGB", (CELL * GRID, CELL * GRID), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    shapes: list[tuple[str, str]] = []
    for cell in range(cells):
        if cell in asked:
            fill = colour
        else:
            fill = rng.choice([None, *others])  # a third of the other cells stay empty
            if fill is None:
                continue
        kind = rng.choice(KINDS)
        size = rng.randint(10, 20)
        x = (cell % GRID) * CELL + rng.randint(2, CELL - 2 - size)
        y = (cell // GRID) * CELL + rng.randint(2, CELL - 2 - size)
        (pen.ellipse if kind == "circle" else pen.rectangle)([x, y, x + size, y + size], fill=COLOURS[fill])
        shapes.append((fill, kind))
    return image, shapes


def question_rows(folder: Path, prefix: str, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` question rows, each with a new image saved as ``folder/<prefix><i>.png``:
    ``{"question": "How many red shapes?", "answer": "2", "images": [path]}``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        colour = rng.choice(list(COLOURS))
        answer = rng.randint(0, GRID * GRID)
        image, shapes = draw(rng, colour, answer)
        assert sum(1 for c, _ in shapes if c == colour) == answer
        path = folder / f"{prefix}{i}.png"
        image.save(path)
        rows.append({"question": f"How many {colour} shapes?", "answer": str(answer), "images": [str(path)]})
    return rows


def sft_rows(
    rows: list[dict[str, Any]], rng: random.Random, unboxed: float = UNBOXED
) -> list[dict[str, Any]]:
    """The warm-up corpus: each row answered, ``unboxed`` of them with the bare number and the
    others in ``\\boxed{}`` (see the note at the top)."""
    bare = set(rng.sample(range(len(rows)), round(unboxed * len(rows))))
    return [
        {**row, "response": row["answer"] if i in bare else f"\\boxed{{{row['answer']}}}"}
        for i, row in enumerate(rows)
    ]


def prepare(work: Path, seed: int = 0) -> None:
    """Recreate ``work`` with the rows and images (``data/``) and the tiny VLM (``model/``) of
    ``seed``; held-out images are drawn apart from the train ones and never trained on."""
    from trinity.testing.tiny_model import create_tiny_vlm
    from trinity_math.tasks import write_jsonl

    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            sys.exit(
                f"{work} exists and is not a work folder of this example; choose another --work-dir "
                "(the example deletes and recreates its work folder)"
            )
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by examples/vlm_shapes/run.py; deleted and recreated on each run\n")

    data, images = work / "data", work / "data" / "images"
    rng = random.Random(seed)
    test = question_rows(images, "test", TEST_IMAGES, rng)
    sft = question_rows(images, "sft", SFT_IMAGES, rng)
    rl = question_rows(images, "rl", RL_IMAGES, rng)
    write_jsonl(data / "test.jsonl", test)
    write_jsonl(data / "sft" / "train.jsonl", sft_rows(sft, rng))
    write_jsonl(data / "rl" / "train.jsonl", rl)
    write_jsonl(data / "practice" / "train.jsonl", rl[:PRACTICE_IMAGES])
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    create_tiny_vlm(work / "model", seed=seed, min_pixels=PIXELS, max_pixels=PIXELS, **MODEL)
    print(
        f"[vlm_shapes] {SFT_IMAGES} warm-up / {RL_IMAGES} RL / {TEST_IMAGES} held-out images and "
        f"questions in {data}; fresh tiny VLM in {work / 'model'}",
        flush=True,
    )


def quickstart() -> Any:
    """The text quickstart's run.py as a module (its ``run_job``)."""
    spec = importlib.util.spec_from_file_location("quickstart_run", HERE.parent / "quickstart" / "run.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def summary(config_path: Path, seconds: float) -> dict[str, float]:
    """Print held-out accuracy (boxed, and in any form) before and after RL; return the numbers."""
    from trinity.config import load_config, stage_configs
    from trinity.monitor.tensorboard import eval_curves

    rl = Path(stage_configs(load_config(config_path))[-1].checkpoint_job_dir)
    evals = eval_curves(rl)
    out: dict[str, float] = {"seconds": seconds}
    print("\n" + "=" * 72)
    for name, label in (
        ("heldout", "held-out, answer in \\boxed{}"),
        ("heldout_any_form", "held-out, any form"),
        ("practice", "practice (RL images)"),
    ):
        if name not in evals:
            continue
        (s0, before), (s1, after) = evals[name][0], evals[name][-1]
        out[f"{name}_before"], out[f"{name}_after"] = before, after
        print(f"{label + ':':<32}{before:6.1%} (RL step {s0}) -> {after:6.1%} (RL step {s1})  "
              f"{100 * (after - before):+.1f} points")  # fmt: skip
    print(f"wall time: {seconds / 60:.1f} min (greedy answers, one per image)")
    checkpoints = sorted(rl.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if checkpoints:
        print(f"final weights (Hugging Face format): {checkpoints[-1]}")
    print(f"tensorboard logs: tensorboard --logdir {rl.parent}")
    print("=" * 72)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work-dir", type=Path, default=Path("vlm-shapes-run"), help="default ./vlm-shapes-run"
    )
    parser.add_argument(
        "--config", type=Path, default=HERE / "vlm_shapes.yaml", help="default vlm_shapes.yaml"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the data, the model and the job (default 0)"
    )
    args = parser.parse_args(argv)
    work = args.work_dir.resolve()
    config = args.config.resolve()

    start = time.monotonic()
    prepare(work, args.seed)
    # The YAML finds the data, the model and its checkpoint folder through VLM_SHAPES_DIR.
    os.environ["VLM_SHAPES_DIR"] = str(work)
    os.environ["VLM_SHAPES_SEED"] = str(args.seed)
    print(f"[vlm_shapes] VLM_SHAPES_DIR={work} trinity run --config {config}", flush=True)
    code = quickstart().run_job(config, work, "vlm_shapes")
    if code != 0:
        return code
    summary(config, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
