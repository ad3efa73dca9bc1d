"""What every configuration model shares: unknown keys rejected, and a described-field helper."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticUndefined


class Section(BaseModel):
    """Base of every configuration model.

    Unknown keys are errors (``extra="forbid"``) so typos never pass silently; YAML numbers given
    for string keys (``name: 2024``) are accepted as strings, as OmegaConf would.
    """

    model_config = ConfigDict(
        extra="forbid",
        coerce_numbers_to_str=True,
        validate_assignment=False,
        use_enum_values=True,
    )


def F(default: Any = PydanticUndefined, doc: str = "", **kwargs: Any) -> Any:
    """A field with its user-facing description (the docs are generated from it)."""
    if not doc:
        raise TypeError("every configuration key needs a description")
    return Field(default, description=doc, **kwargs)


def derived(default: Any = None, doc: str = "", **kwargs: Any) -> Any:
    """A field filled in by :func:`trinity.config.resolve_config`; users normally leave it unset."""
    return F(default, doc, json_schema_extra={"derived": True}, **kwargs)


def is_derived(field_info: Any) -> bool:
    """Whether a model field was declared with :func:`derived`."""
    extra = field_info.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("derived"))


def lower_alias(value: Any, aliases: dict[str, str] | None = None) -> Any:
    """Case-insensitive enum values with Trinity-RFT's aliases (``online`` -> ``nccl``)."""
    if isinstance(value, str):
        value = value.strip().lower()
        if aliases:
            value = aliases.get(value, value)
    return value


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``name`` was most likely meant to be (transposed letters win), or None."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    for candidate in close:
        if sorted(candidate) == sorted(name):
            return candidate
    return close[0] if close else None


def invalid_choice(value: Any, choices: Sequence[str]) -> str:
    """``invalid value 'x'; expected one of: a, b (did you mean 'a'?)``: the message of every enum."""
    message = f"invalid value {value!r}; expected one of: {', '.join(choices)}"
    close = closest(str(value), choices)
    return message + (f" (did you mean {close!r}?)" if close else "")


def check_choice(value: Any, choices: Sequence[str]) -> Any:
    """``value`` lower-cased when it is one of ``choices`` (a ``mode="before"`` validator body);
    anything else raises the :func:`invalid_choice` message. ``None`` passes (optional keys)."""
    if value is None:
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected one of: {', '.join(choices)}; got {value!r} ({type(value).__name__})")
    lowered = value.strip().lower()
    if lowered not in choices:
        raise ValueError(invalid_choice(value, choices))
    return lowered
