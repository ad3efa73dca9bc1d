"""Dotted component names (``pkg.module.Class``) are imported and type-checked like registered ones."""

from __future__ import annotations

import textwrap

import pytest

from trinity.config.algorithm_defaults import lookup_component
from trinity.config.errors import ConfigError
from trinity.plugins import TrinityPluginManager, UnknownComponentError, get_component
from trinity.workflow import Workflow

WORKFLOW_MODULE = """
    from trinity.workflow import Workflow

    class PathWorkflow(Workflow):
        def run(self):
            return []

    class NotAWorkflow:
        pass

    value = 3
"""


def _write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    return folder


@pytest.fixture
def installed_module(tmp_path, monkeypatch):
    """``cp_pkg.flows`` importable from ``sys.path``, as an installed package would be."""
    _write(tmp_path / "site", {"cp_pkg/__init__.py": "", "cp_pkg/flows.py": WORKFLOW_MODULE})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield "cp_pkg.flows"
    import sys

    for name in [m for m in sys.modules if m == "cp_pkg" or m.startswith("cp_pkg.")]:
        del sys.modules[name]


def test_installed_class_path_is_imported_and_checked(plugin_manager, installed_module):
    cls = get_component("workflow", f"{installed_module}.PathWorkflow")
    assert issubclass(cls, Workflow) and cls.__name__ == "PathWorkflow"
    assert (
        plugin_manager.component_provider("workflow", f"{installed_module}.PathWorkflow") == installed_module
    )


def test_class_path_of_the_wrong_kind_is_rejected(plugin_manager, installed_module):
    with pytest.raises(UnknownComponentError, match=r"is not a subclass of trinity\.workflow\.Workflow"):
        get_component("workflow", f"{installed_module}.NotAWorkflow")
    with pytest.raises(UnknownComponentError, match=r"is not a subclass of trinity\.workflow\.RewardFn"):
        get_component("reward_fn", f"{installed_module}.PathWorkflow")
    with pytest.raises(UnknownComponentError, match="is not a subclass"):
        get_component("workflow", f"{installed_module}.value")


def test_class_path_that_does_not_import_says_why(plugin_manager):
    with pytest.raises(UnknownComponentError) as err:
        get_component("workflow", "no_such_pkg_xyz.flows.Flow")
    msg = str(err.value)
    assert "Cannot use workflow 'no_such_pkg_xyz.flows.Flow'" in msg
    assert "importing 'no_such_pkg_xyz.flows' as a class path failed" in msg
    assert "ModuleNotFoundError" in msg
    assert err.value.installed == []


def test_class_path_missing_attribute(plugin_manager, installed_module):
    with pytest.raises(UnknownComponentError, match="has no attribute 'Missing'"):
        get_component("workflow", f"{installed_module}.Missing")


def test_class_path_whose_module_raises_is_reported(plugin_manager, tmp_path, monkeypatch):
    _write(tmp_path, {"cp_raises.py": "raise RuntimeError('broken at import')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownComponentError, match="RuntimeError: broken at import"):
        get_component("workflow", "cp_raises.Flow")


def test_registered_names_win_over_class_paths(plugin_manager, register_plugin):
    from trinity import hookimpl

    class Dotted(Workflow):
        def run(self):
            return []

    class Plugin:
        @hookimpl
        def register_workflows(self, register):
            register("os.path", Dotted)

    register_plugin(Plugin(), "dotted")
    assert get_component("workflow", "os.path") is Dotted


def test_class_path_from_a_plugin_dir_file_is_the_loaded_module(tmp_path):
    folder = _write(
        tmp_path / "plugins",
        {
            "dir_flows.py": WORKFLOW_MODULE
            + """
    from trinity import hookimpl

    @hookimpl
    def register_workflows(register):
        register("dir_path_workflow", PathWorkflow)
""",
        },
    )
    manager = TrinityPluginManager(autoload=False, plugin_dirs=[folder])
    by_path = manager.get_component("workflow", "dir_flows.PathWorkflow")
    # The same class object the plugin registered: the file is imported once.
    assert by_path is manager.get_component("workflow", "dir_path_workflow")


def test_class_path_from_a_plugin_dir_package(tmp_path):
    folder = _write(
        tmp_path / "plugins",
        {
            "dirpkg_cp/__init__.py": "",
            "dirpkg_cp/flows.py": "from dirpkg_cp.base import PathWorkflow\n",
            "dirpkg_cp/base.py": WORKFLOW_MODULE,
        },
    )
    manager = TrinityPluginManager(autoload=False, plugin_dirs=[folder])
    cls = manager.get_component("workflow", "dirpkg_cp.flows.PathWorkflow")
    assert cls.__module__ == "dirpkg_cp.base"
    with pytest.raises(UnknownComponentError, match="is a module, not a package"):
        _write(folder, {"flat_cp.py": WORKFLOW_MODULE})
        manager.get_component("workflow", "flat_cp.sub.PathWorkflow")


def test_a_dotless_unknown_name_is_not_imported(plugin_manager):
    with pytest.raises(UnknownComponentError, match=r"^Unknown workflow 'os'\."):
        get_component("workflow", "os")


def test_config_lookups_accept_class_paths(plugin_manager, installed_module):
    """Config validation resolves component names through get_component, so class paths work
    there too, and a bad one is a ConfigError at the key."""
    assert lookup_component("workflow", f"{installed_module}.PathWorkflow", "buffer.default_workflow_type")
    with pytest.raises(
        ConfigError, match=r"is not a subclass of trinity\.algorithm\.policy_loss\.PolicyLossFn"
    ):
        lookup_component("policy_loss_fn", f"{installed_module}.PathWorkflow", "algorithm.policy_loss_fn")
