"""Loading the rows of a local dataset: jsonl / json / parquet / csv files, or HF-layout folders.

JSON and JSON-lines files are parsed here line by line, so that a broken line is reported with its
line number and skipped instead of failing the whole file (``datasets`` would reject the file, or
silently coerce mixed types). Parquet/CSV files and folders go through ``datasets`` offline.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset cannot be used at all (missing path, unreadable file, empty split)."""


@dataclass
class RawRow:
    """One row as read from disk: ``value`` (normally a dict), where it came from, and why it
    is unusable when it could not even be parsed (``error``)."""

    value: Any
    source: str
    row: int  # 1-based line number (json/jsonl) or 1-based row index (datasets)
    error: str | None = None

    @property
    def where(self) -> str:
        """``file:line`` for messages."""
        return f"{self.source}:{self.row}"


def _iter_jsonl(path: str) -> Iterator[RawRow]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield RawRow(json.loads(line), path, lineno)
            except json.JSONDecodeError as exc:
                yield RawRow(None, path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})")


def _iter_json(path: str) -> Iterator[RawRow]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Many ".json" datasets are really JSON lines.
        yield from _iter_jsonl(path)
        return
    if isinstance(data, dict):
        # {"data": [...]} or {"train": [...], "test": [...]}: take the single list inside.
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{path}: a JSON object at top level must hold exactly one list of rows")
        data = lists[0]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of rows or JSON lines, got {type(data).__name__}")
    for i, value in enumerate(data, start=1):
        yield RawRow(value, path, i)


def _load_with_datasets(
    path: str, *, split: str, subset_name: str | None, builder: str | None
) -> list[RawRow]:
    # Local files only: never let `datasets` reach for the Hub.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    try:
        if builder is not None:
            ds = datasets.load_dataset(builder, data_files=path, split="train")
        else:
            ds = datasets.load_dataset(path, name=subset_name, split=split)
    except ValueError as exc:
        msg = str(exc)
        if "split" in msg.lower():
            raise DatasetError(f"{path}: no split {split!r} ({msg.splitlines()[0]})") from exc
        raise DatasetError(f"{path}: cannot load dataset: {msg.splitlines()[0]}") from exc
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DatasetError(f"{path}: cannot load dataset ({type(exc).__name__}: {first})") from exc
    source = path if builder is not None else f"{path} [split {split}]"
    return [RawRow(value, source, i) for i, value in enumerate(ds, start=1)]


def _split_file(folder: str, split: str) -> str | None:
    """``<folder>/<split>.jsonl`` (or .json): read those ourselves for row-precise errors."""
    for ext in (".jsonl", ".json"):
        candidate = os.path.join(folder, split + ext)
        if os.path.isfile(candidate):
            return candidate
    return None


def load_rows(path: str | None, *, split: str = "train", subset_name: str | None = None) -> list[RawRow]:
    """Every row of the dataset at ``path`` (file or folder), in file order.

    Raises :class:`DatasetError` when the path is missing or the data cannot be read at all.
    """
    if not path:
        raise DatasetError("no path given")
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise DatasetError(f"{path} does not exist")
    if os.path.isdir(path):
        simple = None if subset_name else _split_file(path, split)
        if simple is not None:
            return load_rows(simple)
        return _load_with_datasets(path, split=split, subset_name=subset_name, builder=None)
    lower = path.lower()
    if lower.endswith(".jsonl"):
        return list(_iter_jsonl(path))
    if lower.endswith(".json"):
        return list(_iter_json(path))
    if lower.endswith(".parquet"):
        return _load_with_datasets(path, split=split, subset_name=None, builder="parquet")
    if lower.endswith(".csv"):
        return _load_with_datasets(path, split=split, subset_name=None, builder="csv")
    raise DatasetError(
        f"{path}: unsupported file type; use .jsonl, .json, .parquet, .csv or a dataset folder"
    )
