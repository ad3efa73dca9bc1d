"""``trinity.plugins.install_hint``: no Trinity distribution is on PyPI, so every message that says
how to install one gives a command that installs it from a clone's folder."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import trinity
from trinity import install_hints
from trinity.plugins import KINDS, UnknownComponentError, install_hint

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def clone(tmp_path, monkeypatch) -> Path:
    """A fake clone holding the five distributions' folders, as the running core's source."""
    root = tmp_path / "Trinity"
    for dist in ("trinity-core", "trinity-plugins-algos", "trinity-plugins-math", "trinity-plugins-webshop", "trinity-plugins-agents"):  # fmt: skip
        (root / dist).mkdir(parents=True)
        (root / dist / "pyproject.toml").write_text("[project]\n")
    monkeypatch.setattr(install_hints, "_clone_root", lambda: root)
    monkeypatch.setattr(install_hints, "_direct_url", lambda dist: {})
    return root


def test_at_the_clones_root_the_folder_is_relative(clone, monkeypatch):
    monkeypatch.chdir(clone)
    assert install_hint("trinity-plugins-math") == "pip install ./trinity-plugins-math"
    assert install_hint("trinity-plugins-algos", "trinity-plugins-math") == (
        "pip install ./trinity-plugins-algos ./trinity-plugins-math"
    )
    # an extra is quoted for the shell, and pip reads it off the folder
    hint = install_hint("trinity-core", extra="data-juicer")
    assert hint == "pip install './trinity-core[data-juicer]'"
    assert shlex.split(hint) == ["pip", "install", "./trinity-core[data-juicer]"]


def test_elsewhere_the_folder_is_absolute(clone, monkeypatch, tmp_path):
    elsewhere = tmp_path / "my-project"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert install_hint("trinity-plugins-math") == f"pip install {clone / 'trinity-plugins-math'}"
    monkeypatch.chdir(clone / "trinity-core")  # inside the clone, but not at its root
    assert install_hint("trinity-plugins-math") == f"pip install {clone / 'trinity-plugins-math'}"


def test_an_extra_of_an_editable_install_stays_editable(clone, monkeypatch):
    monkeypatch.chdir(clone)
    editable = {"url": f"file://{clone / 'trinity-core'}", "dir_info": {"editable": True}}
    monkeypatch.setattr(install_hints, "_direct_url", lambda dist: editable if dist == "trinity-core" else {})
    assert install_hint("trinity-core", extra="verl") == "pip install -e './trinity-core[verl]'"
    # a distribution not installed yet: a plain install
    assert install_hint("trinity-plugins-math") == "pip install ./trinity-plugins-math"


def test_without_a_known_clone_the_hint_says_where_to_run_it(monkeypatch):
    monkeypatch.setattr(install_hints, "_clone_root", lambda: None)  # e.g. installed from a wheel
    monkeypatch.setattr(install_hints, "_direct_url", lambda dist: {})
    assert (
        install_hint("trinity-plugins-math") == "pip install ./trinity-plugins-math (from a clone of Trinity)"
    )
    assert install_hint("trinity-core", extra="wandb") == (
        "pip install './trinity-core[wandb]' (from a clone of Trinity)"
    )
    assert KINDS["workflow"].install_hint == (
        "pip install ./trinity-plugins-math (math), ./trinity-plugins-webshop (webshop) or "
        "./trinity-plugins-agents (tool calling, FrozenLake, ALFWorld, AgentScope ReAct) "
        "(from a clone of Trinity)"
    )


def test_unknown_names_hint_the_folders_of_their_kind(clone, monkeypatch):
    monkeypatch.chdir(clone)
    error = str(UnknownComponentError("algorithm_type", "grpo", []))
    assert error.endswith("More algorithm_types: pip install ./trinity-plugins-algos.")
    assert "pip install ./trinity-plugins-math (math), ./trinity-plugins-webshop (webshop) or" in str(
        UnknownComponentError("workflow", "webshop_workflow", [])
    )


@pytest.mark.skipif(
    Path(trinity.__file__).resolve() != REPO / "trinity-core" / "src" / "trinity" / "__init__.py",
    reason="trinity-core is not an editable install of this clone",
)
def test_the_clone_of_an_editable_install_is_found(monkeypatch):
    install_hints._clone_root.cache_clear()
    try:
        assert install_hints._clone_root() == REPO
        monkeypatch.chdir(REPO)
        assert install_hint("trinity-plugins-webshop") == "pip install ./trinity-plugins-webshop"
    finally:
        install_hints._clone_root.cache_clear()


def test_trinity_plugins_without_plugins_says_how_to_install_them(clone, monkeypatch, plugin_manager):
    from click.testing import CliRunner

    from trinity.cli import cli

    monkeypatch.chdir(clone)
    result = CliRunner().invoke(cli, ["plugins"])  # the fixture's manager: no plugin loaded
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        "No Trinity plugins installed. Try: pip install ./trinity-plugins-algos ./trinity-plugins-math"
    )
