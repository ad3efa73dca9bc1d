"""Test helpers for Trinity and for plugin authors.

Plugin managers:
    ``isolated_plugin_manager()`` installs a fresh manager with entry-point autoloading off
    (so results never depend on what happens to be installed) and restores the previous one;
    ``registered_plugin(plugin, name)`` registers a plugin object for the duration of a block.
    With pytest, the fixtures ``plugin_manager`` and ``register_plugin`` (from
    :mod:`trinity.testing.fixtures`, auto-loaded as a pytest plugin) do the same.

Conformance checks (the "standard tests" a plugin runs on its own components):
    ``check_component(kind, cls)`` dispatches, through ``CHECKS`` (one check per kind of
    :data:`trinity.plugins.KINDS`), to ``check_policy_loss_fn``, ``check_advantage_fn``,
    ``check_kl_fn``, ``check_entropy_loss_fn``, ``check_sample_strategy``,
    ``check_algorithm_type``, ``check_reward_fn``, ``check_workflow`` and ``check_command``. Each raises
    ``AssertionError`` with a message saying what is wrong.
"""

from __future__ import annotations

from trinity.testing.conformance import (
    CHECKS,
    ListReader,
    check_advantage_fn,
    check_algorithm_type,
    check_command,
    check_component,
    check_entropy_loss_fn,
    check_kl_fn,
    check_policy_loss_fn,
    check_reward_fn,
    check_sample_strategy,
    check_workflow,
    make_experiences,
    make_training_tensors,
)
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin

__all__ = [
    "CHECKS",
    "ListReader",
    "check_advantage_fn",
    "check_algorithm_type",
    "check_command",
    "check_component",
    "check_entropy_loss_fn",
    "check_kl_fn",
    "check_policy_loss_fn",
    "check_reward_fn",
    "check_sample_strategy",
    "check_workflow",
    "isolated_plugin_manager",
    "make_experiences",
    "make_training_tensors",
    "registered_plugin",
]
