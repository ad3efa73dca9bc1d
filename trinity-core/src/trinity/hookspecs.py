"""The pluggy hook specifications of Trinity's plugin API (v1).

Every hook is called with exactly one keyword argument, ``register``: a callable
``register(name: str, component)``; the component is a class (``register_commands``: a
``click.Command``). The host owns the callback, so it can check the type
of what a plugin hands it and remember which plugin registered each name.

Each hook declares, with :func:`registers`, the component kind it fills: the kind name
``get_component`` takes, the base class every component must subclass, and where users get
first-party components of that kind. :data:`trinity.plugins.KINDS` is read from these
declarations, so a new hook is one function here (plus its docs section and conformance check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy

PROJECT_NAME = "trinity"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[[str, type], None]
#: ``register`` of :func:`register_commands`: a name and a ``click.Command`` object.
RegisterCommand = Callable[[str, Any], None]

KIND_ATTRIBUTE = "trinity_kind"
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class KindSpec:
    """What a hook registers: ``name`` (the kind), ``base`` (``"module:Class"``, imported on
    first use to keep this module light) and ``providers``, the first-party distributions with
    components of that kind, each ``(distribution, what it brings)`` (``what`` may be empty):
    an unknown name's error says how to install them (``trinity.plugins.install_hint``)."""

    name: str
    base: str
    providers: tuple[tuple[str, str], ...] = ()
    instances: bool = False  # components are instances of ``base`` (commands), not subclasses


def registers(
    kind: str, base: str, providers: tuple[tuple[str, str], ...] = (), *, instances: bool = False
) -> Callable[[_F], _F]:
    """Mark a hookspec with the component kind it registers (see :class:`KindSpec`)."""

    def mark(func: _F) -> _F:
        setattr(func, KIND_ATTRIBUTE, KindSpec(kind, base, providers, instances))
        return func

    return mark


_ALGOS = (("trinity-plugins-algos", ""),)


@hookspec
@registers(
    "workflow",
    "trinity.workflow:Workflow",
    (
        ("trinity-plugins-math", "math"),
        ("trinity-plugins-webshop", "webshop"),
        ("trinity-plugins-agents", "tool calling, FrozenLake, ALFWorld, AgentScope ReAct"),
    ),
)
def register_workflows(register: Register) -> None:
    """Register ``Workflow`` subclasses (kind ``workflow``), e.g. ``register("math_workflow", MathWorkflow)``."""


@hookspec
@registers("reward_fn", "trinity.workflow:RewardFn", (("trinity-plugins-math", ""),))
def register_reward_fns(register: Register) -> None:
    """Register ``RewardFn`` subclasses (kind ``reward_fn``)."""


@hookspec
@registers("advantage_fn", "trinity.algorithm.advantage:AdvantageFn", _ALGOS)
def register_advantage_fns(register: Register) -> None:
    """Register ``AdvantageFn`` subclasses (kind ``advantage_fn``)."""


@hookspec
@registers("policy_loss_fn", "trinity.algorithm.policy_loss:PolicyLossFn", _ALGOS)
def register_policy_loss_fns(register: Register) -> None:
    """Register ``PolicyLossFn`` subclasses (kind ``policy_loss_fn``)."""


@hookspec
@registers("kl_fn", "trinity.algorithm.kl:KLFn", _ALGOS)
def register_kl_fns(register: Register) -> None:
    """Register ``KLFn`` subclasses (kind ``kl_fn``); used both as KL loss and KL reward penalty."""


@hookspec
@registers("entropy_loss_fn", "trinity.algorithm.entropy:EntropyLossFn", _ALGOS)
def register_entropy_loss_fns(register: Register) -> None:
    """Register ``EntropyLossFn`` subclasses (kind ``entropy_loss_fn``)."""


@hookspec
@registers("sample_strategy", "trinity.algorithm.sample_strategy:SampleStrategy", _ALGOS)
def register_sample_strategies(register: Register) -> None:
    """Register ``SampleStrategy`` subclasses (kind ``sample_strategy``)."""


@hookspec
@registers("algorithm_type", "trinity.algorithm.algorithm_type:AlgorithmType", _ALGOS)
def register_algorithm_types(register: Register) -> None:
    """Register ``AlgorithmType`` subclasses (kind ``algorithm_type``)."""


@hookspec
@registers("selector", "trinity.buffer.selector:Selector", _ALGOS)
def register_selectors(register: Register) -> None:
    """Register ``Selector`` subclasses (kind ``selector``; ``data_selector.selector_type`` of a
    taskset); the core registers ``sequential``, ``shuffle`` and ``random`` itself."""


@hookspec
@registers("operator", "trinity.data.operator:Operator")  # the core's built-ins: docs/plugins.md
def register_operators(register: Register) -> None:
    """Register data-processor operators (kind ``operator``): ``ExperienceOperator`` subclasses
    for ``data_processor.experience_pipeline`` and ``TaskOperator`` subclasses for
    ``data_processor.task_pipeline``; the core registers the built-ins itself."""


@hookspec
@registers("command", "click:Command", (("trinity-studio", "studio"),), instances=True)
def register_commands(register: RegisterCommand) -> None:
    """Register ``trinity`` subcommands (kind ``command``): ``click.Command`` objects (a
    ``click.Group`` for a command with subcommands), e.g. ``register("studio", studio)``. The
    core registers its own (``run``, ``plugins``, ``debug``, ...) the same way; a
    :class:`trinity.cli.LazyCommand` imports its module only when the command runs, which keeps
    ``trinity --help`` light."""
