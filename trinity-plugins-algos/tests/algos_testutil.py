"""Random inputs shared by the tests (imported as a module; conftest puts this folder on sys.path)."""

from __future__ import annotations

import torch

# (B, T) shapes for the randomised reference comparisons: a single token, odd sizes, a wide batch.
SHAPES = [(1, 1), (2, 3), (5, 4), (8, 7), (16, 33)]


def random_mask(b: int, t: int, g: torch.Generator, empty_row: bool = True) -> torch.Tensor:
    """A float mask with holes; for B > 2 one row is fully masked (when ``empty_row``)."""
    mask = (torch.rand(b, t, generator=g) > 0.35).double()
    mask[:, 0] = 1.0
    if empty_row and b > 2:
        mask[b - 1] = 0.0
    return mask


def random_groups(b: int, g: torch.Generator) -> torch.Tensor:
    """Group ids with singletons and larger groups (ids drawn from fewer values than rows)."""
    return torch.randint(0, max(1, b // 2 + 1), (b,), generator=g)
