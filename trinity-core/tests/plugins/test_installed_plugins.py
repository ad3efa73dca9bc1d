"""Plugins installed the way users get them: a built wheel, and a broken distribution.

The example plugin under ``examples/plugins/trinity-algo-example`` is built into a wheel and
installed into a private ``--target`` folder that the subprocesses put on ``PYTHONPATH``, so
the test environment itself is never modified.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "plugins" / "trinity-algo-example"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the installed example plugin and a broken plugin distribution."""
    root = tmp_path_factory.mktemp("site")
    wheels = root / "wheels"
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = shutil.copytree(EXAMPLE, root / "source", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    # --no-build-isolation: build with the setuptools already installed (no network needed).
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source))
    target = root / "target"
    _pip("install", "--no-deps", "--no-index", "--target", str(target), *map(str, wheels.glob("*.whl")))
    # A distribution whose plugin module fails at import, as a half-installed package would.
    (target / "broken_plugin.py").write_text("import a_module_that_is_not_installed\n")
    dist_info = target / "trinity_broken_example-0.0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: trinity-broken-example\nVersion: 0.0.1\n"
    )
    (dist_info / "entry_points.txt").write_text("[trinity]\nbroken = broken_plugin\n")
    return target


def _run(site: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    for var in ("TRINITY_LOAD_PLUGINS", "TRINITY_DISABLE_PLUGINS", "TRINITY_PLUGIN_DIRS"):
        full_env.pop(var, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env, timeout=120)


def _plugins_json(site: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    proc = _run(site, "-m", "trinity.cli", "plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {row["name"]: row for row in json.loads(proc.stdout)}


def test_installed_example_is_listed_with_its_components(site):
    rows = _plugins_json(site)
    example = rows["trinity-algo-example"]
    assert example["version"] == "0.1.0"
    assert example["error"] is None
    assert example["hooks"] == ["register_algorithm_types", "register_policy_loss_fns"]
    assert example["components"] == {"algorithm_type": ["vanilla_pg"], "policy_loss_fn": ["vanilla_pg"]}
    # The first-party plugin distributions are there too, and still work beside a broken one.
    for dist in ("trinity-plugins-algos", "trinity-plugins-math", "trinity-plugins-webshop"):
        assert rows[dist]["error"] is None, rows[dist]


def test_broken_plugin_is_listed_with_its_error(site):
    broken = _plugins_json(site)["trinity-broken-example"]
    assert "ModuleNotFoundError while importing broken_plugin" in broken["error"]
    assert "a_module_that_is_not_installed" in broken["error"]


def test_get_component_finds_the_installed_plugin(site):
    code = textwrap.dedent(
        """
        from trinity.plugins import get_component
        from trinity.testing import check_policy_loss_fn
        cls = get_component("policy_loss_fn", "vanilla_pg")
        check_policy_loss_fn(cls)
        print(cls.__module__, get_component("algorithm_type", "vanilla_pg").default_config()["policy_loss_fn"])
        """
    )
    proc = _run(site, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["trinity_algo_example.vanilla_pg", "vanilla_pg"]


def test_run_fails_fast_naming_the_broken_distribution(site, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("project: p\nname: n\n")
    proc = _run(site, "-m", "trinity.cli", "run", "--config", str(config), "--dry-run")
    assert proc.returncode == 3
    assert "trinity-broken-example" in proc.stderr
    assert "TRINITY_DISABLE_PLUGINS=trinity-broken-example" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_load_and_disable_lists(site):
    only = _plugins_json(site, env={"TRINITY_LOAD_PLUGINS": "trinity-algo-example"})
    assert list(only) == ["trinity-algo-example"]
    assert _plugins_json(site, env={"TRINITY_LOAD_PLUGINS": ""}) == {}
    without = _plugins_json(
        site, env={"TRINITY_DISABLE_PLUGINS": "trinity-broken-example,trinity_plugins_webshop"}
    )
    assert "trinity-broken-example" not in without and "trinity-plugins-webshop" not in without
    assert "trinity-algo-example" in without
    proc = _run(site, "-m", "trinity.cli", "plugins", "--all", "--json", env={"TRINITY_LOAD_PLUGINS": ""})
    disabled = {row["name"]: row["disabled"] for row in json.loads(proc.stdout)}
    assert disabled["trinity-algo-example"] == "not in TRINITY_LOAD_PLUGINS"


def test_plugins_table_output(site):
    proc = _run(site, "-m", "trinity.cli", "plugins")
    assert proc.returncode == 0
    assert "trinity-algo-example 0.1.0" in proc.stdout
    assert "policy_loss_fn: vanilla_pg" in proc.stdout
    assert "error: ModuleNotFoundError" in proc.stdout
    version = _run(site, "-m", "trinity.cli", "--version")
    assert version.stdout.startswith("trinity-core ")
    assert "trinity-algo-example 0.1.0" in version.stdout
    assert "trinity-broken-example 0.0.1 (failed to load)" in version.stdout
