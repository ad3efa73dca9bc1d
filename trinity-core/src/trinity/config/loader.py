"""``load_config``: YAML file -> OmegaConf (interpolations) -> validated, resolved :class:`Config`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from trinity.config.errors import ConfigError
from trinity.config.models import Config
from trinity.config.no_effect import warn_no_effect
from trinity.config.resolve import resolve_config
from trinity.config.validation import validate_config
from trinity.config.yaml_io import load_yaml_dict

__all__ = ["load_config", "load_yaml_dict"]


def load_config(
    path: str | os.PathLike,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    *,
    resolve: bool = True,
) -> Config:
    """Load, validate and (unless ``resolve=False``) resolve the YAML config at ``path``.

    ``overrides`` are dotted assignments applied after the file, as a list
    (``["buffer.batch_size=8"]``) or a mapping (``{"buffer.batch_size": 8}``). Interpolations
    (``${oc.env:VAR,default}``, ``${model.model_path}``) are resolved before validation.
    Every problem raises :class:`ConfigError` with the file and key. Keys set in the file that
    have no effect in this version are logged once each (:mod:`trinity.config.no_effect`).
    """
    file = os.fspath(path)
    data = load_yaml_dict(file, overrides)
    config = validate_config(data, file)
    config._file = file
    warn_no_effect(config)  # before resolve: only the keys the user set count
    if not resolve:
        return config
    try:
        return resolve_config(config)
    except ConfigError as exc:
        raise exc.with_file(file) from None
