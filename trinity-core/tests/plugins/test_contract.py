"""The plugin contract stated once: kinds read from the hookspecs, typed lookups, public helpers."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import get_args

import pytest

from trinity import hookspecs, plugins
from trinity.plugins import KINDS, ComponentKind, TrinityPluginManager

REPO = Path(__file__).resolve().parents[3]


def _hookspec_names() -> list[str]:
    manager = TrinityPluginManager(autoload=False)
    return [name for name in dir(manager._pm.hook) if name.startswith("register_")]


def test_kinds_are_read_from_the_hookspecs():
    hooks = _hookspec_names()
    assert sorted(k.hook for k in KINDS.values()) == sorted(hooks)
    for hook in hooks:
        spec = getattr(getattr(hookspecs, hook), hookspecs.KIND_ATTRIBUTE, None)
        assert isinstance(spec, hookspecs.KindSpec), f"hookspec {hook} does not declare its kind (@registers)"
        kind = KINDS[spec.name]
        assert (kind.hook, kind.base, kind.providers, kind.instances) == (
            hook,
            spec.base,
            spec.providers,
            spec.instances,
        )
    # In hookspec order, so messages and `trinity plugins` list kinds the way the docs do.
    assert [k.hook for k in KINDS.values()] == [h for h in vars(hookspecs) if h in hooks]


def test_plugins_module_restates_no_kind_or_component_name():
    source = inspect.getsource(plugins)
    assert "KNOWN_PROVIDERS" not in source
    for kind in KINDS.values():
        assert kind.base not in source, f"plugins.py restates the base of {kind.name}"
        assert f'"{kind.hook}"' not in source, f"plugins.py restates the hook of {kind.name}"


def test_component_kind_literal_lists_every_kind():
    assert get_args(ComponentKind) == tuple(KINDS)


def _overloads(tree: ast.Module, owner: str | None) -> dict[str, str]:
    """{kind literal: return annotation} of the ``get_component`` overloads in ``owner``."""
    body = tree.body
    if owner:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    found = {}
    for node in body:
        if (
            isinstance(node, ast.FunctionDef)
            and node.name == "get_component"
            and any(ast.unparse(d) == "overload" for d in node.decorator_list)
        ):
            kind_arg = next(a for a in node.args.args if a.arg == "kind")
            match = re.fullmatch(r"Literal\['(\w+)'\]", ast.unparse(kind_arg.annotation))
            if match:
                found[match.group(1)] = ast.unparse(node.returns)
    return found


@pytest.mark.parametrize("owner", [None, "TrinityPluginManager"])
def test_get_component_has_a_typed_overload_per_kind(owner):
    tree = ast.parse(inspect.getsource(plugins))
    overloads = _overloads(tree, owner)
    assert set(overloads) == set(KINDS), "get_component needs one @overload per kind (Literal kind name)"
    for name, kind in KINDS.items():
        base = kind.base.partition(":")[2]
        assert overloads[name] == (base if kind.instances else f"type[{base}]")


def test_policy_loss_subclasses_need_no_type_ignore():
    """The base ``__call__`` ends in ``*args: Any, **kwargs: Any`` (read as ``...`` by type
    checkers), so declaring tensors by name is a compatible override."""
    from trinity.algorithm import PolicyLossFn

    params = inspect.signature(PolicyLossFn.__call__).parameters
    kinds = [p.kind for p in params.values()]
    assert kinds[-2:] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    assert all(str(params[n].annotation) == "Any" for n in ("args", "kwargs"))
    offenders = [
        f"{path.relative_to(REPO)}:{i}"
        for path in REPO.glob("trinity-plugins-*/src/**/*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        # Component __call__ overrides only: torch.autograd.Function's forward/backward (fused
        # loss kernels) legitimately narrow torch's own signature.
        if "type: ignore[override]" in line and "def __call__" in line
    ]
    assert not offenders, f"first-party plugins still silence override errors: {offenders}"


def test_policy_loss_required_tensors_ignore_varargs():
    from trinity.algorithm import PolicyLossFn

    class Loss(PolicyLossFn):
        def __call__(self, logprob, action_mask, advantages=None, *args, **kwargs):
            return logprob.sum(), {}

    assert Loss.required_tensors() == ["action_mask", "advantages"]


def test_lazy_import_is_public_and_the_old_home_is_gone(tmp_path, monkeypatch):
    import trinity.lazy

    # trinity._lazy was a private shim the core itself still used; trinity.lazy is the one path.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("trinity._lazy")
    (tmp_path / "lazy_probe_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_mod", raising=False)
    proxy = trinity.lazy.lazy_import("lazy_probe_mod")
    assert isinstance(proxy, trinity.lazy.LazyModule)
    assert "lazy_probe_mod" not in sys.modules
    assert proxy.VALUE == 42
    assert "lazy_probe_mod" in sys.modules
    assert trinity.lazy.lazy_import("lazy_probe_mod") is sys.modules["lazy_probe_mod"]


def test_docs_recommend_the_public_lazy_helper():
    text = (REPO / "docs" / "plugins.md").read_text()
    assert "trinity.lazy import lazy_import" in text
    assert "trinity._lazy" not in text


def test_buffer_reader_lives_beside_experience():
    import trinity.buffer.base as buffer_base
    import trinity.experience as experience

    for name in ("BufferReader", "BufferExhausted", "STEP_ENDED", "TIMED_OUT"):
        assert getattr(buffer_base, name) is getattr(experience, name)
    assert experience.BufferReader.__module__ == "trinity.experience"


def test_sample_strategy_module_does_not_import_the_buffer_layer():
    code = (
        "import sys, trinity.algorithm.sample_strategy\n"
        "print(sorted(m for m in sys.modules if m.startswith('trinity.buffer')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_model_wrapper_protocol_and_class_have_distinct_names():
    import trinity.workflow as workflow
    from trinity.explorer.model_wrapper import ModelWrapper

    assert "ModelWrapper" not in vars(workflow)
    assert workflow.ModelWrapperProtocol.__name__ == "ModelWrapperProtocol"
    assert ModelWrapper.__name__ == "ModelWrapper"
    with pytest.warns(DeprecationWarning, match="ModelWrapperProtocol"):
        old = workflow.ModelWrapper
    assert old is workflow.ModelWrapperProtocol
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            workflow.NoSuchName  # noqa: B018
