"""Masked reductions and loss aggregation shared by every algorithm component.

Semantics follow veRL (``verl.utils.torch_functional`` and ``core_algos.agg_loss``) so that a
user gets the same numbers for the same inputs; the one deliberate difference is that empty
masks give 0 instead of dividing by a tiny epsilon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity._lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _safe_denominator(count: torch.Tensor) -> torch.Tensor:
    # Exact division where something is counted; an all-zero mask yields 0, not NaN.
    return torch.where(count == 0, torch.ones_like(count), count)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (``mask`` may be bool or float weights)."""
    prod = values * mask.to(values.dtype)
    return prod.sum() if axis is None else prod.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked entries (0 where the mask is empty)."""
    mask = mask.to(values.dtype)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / _safe_denominator(count)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the masked entries; Bessel-corrected when ``unbiased``."""
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count <= 1:
            # One sample has no spread; report 0 rather than dividing by zero.
            return torch.zeros_like(variance)
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the masked entries.

    With ``shift_mean=False`` the mean is added back (only the scale changes), as in veRL.
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    normalizer: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``(B, T)`` to a scalar.

    - ``token-mean``: mean over every valid token in the batch.
    - ``seq-mean-token-sum``: per-sequence sum of valid tokens, averaged over sequences.
    - ``seq-mean-token-mean``: per-sequence mean of valid tokens, averaged over sequences.
    - ``seq-mean-token-sum-norm``: sum over valid tokens divided by ``normalizer``
      (default: the padded response length ``T``), as Dr. GRPO does.

    Sequence-level modes average only over sequences with at least one valid token.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        norm = float(loss_mat.shape[-1]) if normalizer is None else float(normalizer)
        return masked_sum(loss_mat, mask) / norm
    seq_valid = (mask.sum(dim=-1) > 0).to(loss_mat.dtype)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = masked_sum(loss_mat, mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, mask, axis=-1)
    else:
        raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    return masked_mean(seq_losses, seq_valid)
