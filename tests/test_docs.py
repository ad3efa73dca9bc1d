"""The docs cannot drift: every hook has a section in docs/plugins.md with its exact signature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from trinity import hookspecs
from trinity.plugins import KINDS, TrinityPluginManager

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _hook_names() -> list[str]:
    manager = TrinityPluginManager(autoload=False)
    return sorted(name for name in dir(manager._pm.hook) if name.startswith("register_"))


def test_every_hook_is_documented_with_its_signature():
    text = (DOCS / "plugins.md").read_text()
    headings = set(re.findall(r"^### `(\w+)\((.*?)\)`", text, flags=re.M))
    for name in _hook_names():
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert (name, params) in headings, f"docs/plugins.md lacks a '### `{name}({params})`' section"


def test_docs_name_no_hook_that_does_not_exist():
    text = (DOCS / "plugins.md").read_text()
    documented = set(re.findall(r"^### `(\w+)\(", text, flags=re.M))
    assert documented == set(_hook_names())


def test_every_hook_has_a_docstring_and_a_kind():
    for name in _hook_names():
        assert getattr(hookspecs, name).__doc__, f"hookspec {name} has no docstring"
    assert {k.hook for k in KINDS.values()} == set(_hook_names())
