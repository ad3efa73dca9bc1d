"""The monitor interface: where metrics go."""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("trinity.monitor")
_noted: set[str] = set()


@dataclass(frozen=True)
class Histogram:
    """A distribution as a metric value: ``counts[i]`` values fell in ``[edges[i], edges[i+1])``
    (the last bucket includes its right edge), with the values' summary statistics.

    Monitors that plot distributions (TensorBoard, wandb) log it; the others skip it with one note
    (:meth:`Monitor.skip_histograms`). Built with :meth:`of`; picklable, so it crosses Ray.
    """

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    min: float
    max: float
    num: int
    sum: float
    sum_squares: float

    @classmethod
    def of(cls, values: Any, bins: int = 64) -> Histogram:
        """The histogram of ``values`` (anything ``numpy.asarray`` takes: a list, an array, a CPU
        tensor) over ``bins`` equal buckets from its min to its max."""
        import numpy as np

        data = np.asarray(values, dtype=np.float64).ravel()
        data = data[np.isfinite(data)]
        if data.size == 0:
            return cls((0.0, 0.0), (0,), 0.0, 0.0, 0, 0.0, 0.0)
        counts, edges = np.histogram(data, bins=bins)
        return cls(
            edges=tuple(float(e) for e in edges),
            counts=tuple(int(c) for c in counts),
            min=float(data.min()),
            max=float(data.max()),
            num=int(data.size),
            sum=float(data.sum()),
            sum_squares=float(np.square(data).sum()),
        )


def histogram_metrics(metrics: dict[str, Any]) -> dict[str, Histogram]:
    """The entries of ``metrics`` that are :class:`Histogram` values."""
    return {key: value for key, value in metrics.items() if isinstance(value, Histogram)}


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

    def skip_histograms(
        self, metrics: dict[str, Any], where: Sequence[str] = ("tensorboard", "wandb")
    ) -> None:
        """For a monitor that cannot plot :class:`Histogram` values: note once per process and
        monitor type which ones it leaves out (its scalars are logged as usual)."""
        names = sorted(histogram_metrics(metrics))
        kind = type(self).__name__
        if names and kind not in _noted:
            _noted.add(kind)
            logger.info(
                "%s does not plot histograms; %s %s logged by the %s monitor",
                kind,
                ", ".join(names),
                "is" if len(names) == 1 else "are",
                " or ".join(where),
            )

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


__all__ = ["Histogram", "Monitor", "histogram_metrics", "scalar_metrics"]
