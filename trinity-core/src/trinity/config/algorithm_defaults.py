"""Fill the ``algorithm`` section from the plugin registry.

``AlgorithmType.default_config()`` supplies every key the user left unset; then each component's
``*_args`` is the component's ``default_args()`` with the user's arguments merged over it.
"""

from __future__ import annotations

import inspect
from typing import Any, get_args

from pydantic import ValidationError

from trinity.config.errors import ConfigError
from trinity.config.sections.algorithm import COMPONENT_KEYS, AlgorithmConfig, LossAggMode
from trinity.config.sections.base import invalid_choice
from trinity.config.validation import closest, error_from_validation

# Constructor arguments the runtime supplies itself; users cannot configure them.
_INJECTED = {"sample_strategy": {"experience_buffer", "auxiliary_buffers", "train_batch_size"}}


def lookup_component(kind: str, name: str, key: str) -> type:
    """``get_component(kind, name)``; an unknown name becomes a ConfigError at ``key``.

    ``none`` KL / entropy terms resolve to the core's null components when no plugin registers
    them, as the trainer does (:data:`trinity.algorithm.NULL_COMPONENTS`).
    """
    from trinity.plugins import UnknownComponentError, get_component

    try:
        return get_component(kind, name)
    except UnknownComponentError as exc:
        if name == "none":
            from trinity.algorithm import NULL_COMPONENTS

            if kind in NULL_COMPONENTS:
                return NULL_COMPONENTS[kind]
        raise ConfigError(str(exc), key=key) from None


def resolve_algorithm(algorithm: AlgorithmConfig) -> tuple[AlgorithmConfig, type]:
    """The algorithm section with defaults and component args filled, and its AlgorithmType class."""
    algo_name = algorithm.algorithm_type
    algo_cls = lookup_component("algorithm_type", algo_name, "algorithm.algorithm_type")
    defaults = dict(algo_cls.default_config() or {})
    unknown = [k for k in defaults if k not in AlgorithmConfig.model_fields]
    if unknown:
        raise ConfigError(
            f"algorithm type {algo_name!r} ({algo_cls.__module__}.{algo_cls.__qualname__}) returns unknown "
            f"key(s) {', '.join(map(repr, unknown))} from default_config(); report this to the plugin author",
            key="algorithm.algorithm_type",
        )
    user = algorithm.model_dump(exclude_unset=True)
    for key, _ in COMPONENT_KEYS:
        # Default args belong to the default component; a user-chosen component starts from its own.
        if key in user and user[key] != defaults.get(key):
            defaults.pop(f"{key}_args", None)
    merged = deep_merge(defaults, user)
    try:
        resolved = AlgorithmConfig.model_validate(merged)
    except ValidationError as exc:
        error = error_from_validation(exc, None, AlgorithmConfig)
        raise ConfigError(
            f"{error.message} (value from algorithm type {algo_name!r} default_config())",
            key=f"algorithm.{error.key}" if error.key else "algorithm",
        ) from None
    if resolved.loss_agg_mode is None:
        resolved.loss_agg_mode = "token-mean"
    for key, kind in COMPONENT_KEYS:
        _resolve_component(resolved, key, kind, algo_name)
    return resolved, algo_cls


def _resolve_component(algorithm: AlgorithmConfig, key: str, kind: str, algo_name: str) -> None:
    args_key = f"{key}_args"
    name = getattr(algorithm, key)
    user_args = dict(getattr(algorithm, args_key) or {})
    if name is None:
        if user_args:
            raise ConfigError(
                f"arguments given but algorithm.{key} is not set and algorithm type {algo_name!r} has no "
                f"default {key}; set algorithm.{key}",
                key=f"algorithm.{args_key}",
            )
        return
    cls = lookup_component(kind, name, f"algorithm.{key}")
    defaults = dict(cls.default_args())
    valid = check_init_args(cls, user_args, f"{kind} {name!r}", f"algorithm.{args_key}", _INJECTED.get(kind))
    mode = user_args.get("loss_agg_mode")
    if mode is not None and mode not in get_args(LossAggMode):
        raise ConfigError(
            invalid_choice(mode, get_args(LossAggMode)), key=f"algorithm.{args_key}.loss_agg_mode"
        )
    merged = {**defaults, **user_args}
    # The section-wide aggregation mode reaches every component that takes one, unless set per component.
    if "loss_agg_mode" in valid and "loss_agg_mode" not in user_args:
        merged["loss_agg_mode"] = algorithm.loss_agg_mode
    setattr(algorithm, args_key, merged)


def check_init_args(
    cls: type, args: dict[str, Any], what: str, key: str, injected: set[str] | None = None
) -> list[str]:
    """The arguments ``cls`` is built with (its ``__init__`` keywords and ``default_args()``, less
    ``injected``); an argument in ``args`` it does not take is a ConfigError at ``key.<arg>``
    naming ``what`` (``reward_fn 'math_reward'``), unless ``__init__`` takes ``**kwargs``."""
    params, accepts_any = _init_params(cls)
    defaults = getattr(cls, "default_args", dict)()
    valid = sorted((set(params) | set(defaults)) - (injected or set()))
    if not accepts_any:
        check_arg_names(args, valid, what, key)
    return valid


def check_arg_names(args: dict[str, Any], valid: list[str], what: str, key: str) -> None:
    """An argument in ``args`` not in ``valid`` is a ConfigError at ``key.<arg>``: one line with
    the closest valid name and all of them."""
    for arg in args:
        if arg not in valid:
            hint = closest(arg, valid)
            raise ConfigError(
                f"unknown argument {arg!r} of {what}"
                + (f"; did you mean {hint!r}?" if hint else ";")
                + f" Valid arguments: {', '.join(valid) if valid else '(none)'}",
                key=f"{key}.{arg}",
            )


def _init_params(cls: type) -> tuple[dict[str, bool], bool]:
    """``{name: has no default}`` of ``cls.__init__`` keyword parameters, and whether it takes ``**kwargs``."""
    params: dict[str, bool] = {}
    accepts_any = False
    for pname, param in inspect.signature(cls.__init__).parameters.items():
        if pname == "self" or param.kind is param.VAR_POSITIONAL:
            continue
        if param.kind is param.VAR_KEYWORD:
            accepts_any = True
            continue
        params[pname] = param.default is inspect.Parameter.empty
    return params, accepts_any


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: mappings recursively, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
