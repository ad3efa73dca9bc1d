"""trinity-studio as a plugin: its entry point registers ``trinity studio`` (hook
``register_commands``), ``trinity plugins`` lists it, and blocking it says so."""

from __future__ import annotations

import os
import subprocess
import sys

from trinity.plugins import TrinityPluginManager, set_manager
from trinity.testing import check_component
from trinity_studio.cli import studio


def _studio_help(**env: str) -> subprocess.CompletedProcess:
    """``trinity studio --help`` in a fresh process with ``env`` as the plugin lists."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "studio", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**full_env, **env},
    )


def test_the_entry_point_registers_the_studio_command():
    manager = TrinityPluginManager()  # entry points loaded, as `trinity` does
    previous = set_manager(manager)
    try:
        (info,) = [i for i in manager.plugin_infos() if i.name == "trinity-studio"]
        assert info.error is None
        assert info.hooks == ["register_commands"] and info.components == {"command": ["studio"]}
        assert manager.get_component("command", "studio") is studio
        check_component("command", studio)
    finally:
        set_manager(previous)


def test_blocked_studio_says_why():
    assert _studio_help().returncode == 0
    proc = _studio_help(TRINITY_DISABLE_PLUGINS="trinity-studio")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == "Error: 'trinity studio' comes from trinity-studio, which is in TRINITY_DISABLE_PLUGINS"
    )
    proc = _studio_help(TRINITY_LOAD_PLUGINS="trinity-plugins-math")
    assert proc.stderr.strip() == (
        "Error: 'trinity studio' comes from trinity-studio, which is not in TRINITY_LOAD_PLUGINS"
    )


def test_the_static_page_ships_inside_the_package():
    from trinity_studio.app import STATIC

    names = {p.name for p in STATIC.iterdir()}
    assert {"index.html", "studio.js", "studio.css"} <= names
