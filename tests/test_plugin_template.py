"""The plugin template (examples/plugins/trinity-algo-example) installs the way its README says,
with pip from its folder, into a fresh venv that has trinity-core, and Trinity finds it there.

The venv sees this test environment's packages (trinity-core, the algos plugin, pytest) through
a ``.pth`` file, as ``--system-site-packages`` would for a system interpreter; what pip installs
goes into the venv alone. Offline: ``--no-index --no-build-isolation`` builds with the
setuptools already here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "examples" / "plugins" / "trinity-algo-example"


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRINITY_", "PYTHON", "PIP_"))}
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=180
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, Path]:
    """``(python of a fresh venv with the template installed, the copy it was installed from)``."""
    root = tmp_path_factory.mktemp("template")
    # A copy, as a user's own project would be: setuptools writes build/ next to the sources.
    source = shutil.copytree(TEMPLATE, root / "trinity-algo-example")
    proc = _run(sys.executable, "-m", "venv", "--without-pip", root / "venv")
    assert proc.returncode == 0, proc.stderr
    python = root / "venv" / "bin" / "python"
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "outer-env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in sorted(outer))
    )
    # This environment's pip, installing into the venv's interpreter.
    proc = _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check",
        "--no-index", "--no-build-isolation", "--no-deps", source,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python, source


def test_template_is_a_complete_distribution(venv):
    python, _ = venv
    pyproject = (TEMPLATE / "pyproject.toml").read_text()
    assert "[build-system]" in pyproject and 'build-backend = "setuptools.build_meta"' in pyproject
    assert (TEMPLATE / "src" / "trinity_algo_example" / "hooks.py").is_file()  # src layout
    assert (TEMPLATE / "README.md").is_file() and (TEMPLATE / "tests").is_dir()
    # The installed distribution declares its hooks module in the entry-point group `trinity`.
    code = (
        "import importlib.metadata as m\n"
        "for ep in m.distribution('trinity-algo-example').entry_points: print(ep.group, ep.name, ep.value)"
    )
    proc = _run(python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["trinity algo-example trinity_algo_example.hooks"]
    # Nothing built is kept in the repository (.gitignore covers build/ and *.egg-info).
    tracked = _run("git", "ls-files", TEMPLATE, cwd=REPO)
    if tracked.returncode == 0:
        assert not [f for f in tracked.stdout.split() if "/build/" in f or ".egg-info" in f]


def test_installed_into_the_venv_not_here(venv):
    python, _ = venv
    code = "import importlib.metadata as m; print(m.distribution('trinity-algo-example').locate_file(''))"
    proc = _run(python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(python.parents[1])
    here = _run(sys.executable, "-c", "import trinity_algo_example")
    assert here.returncode != 0  # this environment is left as it was


def test_trinity_plugins_lists_the_installed_template(venv):
    python, _ = venv
    proc = _run(python, "-m", "trinity.cli", "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    example = rows["trinity-algo-example"]
    assert example["error"] is None
    assert example["hooks"] == ["register_algorithm_types", "register_policy_loss_fns"]
    assert example["components"] == {"algorithm_type": ["vanilla_pg"], "policy_loss_fn": ["vanilla_pg"]}
    code = (
        "from trinity.plugins import get_component\n"
        "from trinity.testing import check_component\n"
        "cls = get_component('algorithm_type', 'vanilla_pg')\n"
        "check_component('algorithm_type', cls)\n"  # its components resolve (GRPO: the algos plugin)
        "print(cls.__module__)\n"
    )
    proc = _run(python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["trinity_algo_example.vanilla_pg"]


def test_the_templates_own_tests_pass_in_the_venv(venv):
    python, source = venv
    proc = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=source)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
