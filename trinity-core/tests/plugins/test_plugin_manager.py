"""The plugin manager: registration, type checks, duplicates, broken plugins, allow/deny lists."""

from __future__ import annotations

import textwrap
import types

import pytest

from trinity import hookimpl
from trinity.algorithm import AdvantageFn, AlgorithmType, PolicyLossFn
from trinity.plugins import (
    KINDS,
    PluginError,
    PluginLoadError,
    TrinityPluginManager,
    UnknownComponentError,
    get_component,
    install_hint,
    list_components,
)
from trinity.workflow import Workflow


class MyLoss(PolicyLossFn):
    def __call__(self, logprob, action_mask, advantages, **kwargs):
        return (-(advantages * logprob) * action_mask).sum(), {}


class MyAlgo(AlgorithmType):
    pass


class NotAWorkflow:
    pass


def _module(**attrs):
    module = types.ModuleType("test_plugin")
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _plugin(**hooks):
    """A plugin object whose hooks register the given {hook_name: {name: component}}."""
    ns = types.ModuleType("test_plugin")
    for hook, comps in hooks.items():

        def impl(register, _comps=comps):
            for name, comp in _comps.items():
                register(name, comp)

        impl.__name__ = hook
        setattr(ns, hook, hookimpl(impl))
    return ns


def test_register_and_lookup(plugin_manager):
    plugin_manager.register_plugin(
        _plugin(register_policy_loss_fns={"mine": MyLoss}, register_algorithm_types={"algo": MyAlgo}), "p1"
    )
    assert get_component("policy_loss_fn", "mine") is MyLoss
    assert get_component("algorithm_type", "algo") is MyAlgo
    assert list_components("policy_loss_fn") == ["mine"]
    assert plugin_manager.component_provider("policy_loss_fn", "mine") == "p1"
    (info,) = plugin_manager.plugin_infos()
    assert info.hooks == ["register_algorithm_types", "register_policy_loss_fns"]
    assert info.components == {"policy_loss_fn": ["mine"], "algorithm_type": ["algo"]}


def test_unknown_component_lists_installed_and_suggests(plugin_manager):
    plugin_manager.register_plugin(_plugin(register_policy_loss_fns={"mine": MyLoss}), "p1")
    with pytest.raises(UnknownComponentError) as err:
        get_component("policy_loss_fn", "mien")
    msg = str(err.value)
    assert "Unknown policy_loss_fn 'mien'" in msg
    assert "Did you mean 'mine'?" in msg
    assert "Installed policy_loss_fns: mine." in msg
    with pytest.raises(UnknownComponentError, match=r"Installed sample_strategies: \(none\)\."):
        get_component("sample_strategy", "nope")


def test_unknown_name_hints_the_distribution_of_its_kind(plugin_manager):
    with pytest.raises(UnknownComponentError) as err:
        get_component("algorithm_type", "grpo")
    assert f"More algorithm_types: {install_hint('trinity-plugins-algos')}." in str(err.value)
    with pytest.raises(UnknownComponentError, match="trinity-plugins-webshop"):
        get_component("workflow", "webshop_workflow")


def test_wrong_type_is_rejected_and_rolled_back(plugin_manager):
    bad = _plugin(register_policy_loss_fns={"ok": MyLoss}, register_workflows={"wf": NotAWorkflow})
    with pytest.raises(PluginError, match=r"workflow 'wf' must be a subclass of trinity\.workflow\.Workflow"):
        plugin_manager.register_plugin(bad, "bad")
    # Nothing of a rejected plugin stays registered.
    assert list_components("policy_loss_fn") == []
    assert plugin_manager.plugin_infos() == []


def test_duplicate_names_name_both_plugins(plugin_manager):
    plugin_manager.register_plugin(_plugin(register_policy_loss_fns={"same": MyLoss}), "first")
    with pytest.raises(PluginError) as err:
        plugin_manager.register_plugin(_plugin(register_policy_loss_fns={"same": MyLoss}), "second")
    assert "duplicate policy_loss_fn 'same'" in str(err.value)
    assert "'first'" in str(err.value) and "'second'" in str(err.value)
    assert plugin_manager.component_provider("policy_loss_fn", "same") == "first"


def test_misspelled_hook_is_an_error(plugin_manager):
    ns = _module(register_workflow=hookimpl(lambda register: None))
    with pytest.raises(
        PluginError, match=r"unknown hook.*'register_workflow'.*did you mean 'register_workflows'"
    ):
        plugin_manager.register_plugin(ns, "typo")


def test_hook_with_wrong_argument_is_an_error(plugin_manager):
    def register_workflows(registry):  # wrong argument name
        pass

    ns = _module(register_workflows=hookimpl(register_workflows))
    with pytest.raises(PluginError, match="invalid hook implementation"):
        plugin_manager.register_plugin(ns, "badargs")


def test_hook_raising_is_reported(plugin_manager):
    def register_workflows(register):
        raise RuntimeError("boom")

    ns = _module(register_workflows=hookimpl(register_workflows))
    with pytest.raises(PluginError, match="RuntimeError while calling its hooks: boom"):
        plugin_manager.register_plugin(ns, "raiser")


def test_unregister_removes_components(plugin_manager):
    plugin_manager.register_plugin(_plugin(register_policy_loss_fns={"mine": MyLoss}), "p1")
    plugin_manager.unregister_plugin("p1")
    assert list_components("policy_loss_fn") == []


def test_register_plugin_fixture_cleans_up(register_plugin, plugin_manager):
    register_plugin(
        _plugin(
            register_advantage_fns={"adv": type("A", (AdvantageFn,), {"__call__": lambda s, b: (b, {})})}
        ),
        "x",
    )
    assert list_components("advantage_fn") == ["adv"]


def test_unknown_kind(plugin_manager):
    with pytest.raises(PluginError, match="unknown component kind 'policy'"):
        get_component("policy", "x")


def test_every_kind_has_a_hook_base_and_install_hint():
    for kind in KINDS.values():
        assert kind.base_class().__name__
        assert kind.hook.startswith("register_")
        # operators: the core's built-ins, no first-party distribution adds more
        assert kind.install_hint.startswith("pip install ") or (kind.name, kind.providers) == ("operator", ())


def _write_plugin_dir(tmp_path, files):
    d = tmp_path / "plugins"
    d.mkdir()
    for name, body in files.items():
        (d / name).write_text(textwrap.dedent(body))
    return d


GOOD_DIR_PLUGIN = """
    from trinity import hookimpl
    from trinity.workflow import Workflow

    class DirWorkflow(Workflow):
        def run(self):
            return []

    @hookimpl
    def register_workflows(register):
        register("dir_workflow", DirWorkflow)
"""


def test_plugin_dir_loads_py_files_and_isolates_broken_ones(tmp_path):
    d = _write_plugin_dir(
        tmp_path,
        {
            "good.py": GOOD_DIR_PLUGIN,
            "broken.py": "raise ImportError('missing dep xyz')\n",
            "_private.py": "x = 1\n",
        },
    )
    manager = TrinityPluginManager(autoload=False, plugin_dirs=[d])
    assert issubclass(manager.get_component("workflow", "dir_workflow"), Workflow)
    infos = {i.name: i for i in manager.plugin_infos()}
    assert set(infos) == {"plugins/good.py", "plugins/broken.py"}
    assert "ImportError while importing" in infos["plugins/broken.py"].error
    assert "missing dep xyz" in infos["plugins/broken.py"].error
    with pytest.raises(PluginLoadError, match=r"plugins/broken\.py") as err:
        manager.check_plugins()
    assert "TRINITY_DISABLE_PLUGINS=" in str(err.value)


def test_plugin_dir_must_exist(tmp_path):
    with pytest.raises(PluginError, match="not a directory"):
        TrinityPluginManager(autoload=False, plugin_dirs=[tmp_path / "nope"])


def test_plugin_dir_added_after_load_is_loaded(tmp_path):
    manager = TrinityPluginManager(autoload=False)
    assert manager.list_components("workflow") == []
    manager.add_plugin_dir(_write_plugin_dir(tmp_path, {"good.py": GOOD_DIR_PLUGIN}))
    assert manager.list_components("workflow") == ["dir_workflow"]


def test_disable_list_applies_to_plugin_dir_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_DISABLE_PLUGINS", "good")
    manager = TrinityPluginManager(
        autoload=False, plugin_dirs=[_write_plugin_dir(tmp_path, {"good.py": GOOD_DIR_PLUGIN})]
    )
    assert manager.list_components("workflow") == []
    (info,) = manager.plugin_infos(include_disabled=True)
    assert info.disabled == "in TRINITY_DISABLE_PLUGINS"


def test_hook_tracing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRINITY_TRACE_HOOKS", "1")
    manager = TrinityPluginManager(autoload=False)
    manager.register_plugin(_plugin(register_policy_loss_fns={"mine": MyLoss}), "traced")
    assert "calling register_policy_loss_fns on traced" in capsys.readouterr().err
