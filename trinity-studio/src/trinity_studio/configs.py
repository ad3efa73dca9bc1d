"""Config files for the builder: YAML in and out, and the validation ``trinity run`` applies.

:func:`check_config` runs the same steps as :func:`trinity.config.load_config` (interpolations
through OmegaConf, the pydantic models, then ``resolve_config``'s cross-key rules), but reports
*every* field problem, each as ``{"key", "message"}`` in the one-line wording of
:class:`~trinity.config.ConfigError`, so the page can show it beside its field.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml

from trinity.config.errors import ConfigError


def parse_yaml(text: str) -> dict[str, Any]:
    """The mapping a YAML text holds, interpolations (``${...}``) kept as written."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"the top level must be a mapping of sections, got a {type(data).__name__}")
    return data


def dump_yaml(config: dict[str, Any]) -> str:
    """``config`` as YAML in the order the form built it."""
    return yaml.safe_dump(prune(config), sort_keys=False, allow_unicode=True)


def prune(value: Any) -> Any:
    """``value`` without empty sections the form created but never filled."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = prune(v)
            if isinstance(v, dict) and not v:
                continue
            out[k] = v
        return out
    if isinstance(value, list):
        return [prune(v) for v in value]
    return value


def _temp_yaml(config: dict[str, Any]) -> str:
    fd, path = tempfile.mkstemp(prefix="trinity-studio-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(dump_yaml(config))
    return path


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """``{"ok", "errors": [{"key", "message"}], "yaml"}``; ``yaml`` is the resolved config
    (what ``trinity run --dry-run`` prints) when ``ok``."""
    from pydantic import ValidationError

    from trinity.config.models import Config
    from trinity.config.resolve import resolve_config
    from trinity.config.validation import describe_error, validate_config
    from trinity.config.yaml_io import load_yaml_dict

    path = _temp_yaml(config)
    try:
        try:
            data = load_yaml_dict(path)  # interpolations, exactly as `trinity run` reads the file
        except ConfigError as exc:
            return _failed([_error(exc)])
        if not isinstance(data, dict):
            return _failed([{"key": "", "message": "the top level must be a mapping of sections"}])
        try:
            Config.model_validate(data)
        except ValidationError as exc:
            errors = []
            for error in exc.errors(include_url=False):
                key, message = describe_error(error, Config)
                errors.append({"key": key, "message": message})
            return _failed(errors)
        try:
            resolved = resolve_config(validate_config(data))
        except ConfigError as exc:
            return _failed([_error(exc)])
        except Exception as exc:  # a plugin's check_config failing its own way
            return _failed([{"key": "", "message": f"{type(exc).__name__}: {exc}"}])
        return {"ok": True, "errors": [], "yaml": resolved.to_yaml()}
    finally:
        os.unlink(path)


def _error(exc: ConfigError) -> dict[str, str]:
    return {"key": exc.key or "", "message": exc.message}


def _failed(errors: list[dict[str, str]]) -> dict[str, Any]:
    return {"ok": False, "errors": errors, "yaml": None}


def read_config_file(path: str) -> dict[str, Any]:
    """The raw mapping of the YAML file at ``path`` (``ConfigError`` naming the file otherwise)."""
    if not os.path.isfile(path):
        raise ConfigError("no such file; give the path of a YAML config", file=path)
    with open(path, encoding="utf-8") as f:
        try:
            return parse_yaml(f.read())
        except ConfigError as exc:
            raise exc.with_file(path) from None
        except UnicodeDecodeError:
            raise ConfigError("not a UTF-8 text file", file=path) from None


def save_config_file(path: str, config: dict[str, Any]) -> str:
    """Write ``config`` as YAML to ``path`` (folders created); returns the absolute path."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump_yaml(config))
    return path
