"""The core's shape, read from its source: no import cycle among its modules (lazy imports
inside functions count; imports under ``if TYPE_CHECKING:`` do not), no arrow from the bottom
floor (``config/``) up to the data processor, the explorer, rollout engines, serving or the
cluster, no module over 600 lines, and every module mapped in ``docs/architecture.md``."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trinity"
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
MAX_LINES = 600


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _owner(name: str) -> str | None:
    """The core module ``name`` (a module or a name in one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The core modules ``module`` imports anywhere but under ``if TYPE_CHECKING:``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(filter(None, (_owner(a.name) for a in node.names if a.name.startswith("trinity"))))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base == "trinity" or base.startswith("trinity."):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in MODULES else _owner(base)
                    if target:
                        found.add(target)
        visit(node)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones():
    # workflow.py imports buffer.rows inside a method, and experience only under TYPE_CHECKING.
    assert "trinity.buffer.rows" in GRAPH["trinity.workflow"]
    assert "trinity.experience" not in GRAPH["trinity.workflow"]


def test_no_import_cycle_among_the_core_modules():
    assert _cycles() == []


UPWARD = ("trinity.data", "trinity.explorer", "trinity.rollout", "trinity.serving", "trinity.cluster")


def test_config_imports_nothing_above_it():
    arrows = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith("trinity.config")
        for target in targets
        if any(target == up or target.startswith(up + ".") for up in UPWARD)
    )
    assert arrows == []


def test_no_core_module_is_over_600_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


BASENAMES = [p.name for p in MODULES.values()]


def _mapped(rel: str, names: list[str]) -> bool:
    """Whether a backticked name of the doc maps ``rel``: its path, a pattern matching it
    (``buffer/sql*.py``), its package folder (``monitor/``), or its file name where no other core
    module has that name (``serve_feedback.py`` in the serving row)."""
    if rel == "__init__.py":
        return "trinity-core/src/trinity/" in names
    if rel.endswith("/"):  # a package's __init__: the package is on the map
        return any(name.startswith(rel) for name in names)
    base = rel.rpartition("/")[2]
    unique = BASENAMES.count(base) == 1
    for name in names:
        if name == rel or fnmatch.fnmatch(rel, name) or (name.endswith("/") and rel.startswith(name)):
            return True
        if unique and name == base:
            return True
    return False


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(PACKAGE)) for p in MODULES.values()))
def test_every_core_module_is_mapped_in_the_architecture_doc(rel):
    """Each module appears in backticks in docs/architecture.md (see :func:`_mapped`)."""
    if rel.endswith("__init__.py") and rel != "__init__.py":
        rel = rel.removesuffix("__init__.py")
    names = re.findall(r"`([^`\s]+)`", DOC.read_text())
    assert _mapped(rel, names), f"{rel} is not mapped in docs/architecture.md"
