"""What every configuration model shares: unknown keys rejected, and a described-field helper."""

from __future__ import annotations

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
