"""The data processor sits below the explorer: nothing in ``trinity/data/`` imports the explorer,
the rollout engines or serving, not even inside a function (the job's model server is passed
in as a :class:`~trinity.data.served_models.ModelServer`)."""

from __future__ import annotations

import ast
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "src" / "trinity" / "data"
ABOVE = ("trinity.explorer", "trinity.rollout", "trinity.serving", "trinity.launcher", "trinity.actors")


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_data_processor_imports_nothing_above_it():
    upward = sorted(
        f"{path.name} -> {name}"
        for path in sorted(DATA.glob("*.py"))
        for name in _imported(path)
        if any(name == up or name.startswith(up + ".") for up in ABOVE)
    )
    assert upward == []
