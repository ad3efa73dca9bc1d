"""The plugin as `trinity` sees it: registration, conformance, and a light hooks import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import trinity_math.hooks as hooks
from trinity.plugins import KINDS, UnknownComponentError, get_component, install_hint, list_components
from trinity.testing import check_component


@pytest.fixture
def math_manager(plugin_manager, register_plugin):
    """A fresh plugin manager holding only this plugin (``trinity.testing`` fixtures)."""
    register_plugin(hooks, "trinity-plugins-math")
    return plugin_manager


def test_registers_its_workflows_and_reward_fns(math_manager) -> None:
    assert set(list_components("workflow")) == set(hooks.WORKFLOWS)
    assert set(list_components("reward_fn")) == set(hooks.REWARD_FNS)
    assert get_component("workflow", "math_workflow") is hooks.workflows.MathWorkflow
    assert get_component("reward_fn", "countdown_reward") is hooks.rewards.CountdownRewardFn


def test_core_install_hints_name_this_distribution() -> None:
    """Without this plugin, an unknown workflow / reward_fn tells users what to install."""
    for kind in ("workflow", "reward_fn"):
        assert "trinity-plugins-math" in KINDS[kind].install_hint
        error = UnknownComponentError(kind, "math_workflow", [])
        assert install_hint("trinity-plugins-math") in str(error)


COMPONENTS = [("workflow", n, c) for n, c in hooks.WORKFLOWS.items()] + [
    ("reward_fn", n, c) for n, c in hooks.REWARD_FNS.items()
]


@pytest.mark.parametrize(("kind", "name", "cls"), COMPONENTS, ids=[f"{k}:{n}" for k, n, _ in COMPONENTS])
def test_conformance(kind: str, name: str, cls: type) -> None:
    kwargs = {}
    if name == "countdown_reward":
        kwargs = {"response": "<answer>1+2</answer>", "truth": '{"target": 3, "numbers": [1, 2]}'}
    if name == "rm_gallery_reward":
        # RM-Gallery (the optional extra) runs it; nox -s rm_gallery has it installed.
        pytest.importorskip(
            "rm_gallery", reason="rm-gallery is not installed here (nox -s rm_gallery has it)"
        )
        kwargs = {"init_args": {"reward_name": "math_verify_reward"}}
    check_component(kind, cls, **kwargs)


def test_hooks_import_is_light() -> None:
    """`trinity plugins` imports the hooks module: no torch, transformers, ray or math-verify."""
    heavy = ("torch", "transformers", "ray", "math_verify", "sympy")
    code = (
        f"import json, sys, trinity_math.hooks\nprint(json.dumps({{m: m in sys.modules for m in {heavy!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {m: False for m in heavy}
