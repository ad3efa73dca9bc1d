"""The monitor interface: where metrics go."""

from __future__ import annotations

import math
import numbers
from typing import Any


class Monitor:
    """Receives metrics: ``log(metrics, step)`` as often as needed, then ``close()`` once.

    ``role`` is the actor that logs (``explorer``, ``trainer``, ...); each monitor keeps the
    roles apart (its own run, folder or prefix).
    """

    def __init__(self, role: str = "trainer") -> None:
        self.role = role

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` (name → number) at ``step``; non-numeric values are skipped."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources; ``log`` must not be called afterwards."""

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The entries of ``metrics`` that are real numbers (bools and NaN-free tensors included)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, numbers.Real):
            value = float(value)
            if not math.isnan(value):
                out[key] = value
    return out


__all__ = ["Monitor", "scalar_metrics"]
