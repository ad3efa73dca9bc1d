"""The command that installs one of Trinity's distributions, for messages (``pip install
./trinity-plugins-math``): no Trinity distribution is on PyPI, they install from their folders in
a clone of the repository, which this module locates."""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import json
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname


def _direct_url(distribution: str) -> dict[str, Any]:
    """The installed distribution's ``direct_url.json`` (PEP 610: where pip installed it from,
    and whether editable); ``{}`` when it is not installed or came from an index."""
    try:
        text = metadata.distribution(distribution).read_text("direct_url.json")
        return json.loads(text) if text else {}
    except (metadata.PackageNotFoundError, ValueError):
        return {}


@functools.cache
def _clone_root() -> Path | None:
    """The clone of Trinity the running trinity-core was installed from (editable or not, or
    as a wheel built into a folder of the clone), if it is still there."""
    here = Path(__file__).resolve()  # <clone>/trinity-core/src/trinity/install_hints.py when editable
    candidates = [here.parents[3]] if len(here.parents) > 3 else []
    url = _direct_url("trinity-core").get("url", "")
    if url.startswith("file:"):
        source = Path(url2pathname(urlparse(url).path))
        # the distribution's folder (<clone>/trinity-core) or a wheel (<clone>/dist/x.whl)
        candidates.append(source.parent if source.is_dir() else source.parent.parent)
    for root in candidates:
        if (root / "trinity-core" / "pyproject.toml").is_file():
            return root
    return None


def _install_spec(distribution: str, extra: str | None) -> tuple[str, bool]:
    """``(pip argument, whether it works from anywhere)`` for a Trinity distribution's folder."""
    root = _clone_root()
    folder = root / distribution if root else None
    if folder is None or not (folder / "pyproject.toml").is_file():
        spec, located = f"./{distribution}", False
    else:
        # relative at the clone's root (where the README's commands run), else absolute
        spec = f"./{distribution}" if Path.cwd().resolve() == root else str(folder)
        located = True
    return shlex.quote(f"{spec}[{extra}]" if extra else spec), located


def install_hint(*distributions: str, extra: str | None = None) -> str:
    """The command that installs Trinity's ``distributions`` (each with ``extra``), for messages.

    No Trinity distribution is on PyPI: they install from their folders in a clone of the
    repository. When the clone the running trinity-core came from is known, the command works
    from the current folder (``pip install ./trinity-plugins-math`` at the clone's root, the
    folder's absolute path elsewhere); otherwise it says where to run it
    (``pip install ./trinity-plugins-math (from a clone of Trinity)``). An extra of an editable
    install keeps it editable (``pip install -e './trinity-core[data-juicer]'``).
    """
    specs = [_install_spec(dist, extra) for dist in distributions]
    editable = bool(extra) and all(
        _direct_url(dist).get("dir_info", {}).get("editable", False) for dist in distributions
    )
    command = f"pip install {'-e ' if editable else ''}{' '.join(spec for spec, _ in specs)}"
    return command if all(ok for _, ok in specs) else f"{command} (from a clone of Trinity)"


def install_hint_for(providers: tuple[tuple[str, str], ...]) -> str:
    """``pip install A (what), B (what) or C``: any one of several distributions."""
    if not providers:
        return ""
    specs = [_install_spec(dist, None) for dist, _ in providers]
    items = [spec + (f" ({what})" if what else "") for (spec, _), (_, what) in zip(specs, providers)]
    listed = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
    located = all(ok for _, ok in specs)
    return f"pip install {listed}" + ("" if located else " (from a clone of Trinity)")
