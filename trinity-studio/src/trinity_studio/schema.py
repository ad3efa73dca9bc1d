"""The config builder's form description, generated from the pydantic config models.

The studio never hand-writes a form: :func:`config_schema` walks :class:`trinity.config.Config`
(the walk of :mod:`trinity.config.docs`, which generates ``docs/configuration.md``) and describes
every field with its type, default and description; the page renders a widget per type. Fields
naming a plugin component get a picker listing what ``trinity plugins`` lists, and their
``*_args`` start from the component's ``default_args()``.
"""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from trinity.config.docs import iter_models
from trinity.config.models import Config
from trinity.config.sections.base import is_derived

#: Field name -> plugin kind, for fields whose value names a registered component.
COMPONENT_FIELDS: dict[str, str] = {
    "algorithm_type": "algorithm_type",
    "sample_strategy": "sample_strategy",
    "advantage_fn": "advantage_fn",
    "policy_loss_fn": "policy_loss_fn",
    "kl_penalty_fn": "kl_fn",
    "kl_loss_fn": "kl_fn",
    "entropy_loss_fn": "entropy_loss_fn",
    "default_workflow_type": "workflow",
    "default_eval_workflow_type": "workflow",
    "default_reward_fn_type": "reward_fn",
    "selector_type": "selector",
}
#: (model, field) -> where the picked component's arguments go, relative to the section, when
#: not the section's own ``<field>_args`` (tasksets name their workflow / reward arguments so).
ARGS_FIELDS: dict[tuple[str, str], str] = {
    ("DataSelectorConfig", "selector_type"): "kwargs",
    ("TasksetConfig", "default_workflow_type"): "workflow_args",
    ("TasksetConfig", "default_reward_fn_type"): "reward_fn_args",
    ("ExplorerInput", "default_workflow_type"): "taskset.workflow_args",
    ("ExplorerInput", "default_reward_fn_type"): "taskset.reward_fn_args",
}
#: (model, field) -> (plugin kind, arguments field), for generic field names such as ``name``.
MODEL_COMPONENT_FIELDS: dict[tuple[str, str], tuple[str, str]] = {
    ("OperatorConfig", "name"): ("operator", "args")
}

#: The keys most jobs set, in the order the beginner form shows them.
BEGINNER_KEYS: tuple[str, ...] = (
    "project",
    "name",
    "mode",
    "checkpoint_root_dir",
    "model.model_path",
    "model.max_prompt_tokens",
    "model.max_response_tokens",
    "algorithm.algorithm_type",
    "algorithm.repeat_times",
    "algorithm.optimizer.lr",
    "buffer.batch_size",
    "buffer.total_epochs",
    "buffer.total_steps",
    "buffer.explorer_input.taskset.name",
    "buffer.explorer_input.taskset.path",
    "buffer.explorer_input.taskset.split",
    "buffer.explorer_input.taskset.format.prompt_key",
    "buffer.explorer_input.taskset.format.response_key",
    "buffer.explorer_input.default_workflow_type",
    "buffer.explorer_input.default_reward_fn_type",
    "buffer.trainer_input.experience_buffer.name",
    "buffer.trainer_input.experience_buffer.storage_type",
    "explorer.rollout_model.engine_type",
    "trainer.trainer_type",
    "synchronizer.sync_method",
    "synchronizer.sync_interval",
    "monitor.monitor_type",
)


def config_schema() -> dict[str, Any]:
    """``{"root": "Config", "models": {name: model}, "beginner": [...]}`` for the page.

    Each model is ``{"doc", "fields": [field]}``; a field is ``{"name", "doc", "type",
    "default", "derived", "nullable"}`` plus ``"choices"`` (fixed values), ``"model"`` (a section,
    a list of sections: ``type`` ``section`` / ``sections``) and ``"component"`` (plugin kind).
    """
    models = {model.__name__: _describe_model(model) for _, model in iter_models(Config)}
    beginner = [{"path": p, **_field_at(p)} for p in BEGINNER_KEYS]
    return {"root": Config.__name__, "models": models, "beginner": beginner}


def _describe_model(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "doc": " ".join((model.__doc__ or "").split()),
        "fields": [_describe_field(name, field, model) for name, field in model.model_fields.items()],
    }


def _describe_field(name: str, field: Any, model: type[BaseModel]) -> dict[str, Any]:
    annotation = field.annotation
    nullable = _is_optional(annotation)
    out: dict[str, Any] = {
        "name": name,
        "doc": field.description or "",
        "derived": is_derived(field),
        "nullable": nullable,
        "default": _default(field),
    }
    out.update(_describe_type(_strip_optional(annotation)))
    where = (model.__name__, name)
    if name in COMPONENT_FIELDS and out["type"] == "str":
        out["component"] = COMPONENT_FIELDS[name]
        own = f"{name}_args" if f"{name}_args" in model.model_fields else None
        out["args_field"] = ARGS_FIELDS.get(where, own)
    elif where in MODEL_COMPONENT_FIELDS:
        out["component"], out["args_field"] = MODEL_COMPONENT_FIELDS[where]
    return out


def _describe_type(annotation: Any) -> dict[str, Any]:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"type": "section", "model": annotation.__name__}
    if origin is Literal:
        return {"type": "choice", "choices": [str(a) for a in args]}
    if origin is list:
        item = args[0] if args else Any
        if isinstance(item, type) and issubclass(item, BaseModel):
            return {"type": "sections", "model": item.__name__}
        return {"type": "list"}
    if origin is dict:
        return {"type": "mapping"}
    if origin in (Union, types.UnionType):
        # ``str | list[str]`` (monitor_type) and the like: edited as YAML/JSON text.
        return {"type": "any"}
    simple = {bool: "bool", int: "int", float: "float", str: "str"}
    return {"type": simple.get(annotation, "any")}


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _strip_optional(annotation: Any) -> Any:
    if _is_optional(annotation):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007 - built at run time
    return annotation


def _default(field: Any) -> Any:
    if field.default_factory is not None:
        value = field.default_factory()
        return None if isinstance(value, BaseModel) else value
    return None if field.default is PydanticUndefined else field.default


def _field_at(path: str) -> dict[str, Any]:
    """The field description of a dotted ``path`` below :class:`Config`."""
    model: Any = Config
    parts = path.split(".")
    for part in parts[:-1]:
        model = _strip_optional(model.model_fields[part].annotation)
    return _describe_field(parts[-1], model.model_fields[parts[-1]], model)


def components() -> dict[str, Any]:
    """``{kind: [{"name", "plugin", "args"}]}``: every registered component and its
    ``default_args()`` (what ``trinity plugins`` lists), plus ``{"errors": [...]}`` of plugins
    that failed to load."""
    from trinity.plugins import KINDS, get_component, list_components, plugin_infos

    origin: dict[tuple[str, str], str] = {}
    errors = []
    for info in plugin_infos():
        if info.error:
            errors.append(f"{info.name}: {info.error}")
        for kind, names in info.components.items():
            for n in names:
                origin[(kind, n)] = info.name
    out: dict[str, Any] = {}
    for kind in KINDS:
        if kind == "command":  # `trinity` subcommands: nothing a config names
            continue
        rows = []
        for name in list_components(kind):
            args: dict[str, Any] = {}
            try:
                default_args = getattr(get_component(kind, name), "default_args", None)
                args = dict(default_args()) if default_args else {}
            except Exception as exc:  # a broken component must not hide the others
                args = {"_error": str(exc)}
            rows.append({"name": name, "plugin": origin.get((kind, name), ""), "args": _jsonable(args)})
        out[kind] = rows
    out["errors"] = errors
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
