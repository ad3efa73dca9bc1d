"""Which Ray cluster a job joins: ``cluster.ray_address`` or ``$RAY_ADDRESS`` (config resolution
asks it whether a job joins a cluster; :mod:`trinity.cluster` connects)."""

from __future__ import annotations

from collections.abc import Mapping

#: Values of ``cluster.ray_address`` that name no cluster (``$RAY_ADDRESS`` decides).
UNNAMED = ("", "auto", "local")


def resolve_address(ray_address: str, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """``(address, where it came from)``; the address is ``None`` when the job starts a local Ray.

    ``cluster.ray_address`` wins when it names a cluster; ``auto``/``local``/empty defer to
    ``$RAY_ADDRESS`` (whose ``auto`` is Ray's: the cluster last started on this machine).
    """
    address = (ray_address or "").strip()
    if address not in UNNAMED:
        return address, "cluster.ray_address"
    env = environ.get("RAY_ADDRESS", "").strip()
    if env and env != "local":
        return env, "RAY_ADDRESS"
    return None, ""
