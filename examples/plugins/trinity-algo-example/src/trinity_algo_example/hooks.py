"""Hook implementations: what this plugin adds to Trinity.

The ``trinity`` entry point names this module. ``trinity plugins`` imports it, so it stays
light: the components' module imports no torch until a loss is computed.
"""

from __future__ import annotations

from trinity import hookimpl
from trinity_algo_example.vanilla_pg import VanillaPGAlgorithm, VanillaPGLoss


@hookimpl
def register_policy_loss_fns(register):
    register("vanilla_pg", VanillaPGLoss)


@hookimpl
def register_algorithm_types(register):
    register("vanilla_pg", VanillaPGAlgorithm)
