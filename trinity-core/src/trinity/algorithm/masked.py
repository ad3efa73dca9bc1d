"""Masked reductions and loss aggregation shared by every algorithm component.

Semantics follow veRL (``verl.utils.torch_functional`` and ``core_algos.agg_loss``) so that a
user gets the same numbers for the same inputs; the one deliberate difference is that empty
masks give 0 instead of dividing by a tiny epsilon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _safe_denominator(count: torch.Tensor) -> torch.Tensor:
    # Exact division where something is counted; an all-zero mask yields 0, not NaN.
    if count.ndim == 0 and count.is_cpu:
        # One CPU scalar: reading it is cheaper than three tensor ops (and no device sync).
        return count if count.item() != 0 else torch.ones_like(count)
    return torch.where(count == 0, torch.ones_like(count), count)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (``mask`` may be bool or float weights)."""
    prod = values * mask.to(values.dtype)
    return prod.sum() if axis is None else prod.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked entries (0 where the mask is empty)."""
    mask = mask.to(values.dtype)
    if axis is None:
        return (values * mask).sum() / _safe_denominator(mask.sum())
    return (values * mask).sum(dim=axis) / _safe_denominator(mask.sum(dim=axis))


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


class TokenMean:
    """The ``token-mean`` reductions of one loss over one mask, sharing the work they have in common.

    A loss aggregated with ``token-mean`` that also reports masked means as metrics would convert
    and count the mask once per :func:`masked_mean` and allocate a product per metric. This
    converts the mask to ``like``'s dtype and counts it once, multiplies metrics into one reused
    scratch buffer, and folds constant per-token weights into the mask (:meth:`weighted`) so that
    autograd sees one product instead of two.

    Results equal :func:`aggregate_loss` / :func:`masked_mean` on the same inputs (0 for an empty
    mask, fractional weights as weights): bit for bit for the metrics, and for the losses
    whenever the mask is 0/1 (an action mask); :meth:`weighted` multiplies a fractional weight in
    a different order, which can move the last bit of a token's term.
    """

    __slots__ = ("_neg_denominator", "_scratch", "denominator", "mask")

    def __init__(self, mask: torch.Tensor, like: torch.Tensor) -> None:
        self.mask = mask if mask.dtype == like.dtype else mask.to(like.dtype)
        self.denominator = _safe_denominator(self.mask.sum())
        self._scratch: torch.Tensor | None = None
        self._neg_denominator: torch.Tensor | None = None

    def _negative_denominator(self) -> torch.Tensor:
        # s / -n == -(s / n) exactly, and the gradient's sign follows: negating the denominator
        # once costs no autograd node, negating the sum does.
        if self._neg_denominator is None:
            self._neg_denominator = -self.denominator
        return self._neg_denominator

    def scratch(self) -> torch.Tensor:
        """A tensor shaped like the mask that callers may overwrite (shared by :meth:`sum`)."""
        if self._scratch is None:
            self._scratch = torch.empty_like(self.mask)
        return self._scratch

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``masked_sum(values, mask)``, for metrics: not differentiable."""
        mask = self.mask
        if values.shape == mask.shape and values.dtype == mask.dtype and not values.requires_grad:
            return torch.mul(values, mask, out=self.scratch()).sum()
        return (values.detach() * mask).sum()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """``masked_mean(values, mask)``, for metrics (see :meth:`sum`)."""
        return self.sum(values) / self.denominator

    def neg_mean(self, values: torch.Tensor) -> torch.Tensor:
        """``masked_mean(-values, mask)``, for metrics, without materialising ``-values``."""
        return -self.sum(values) / self.denominator

    def loss(self, values: torch.Tensor) -> torch.Tensor:
        """``aggregate_loss(values, mask, "token-mean")``, differentiable."""
        return (values * self.mask).sum() / self.denominator

    def neg_loss(self, values: torch.Tensor) -> torch.Tensor:
        """``aggregate_loss(-values, mask, "token-mean")``, differentiable, without materialising
        ``-values`` (dividing by ``-n`` instead is exact, and so is its gradient)."""
        return (values * self.mask).sum() / self._negative_denominator()

    def weighted(
        self, weight: torch.Tensor, x: torch.Tensor, negate: bool = False, overwrite: bool = False
    ) -> torch.Tensor:
        """``aggregate_loss(±weight * x, mask, "token-mean")`` for a constant ``weight`` (no
        gradient flows into it); ``negate`` gives the ``-weight`` form.

        The weight is folded into the mask, so autograd keeps one product instead of two; with
        ``overwrite`` that happens in ``weight`` itself (pass a temporary)."""
        mask = self.mask
        weight = weight.detach()
        if overwrite and weight.shape == mask.shape and weight.dtype == mask.dtype:
            weight = weight.mul_(mask)
        else:
            weight = weight * mask
        return (x * weight).sum() / (self._negative_denominator() if negate else self.denominator)


def token_mean_for(
    loss_agg_mode: str, mask: torch.Tensor, like: torch.Tensor, *others: torch.Tensor
) -> TokenMean | None:
    """A :class:`TokenMean` over ``mask`` when ``loss_agg_mode`` is ``token-mean``, ``like`` and
    ``others`` all have the mask's shape and ``like``'s dtype, and no gradient is wanted for
    ``others`` or the mask (the case the fused paths of the algorithm components handle: they
    treat those as constants); else ``None``, and the caller takes its general path."""
    if loss_agg_mode != "token-mean" or like.shape != mask.shape:
        return None
    grad = torch.is_grad_enabled()
    for t in others:
        if t.shape != like.shape or t.dtype != like.dtype or (grad and t.requires_grad):
            return None
    if grad and mask.requires_grad:
        return None
    return TokenMean(mask, like)
