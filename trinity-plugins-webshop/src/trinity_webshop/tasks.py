"""Write WebShop tasksets (jsonl) for Trinity.

    python -m trinity_webshop.tasks OUT_DIR [--train N] [--test N]
    python -m trinity_webshop.tasks OUT_DIR --range train 500 6910 --range test 0 500   # original WebShop

Writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/test.jsonl``. One row per goal::

    {"goal_index": 17, "split": "train", "instruction": "i need ... dollars"}

``goal_index`` is what ``webshop_workflow`` plays (a global index into the catalog's goals, or
the original WebShop's session number with ``--range``); ``instruction`` is there for people
and for ``format.prompt_key: instruction`` (the workflow never reads it). Point a taskset at
the folder with ``path: OUT_DIR`` and ``split: train`` (or ``test``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trinity_webshop.catalog import Catalog, default_catalog


def task_rows(catalog: Catalog, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Taskset rows for the goals of ``split`` in ``catalog`` (the first ``limit`` of them)."""
    indices = catalog.goal_indices(split)[:limit]
    return [
        {"goal_index": i, "split": split, "instruction": catalog.goal(i)["instruction_text"]} for i in indices
    ]


def write_tasksets(
    out_dir: str | Path,
    catalog: Catalog | None = None,
    limits: dict[str, int | None] | None = None,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, Path]:
    """Write ``<split>.jsonl`` files into ``out_dir``; returns ``{split: path}``.

    Without ``ranges``, rows come from the catalog's ``train`` and ``test`` goals (``limits``
    caps each split). With ``ranges`` (``{split: (start, stop)}``), rows are plain goal indices
    for the original WebShop.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    limits = limits or {}
    if ranges:
        rows = {s: [{"goal_index": i, "split": s} for i in range(a, b)] for s, (a, b) in ranges.items()}
    else:
        catalog = catalog or default_catalog()
        rows = {s: task_rows(catalog, s, limits.get(s)) for s in ("train", "test")}
    paths = {}
    for split, split_rows in rows.items():
        path = out / f"{split}.jsonl"
        path.write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows), encoding="utf-8"
        )
        paths[split] = path
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trinity_webshop.tasks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir", help="folder to write train.jsonl / test.jsonl into")
    parser.add_argument("--train", type=int, default=None, help="at most this many train tasks")
    parser.add_argument("--test", type=int, default=None, help="at most this many test tasks")
    parser.add_argument(
        "--range", nargs=3, action="append", metavar=("SPLIT", "START", "STOP"),
        help="write goal indices START..STOP-1 as SPLIT (for env: webshop); repeatable",
    )  # fmt: skip
    args = parser.parse_args(argv)
    ranges = {s: (int(a), int(b)) for s, a, b in args.range} if args.range else None
    paths = write_tasksets(args.out_dir, limits={"train": args.train, "test": args.test}, ranges=ranges)
    for split, path in paths.items():
        count = sum(1 for _ in path.open(encoding="utf-8"))
        print(f"wrote {count} {split} tasks to {path}")


if __name__ == "__main__":
    main()
