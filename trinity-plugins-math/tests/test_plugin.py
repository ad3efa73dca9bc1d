"""The plugin as `trinity` sees it: registration, conformance, and a light hooks import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import trinity_math.hooks as hooks
from trinity.plugins import KNOWN_PROVIDERS, TrinityPluginManager, get_component, list_components, set_manager
from trinity.testing import check_component


@pytest.fixture
def math_manager():
    """A fresh plugin manager holding only this plugin, installed process-wide for the test."""
    manager = TrinityPluginManager(autoload=False)
    manager.register_plugin(hooks, "trinity-plugins-math")
    previous = set_manager(manager)
    try:
        yield manager
    finally:
        set_manager(previous)


def test_registers_every_name_the_core_advertises(math_manager) -> None:
    advertised = KNOWN_PROVIDERS["trinity-plugins-math"]
    assert set(list_components("workflow")) == set(advertised["workflow"])
    assert set(list_components("reward_fn")) == set(advertised["reward_fn"])
    assert get_component("workflow", "math_workflow") is hooks.workflows.MathWorkflow
    assert get_component("reward_fn", "countdown_reward") is hooks.rewards.CountdownRewardFn


COMPONENTS = [("workflow", n, c) for n, c in hooks.WORKFLOWS.items()] + [
    ("reward_fn", n, c) for n, c in hooks.REWARD_FNS.items()
]


@pytest.mark.parametrize(("kind", "name", "cls"), COMPONENTS, ids=[f"{k}:{n}" for k, n, _ in COMPONENTS])
def test_conformance(kind: str, name: str, cls: type) -> None:
    kwargs = {}
    if name == "countdown_reward":
        kwargs = {"response": "<answer>1+2</answer>", "truth": '{"target": 3, "numbers": [1, 2]}'}
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
