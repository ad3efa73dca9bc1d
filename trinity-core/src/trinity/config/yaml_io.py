"""``load_yaml_dict``: a YAML file as plain data, every interpolation resolved (OmegaConf).

The leaf of the config package: it imports nothing of Trinity but :class:`ConfigError`, so both
:mod:`trinity.config.loader` (load -> validate -> resolve) and :mod:`trinity.config.resolve`
(``trainer_config_path`` files) use it without importing each other.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trinity.config.errors import ConfigError

_ENV_MISSING = re.compile(r"Environment variable '([^']+)' not found")


def load_yaml_dict(file: str, overrides: Sequence[str] | Mapping[str, Any] | None = None) -> Any:
    """The file's content as plain Python data with every interpolation resolved."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not os.path.exists(file):
        raise ConfigError("config file not found; check the path passed to --config", file=file)
    if os.path.isdir(file):
        raise ConfigError("is a directory; pass the path of a YAML file", file=file)
    _check_text(file)
    try:
        raw = OmegaConf.load(file)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_problem(exc), file=file) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot be read as a config: {_first_line(exc)}", file=file) from None
    except UnicodeDecodeError as exc:  # _check_text saw the file; it changed since
        raise ConfigError(_not_text(f"byte at offset {exc.start} is not UTF-8"), file=file) from None
    if overrides:
        raw = _apply_overrides(raw, overrides, file)
    try:
        return OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as exc:
        raise _interpolation_error(exc, file) from None


def _check_text(file: str) -> None:
    """A file that is not UTF-8 text (an image, an archive, random bytes) is no YAML config.

    Read in chunks, so a multi-gigabyte file passed by mistake fails at its first bad byte.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                problems = []  # (offset, what): the first one is reported
                nul = chunk.find(b"\x00")
                if nul >= 0:
                    problems.append((offset + nul, "NUL byte"))
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    # exc.object is the chunk behind the bytes of a character the last one cut.
                    where = offset - (len(exc.object) - len(chunk)) + exc.start
                    problems.append((where, f"byte 0x{exc.object[exc.start]:02x}, not UTF-8,"))
                if problems:
                    where, what = min(problems)
                    raise ConfigError(_not_text(f"{what} at offset {where}"), file=file)
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ConfigError(_not_text("it ends inside a UTF-8 character"), file=file) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", file=file) from None


def _not_text(why: str) -> str:
    return f"not a text YAML file ({why}); pass the path of a YAML config saved as UTF-8 text"


def _apply_overrides(raw: Any, overrides: Sequence[str] | Mapping[str, Any], file: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    items = [f"{k}={v}" for k, v in overrides.items()] if isinstance(overrides, Mapping) else list(overrides)
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value", file=file)
    try:
        return OmegaConf.merge(raw, OmegaConf.from_dotlist(items))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot apply overrides {items}: {_first_line(exc)}", file=file) from None


def _yaml_problem(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"invalid YAML at {where}{problem}"


def _interpolation_error(exc: Exception, file: str) -> ConfigError:
    key = getattr(exc, "full_key", None) or None
    text = str(exc)
    missing_env = _ENV_MISSING.search(text)
    if missing_env:
        var = missing_env.group(1)
        return ConfigError(
            f"environment variable {var} is not set (used by ${{oc.env:{var}}}); "
            f"export it, or give a default: ${{oc.env:{var},<default>}}",
            key=key,
            file=file,
        )
    first = _first_line(exc)
    prefix = "KeyError raised while resolving interpolation: "
    if first.startswith(prefix):
        first = first[len(prefix) :]
    if type(exc).__name__ == "InterpolationKeyError":
        return ConfigError(
            f"bad interpolation: {first}; reference another key as ${{section.key}}", key=key, file=file
        )
    return ConfigError(f"bad interpolation: {first}", key=key, file=file)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
