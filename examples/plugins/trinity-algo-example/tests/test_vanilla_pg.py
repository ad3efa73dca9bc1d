"""The plugin's own tests: trinity-core's fixtures and conformance checks (pytest loads them)."""

from __future__ import annotations

from trinity_algo_example import hooks
from trinity_algo_example.vanilla_pg import VanillaPGAlgorithm, VanillaPGLoss

import trinity_algos.hooks
from trinity.plugins import get_component
from trinity.testing import check_component


def test_components_are_registered_and_conform(register_plugin):
    # A fresh plugin manager with this plugin and the one it depends on (GRPO's advantages).
    register_plugin(trinity_algos.hooks, "trinity-plugins-algos")
    register_plugin(hooks, "trinity-algo-example")
    assert get_component("policy_loss_fn", "vanilla_pg") is VanillaPGLoss
    assert get_component("algorithm_type", "vanilla_pg") is VanillaPGAlgorithm
    check_component("policy_loss_fn", VanillaPGLoss)  # base class, shapes, a finite loss
    check_component("algorithm_type", VanillaPGAlgorithm)  # flags, and its components exist
