"""Shared by the benchmarks: bootstrap intervals and a controlled background load.

Not a benchmark itself (``nox -s bench`` skips files starting with ``_``).
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def bootstrap(
    samples: Sequence[T],
    statistic: Callable[[list[T]], float | None],
    resamples: int = 2000,
    seed: int = 0,
) -> list[float | None]:
    """``statistic`` of ``resamples`` resamples of ``samples`` drawn with replacement (same size).

    ``statistic`` may return ``None`` for a resample it has no value for (say, a target accuracy
    never reached); those stay ``None`` so the caller can count them."""
    rng = random.Random(seed)
    n = len(samples)
    return [statistic([samples[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)]


def interval(values: Sequence[float | None], level: float = 0.95) -> tuple[float, float] | None:
    """The central ``level`` percentile interval of the values that are not ``None``."""
    found = sorted(v for v in values if v is not None)
    if len(found) < 2:
        return None
    cuts = statistics.quantiles(found, n=1000, method="inclusive")
    low = cuts[max(0, round(1000 * (1 - level) / 2) - 1)]
    high = cuts[min(len(cuts) - 1, round(1000 * (1 + level) / 2) - 1)]
    return low, high


@contextlib.contextmanager
def cpu_load(processes: int | None = None) -> Iterator[int]:
    """One CPU-bound process per core (or ``processes``) for the duration of the block.

    The burners run at this process's priority (they are its children), as other work on a
    user's machine would; they are killed when the block ends, also on an exception."""
    count = processes if processes is not None else (os.cpu_count() or 1)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait(timeout=10)
