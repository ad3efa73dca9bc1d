"""The pluggy hook specifications of Trinity's plugin API (v1).

Every hook is called with exactly one keyword argument, ``register``: a callable
``register(name: str, component: type)``. The host owns the callback, so it can check the type
of what a plugin hands it and remember which plugin registered each name.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT_NAME = "trinity"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[[str, type], None]


@hookspec
def register_workflows(register: Register) -> None:
    """Register ``Workflow`` subclasses (kind ``workflow``), e.g. ``register("math_workflow", MathWorkflow)``."""


@hookspec
def register_reward_fns(register: Register) -> None:
    """Register ``RewardFn`` subclasses (kind ``reward_fn``)."""


@hookspec
def register_advantage_fns(register: Register) -> None:
    """Register ``AdvantageFn`` subclasses (kind ``advantage_fn``)."""


@hookspec
def register_policy_loss_fns(register: Register) -> None:
    """Register ``PolicyLossFn`` subclasses (kind ``policy_loss_fn``)."""


@hookspec
def register_kl_fns(register: Register) -> None:
    """Register ``KLFn`` subclasses (kind ``kl_fn``); used both as KL loss and KL reward penalty."""


@hookspec
def register_entropy_loss_fns(register: Register) -> None:
    """Register ``EntropyLossFn`` subclasses (kind ``entropy_loss_fn``)."""


@hookspec
def register_sample_strategies(register: Register) -> None:
    """Register ``SampleStrategy`` subclasses (kind ``sample_strategy``)."""


@hookspec
def register_algorithm_types(register: Register) -> None:
    """Register ``AlgorithmType`` subclasses (kind ``algorithm_type``)."""
