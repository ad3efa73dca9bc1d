"""docs/algorithms.md has one row per registered algorithm type, and its component columns say
what the type's default_config() actually picks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trinity_algos.algorithm_types import ALGORITHM_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
COLUMNS = (
    "algorithm_type",
    "repeat",
    "advantage_fn",
    "policy_loss_fn",
    "kl_loss_fn",
    "entropy_loss_fn",
    "sample_strategy",
)


def _rows() -> dict[str, dict[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < len(COLUMNS) or not cells[0].startswith("`") or cells[1] == "repeat":
            continue
        row = dict(zip(COLUMNS, cells))
        rows[row["algorithm_type"].strip("`")] = row
    return rows


def _name(cell: str) -> str | None:
    """The component a cell names: its first backticked word; ``none`` / ``—`` mean none."""
    found = re.search(r"`([a-z0-9_]+)`", cell)
    return found.group(1) if found else None


def test_every_algorithm_type_has_a_row():
    assert set(_rows()) == set(ALGORITHM_TYPES)


@pytest.mark.parametrize("name", sorted(ALGORITHM_TYPES))
def test_the_row_matches_default_config(name):
    row, config = _rows()[name], ALGORITHM_TYPES[name].default_config()
    for key in COLUMNS[2:]:
        expected = config.get(key)
        expected = None if expected in (None, "none") else expected
        assert _name(row[key]) == expected, (name, key, row[key])
    repeat = re.search(r"\d+", row["repeat"])
    if "(" in row["repeat"] or "repeat_times" not in config:
        assert "repeat_times" not in config, (name, row["repeat"])
    else:
        assert int(repeat.group(0)) == config["repeat_times"], (name, row["repeat"])
