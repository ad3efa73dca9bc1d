"""Task selectors: which dataset row is read at each read position.

A reader keeps one integer, its *position* (rows handed out so far, across epochs); the selector
maps a position to a row index. That makes resume exact: restoring the position restores the
order, including shuffles, because every permutation is a pure function of ``(seed, epoch)``.
"""

from __future__ import annotations

from typing import Any


class Selector:
    """Maps read positions to row indices of a dataset of ``size`` rows.

    ``selector_type``:
        ``sequential``: file order, epoch after epoch.
        ``shuffle``: a fresh permutation each epoch, seeded by ``(seed, epoch)``.
        ``random``: each position draws a row uniformly (with replacement), seeded by
        ``(seed, position)``; "epochs" then count ``size`` draws.
    """

    TYPES = ("sequential", "shuffle", "random")

    def __init__(self, size: int, selector_type: str = "sequential", seed: int = 42) -> None:
        if selector_type not in self.TYPES:
            raise ValueError(f"unknown selector_type {selector_type!r}; use one of {', '.join(self.TYPES)}")
        if size <= 0:
            raise ValueError("a selector needs at least one row")
        self.size = size
        self.selector_type = selector_type
        self.seed = int(seed)
        self._perm_epoch: int | None = None
        self._perm: Any = None

    def _permutation(self, epoch: int) -> Any:
        if self._perm_epoch != epoch:
            import numpy as np

            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            self._perm_epoch = epoch
        return self._perm

    def index(self, position: int) -> int:
        """Row index read at ``position``."""
        epoch, offset = divmod(position, self.size)
        if self.selector_type == "sequential":
            return offset
        if self.selector_type == "shuffle":
            return int(self._permutation(epoch)[offset])
        import numpy as np

        return int(np.random.default_rng([self.seed, position]).integers(self.size))

    def indices(self, start: int, count: int) -> list[int]:
        """Row indices for positions ``start .. start + count - 1``."""
        return [self.index(p) for p in range(start, start + count)]
