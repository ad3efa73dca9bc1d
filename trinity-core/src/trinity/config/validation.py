"""Validate a plain dict into :class:`Config`, turning pydantic errors into one-line ConfigErrors."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from trinity.config.errors import ConfigError
from trinity.config.models import Config
from trinity.config.sections.base import closest, invalid_choice

_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "a boolean (true/false)",
    str: "a string",
    dict: "a mapping (key: value)",
    list: "a list",
}


def validate_config(data: Any, file: str | None = None, model: type[BaseModel] = Config) -> Any:
    """``model.model_validate(data)``; any problem becomes a :class:`ConfigError` naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping of sections, got {_describe_input(data)}", file=file
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error_from_validation(exc, file, model) from None


def error_from_validation(
    exc: ValidationError, file: str | None, model: type[BaseModel] = Config
) -> ConfigError:
    """One ConfigError for a pydantic ValidationError: the first problem, plus a count of the rest."""
    errors = exc.errors(include_url=False)
    key, message = describe_error(errors[0], model)
    if len(errors) > 1:
        others = sorted({format_loc(e["loc"]) for e in errors[1:]} - {key})
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            message += f" (also {len(errors) - 1} more problem(s) at: {shown})"
    return ConfigError(message, key=key or None, file=file)


def format_loc(loc: tuple[Any, ...]) -> str:
    """``('buffer', 'tasksets', 0, 'name')`` -> ``buffer.tasksets[0].name``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def describe_error(error: dict[str, Any], model: type[BaseModel] = Config) -> tuple[str, str]:
    """(dotted key, message with a hint) for one pydantic error."""
    loc = tuple(error["loc"])
    kind = error["type"]
    given = error.get("input")
    ctx = error.get("ctx") or {}
    key = format_loc(loc)
    if kind == "extra_forbidden":
        return key, _unknown_key(loc, model)
    annotation = annotation_at(model, loc)
    if kind == "missing":
        return key, "required key is missing" + _field_doc(model, loc)
    if kind == "literal_error" or (kind == "enum"):
        return key, invalid_choice(given, [str(a) for a in _literal_values(annotation)])
    if kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
        return key, text
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # `must be >= 0`, not `>= 0.0`, for float keys
        return key, f"must be {op} {bound}, got {given!r}"
    if kind.endswith(("_type", "_parsing")) or kind in ("int_from_float", "model_attributes_type"):
        return key, f"expected {describe_type(annotation)}, got {_describe_input(given)}"
    return key, f"{error['msg'][0].lower()}{error['msg'][1:]} (got {_describe_input(given)})"


def annotation_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The type annotation at ``loc`` inside ``model`` (None when the path leaves the models)."""
    current: Any = model
    for part in loc:
        current = _strip_optional(current)
        origin = get_origin(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            current = field.annotation
        elif origin is list and isinstance(part, int):
            current = get_args(current)[0]
        elif origin is dict:
            current = get_args(current)[1]
        else:
            return None
    return current


def describe_type(annotation: Any) -> str:
    """Words for a type: ``int | None`` -> ``an integer (or null)``."""
    if annotation is None:
        return "a different type"
    stripped = _strip_optional(annotation)
    suffix = " or null" if stripped is not annotation else ""
    origin = get_origin(stripped)
    if isinstance(stripped, type) and issubclass(stripped, BaseModel):
        return "a mapping of keys (a section)" + suffix
    if origin is list:
        return f"a list of {_plural(get_args(stripped)[0])}" + suffix
    if origin is dict:
        return "a mapping (key: value)" + suffix
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(stripped))) + suffix
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(stripped)) + suffix
    return _TYPE_WORDS.get(stripped, getattr(stripped, "__name__", str(stripped))) + suffix


def _plural(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mappings (sections)"
    words = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
    return words.get(annotation, describe_type(annotation))


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    annotation = _strip_optional(annotation)
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _field_doc(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    parent = _strip_optional(annotation_at(model, loc[:-1]))
    if isinstance(parent, type) and issubclass(parent, BaseModel) and loc and loc[-1] in parent.model_fields:
        doc = parent.model_fields[loc[-1]].description
        if doc:
            return f" ({doc.rstrip('.')})"
    return ""


def _unknown_key(loc: tuple[Any, ...], model: type[BaseModel]) -> str:
    name = str(loc[-1])
    parent = _strip_optional(annotation_at(model, loc[:-1]))
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)):
        return f"unknown key {name!r}"
    valid = list(parent.model_fields)
    message = f"unknown key {name!r}"
    close = closest(name, valid)
    if close:
        return f"{message}; did you mean {close!r}?"
    # A key that belongs one level down (``algorithm.lr`` instead of ``algorithm.optimizer.lr``).
    parent_path = format_loc(loc[:-1])
    for field_name, field in parent.model_fields.items():
        child = _strip_optional(field.annotation)
        if isinstance(child, type) and issubclass(child, BaseModel) and name in child.model_fields:
            where = f"{parent_path}.{field_name}" if parent_path else field_name
            return f"{message}; it belongs under {where}"
    return f"{message}; valid keys: {', '.join(valid)}"


def _describe_input(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"
