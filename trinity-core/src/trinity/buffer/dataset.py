"""Loading the rows of a local dataset: jsonl / json / parquet / csv files, or HF-layout folders.

JSON and JSON-lines files are parsed here row by row, so that a broken row is reported with its
line number and skipped instead of failing the whole file (``datasets`` would reject the file, or
silently coerce mixed types). "Broken" is anything :func:`parse_row` cannot turn into a value:
invalid JSON, bytes that are not UTF-8 (files are read as bytes and decoded strictly per row),
nesting too deep, integers too long for Python. Parquet/CSV files and folders go through
``datasets`` offline.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
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


# A row nested deeper than this is refused at load time: json itself stops near the interpreter's
# recursion limit (~1000), and a row just under that would break later, in a repr(), deepcopy()
# or pickle running from a deeper stack. Real task rows are nested a few levels, tool schemas ~20.
MAX_ROW_DEPTH = 100
_TOO_DEEP = f"nested too deeply (more than {MAX_ROW_DEPTH} levels)"

# Tokens that matter for finding where a JSON value ends: strings (escapes included, maybe
# unterminated) and the structural characters. Everything else (numbers, literals, ':', blanks)
# is skipped by finditer.
_TOKEN = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[\]{},]', re.S)
_KEY = re.compile(r'\s*"(?:[^"\\]+|\\.)*"\s*:\s*', re.S)
# Bytes that are not UTF-8 come back from decode(errors="surrogateescape") as U+DC80..U+DCFF;
# a strict decode never produces these, so each one marks a bad byte.
_BAD_BYTE = re.compile("[\udc80-\udcff]")


def _too_deep(value: Any, limit: int = MAX_ROW_DEPTH) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` levels (level by level: no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        deeper = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            deeper.extend(c for c in children if isinstance(c, (dict, list)))
        if not deeper:
            return False
        level = deeper
    return True


def _may_be_too_deep(text: str) -> bool:
    """Cheap pre-check: a row with at most MAX_ROW_DEPTH brackets cannot be too deep."""
    return text.count("[") + text.count("{") > MAX_ROW_DEPTH


def _locate(text: str, index: int, line: int | None, column: int) -> str:
    """``at [line L ]column C`` of ``text[index]``, given where ``text[0]`` is in the file."""
    newlines = text.count("\n", 0, index)
    column = index - text.rfind("\n", 0, index) if newlines else column + index
    return f"at column {column}" if line is None else f"at line {line + newlines} column {column}"


def parse_row(text: str, line: int | None = None, column: int = 1) -> tuple[Any, str | None]:
    """``(value, None)`` for one JSON row, or ``(None, reason)`` when it cannot be used.

    Never raises: any failure (syntax, nesting beyond the recursion limit, integers over Python's
    int/str digit limit, bytes that are not UTF-8) becomes a short reason whose text before
    `` (`` is stable, so it can be counted. ``line``/``column`` say where ``text`` starts in
    its file (``line`` ``None``: ``text`` is a whole line), for the positions in the reason.
    """
    bad = None if text.isascii() else _BAD_BYTE.search(text)
    if bad:
        byte = ord(bad.group()) - 0xDC00
        return None, f"invalid UTF-8 (byte 0x{byte:02x} {_locate(text, bad.start(), line, column)})"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} {_locate(text, exc.pos, line, column)})"
    except RecursionError:
        return None, "nested too deeply (beyond the JSON parser's recursion limit)"
    except ValueError as exc:
        if "digits" not in str(exc):
            return None, f"unreadable JSON ({type(exc).__name__})"
        return None, f"integer too long (more than {sys.get_int_max_str_digits()} digits)"
    except Exception as exc:  # whatever else json may raise: one row never stops a dataset
        return None, f"unreadable JSON ({type(exc).__name__})"
    if _may_be_too_deep(text) and _too_deep(value):
        return None, _TOO_DEEP
    return value, None


def _iter_jsonl(path: str) -> Iterator[RawRow]:
    # Bytes, decoded line by line: a line that is not UTF-8 is one bad row, not a whole bad
    # file, and no row is silently "repaired" with U+FFFD.
    with open(path, "rb") as fh:
        for lineno, data in enumerate(fh, start=1):
            if not data.strip():
                continue
            try:
                text = data.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                why = f"invalid UTF-8 (byte 0x{data[exc.start]:02x} at column {exc.start + 1})"
                yield RawRow(None, path, lineno, why)
                continue
            value, error = parse_row(text)
            yield RawRow(value, path, lineno, error)


def _container_end(text: str, start: int) -> int:
    """Index just past the list/object opening at ``text[start]`` (or the end of ``text``)."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        c = m.group()[0]
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return m.end()
    return len(text)


def _value_end(text: str, pos: int) -> int:
    """Index of the ``,`` ``]`` or ``}`` that ends the value starting at ``pos``.

    Only tokens are scanned, never parsed, so this finds the end of values that json cannot
    read (too deep, huge integers, bad bytes, broken syntax).
    """
    depth = 0
    for m in _TOKEN.finditer(text, pos):
        c = m.group()[0]
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                return m.start()
            depth -= 1
        elif c == "," and depth == 0:
            return m.start()
    return len(text)


def _list_items(text: str, start: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each element of the JSON list whose ``[`` is at ``text[start]``."""
    pos = start + 1
    while pos < len(text):
        end = _value_end(text, pos)
        if text[pos:end].strip():
            yield pos, end
        if text[end : end + 1] != ",":
            return
        pos = end + 1


def _wrapped_list(text: str, start: int, path: str) -> int:
    """Where the single list inside the JSON object at ``text[start]`` opens."""
    lists, pos = [], start + 1
    while pos < len(text):
        end = _value_end(text, pos)
        key = _KEY.match(text, pos, end)
        if key and text[key.end() : key.end() + 1] == "[":
            lists.append(key.end())
        if text[end : end + 1] != ",":
            break
        pos = end + 1
    if len(lists) != 1:
        raise DatasetError(f"{path}: a JSON object at top level must hold exactly one list of rows")
    return lists[0]


def _rows_of_spans(text: str, spans: Iterator[tuple[int, int]], path: str) -> Iterator[RawRow]:
    """One row per element span, each parsed on its own so one bad element is one bad row."""
    line, seen, line_start = 1, 0, 0  # line number and start offset of text[seen]
    for index, (start, end) in enumerate(spans, start=1):
        span = text[start:end]
        first = start + len(span) - len(span.lstrip())
        newlines = text.count("\n", seen, first)
        if newlines:
            line += newlines
            line_start = text.rfind("\n", seen, first) + 1
        seen = first
        value, error = parse_row(span.strip(), line, first - line_start + 1)
        yield RawRow(value, path, index, error)


def _rows_of_value(data: Any, path: str) -> Iterator[RawRow]:
    """The rows of a whole-file JSON value that parsed: a list, or an object holding one."""
    if isinstance(data, dict):
        # {"data": [...]} or {"train": [...], "test": [...]}: take the single list inside.
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{path}: a JSON object at top level must hold exactly one list of rows")
        data = lists[0]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of rows or JSON lines, got {type(data).__name__}")
    for i, value in enumerate(data, start=1):
        if _too_deep(value):
            yield RawRow(None, path, i, _TOO_DEEP)
        else:
            yield RawRow(value, path, i)


def _iter_json(path: str) -> Iterator[RawRow]:
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # Keep going: each bad byte becomes a marker that fails only the row holding it.
        text = data.decode("utf-8-sig", errors="surrogateescape")
    else:
        try:
            value = json.loads(text)
        except Exception:  # broken syntax, or one hostile element: read element by element below
            pass
        else:
            yield from _rows_of_value(value, path)
            return
    start = len(text) - len(text.lstrip())
    opener = text[start : start + 1]
    if opener == "[":
        yield from _rows_of_spans(text, _list_items(text, start), path)
    elif opener == "{" and not text[_container_end(text, start) :].strip():
        # One object: {"data": [...]}.
        yield from _rows_of_spans(text, _list_items(text, _wrapped_list(text, start, path)), path)
    else:
        # Many ".json" datasets are really JSON lines.
        yield from _iter_jsonl(path)


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
