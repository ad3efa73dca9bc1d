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


# The four loss aggregation modes, and plain-Python references of them over nested lists.
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def ref_agg(values: list[list[float]], mask: list[list[float]], mode: str) -> float:
    """Aggregate a nested-list per-token value, skipping rows without valid tokens."""
    rows = [[v for v, m in zip(vr, mr) if m] for vr, mr in zip(values, mask)]
    if mode == "token-mean":
        flat = [v for r in rows for v in r]
        return sum(flat) / len(flat) if flat else 0.0
    if mode == "seq-mean-token-sum-norm":
        return sum(v for r in rows for v in r) / len(values[0])
    per_seq = [sum(r) if mode == "seq-mean-token-sum" else sum(r) / len(r) for r in rows if r]
    return sum(per_seq) / len(per_seq) if per_seq else 0.0


def ref_agg_grad(mask: list[list[float]], mode: str) -> list[list[float]]:
    """d agg / d (per-token value), per token, as nested lists."""
    n_tokens = sum(1 for r in mask for m in r if m)
    n_seqs = sum(1 for r in mask if any(r))
    out = []
    for r in mask:
        count = sum(1 for m in r if m)
        weight = {
            "token-mean": 1.0 / max(n_tokens, 1),
            "seq-mean-token-sum-norm": 1.0 / len(r),
            "seq-mean-token-sum": 1.0 / max(n_seqs, 1),
            "seq-mean-token-mean": 1.0 / (max(count, 1) * max(n_seqs, 1)),
        }[mode]
        out.append([weight if m else 0.0 for m in r])
    return out
