"""PPO's clipped surrogate objective with dual clipping (Ye et al., arXiv:1912.09729)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# exp() of a log-ratio beyond this overflows float32 ratios into inf; veRL clamps at the same bound.
LOG_RATIO_CLAMP = 20.0


def clamp_flagged(x: torch.Tensor, low: float | None = None, high: float | None = None) -> torch.Tensor:
    """``torch.clamp(x, low, high)`` with the same value and gradient (``grad`` inside the range,
    0 outside) but a cheaper backward: one product with a 0/1 float flag made in the forward,
    where autograd's ``where`` on boolean comparisons costs many passes over the tensor."""
    if not (x.requires_grad and torch.is_grad_enabled()):
        return torch.clamp(x, low, high)
    return _clamp_function().apply(x, low, high)


@functools.cache
def _clamp_function() -> Any:
    from torch.autograd.function import once_differentiable

    class Clamp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, low, high):  # type: ignore[override]
            out = torch.clamp(x, low, high)
            # 1 where the clamp passed x through (low <= x <= high); 0 where it clipped (or x is NaN).
            ctx.save_for_backward(torch.eq(out, x, out=torch.empty_like(x)))
            return out

        @staticmethod
        @once_differentiable
        def backward(ctx, grad):  # type: ignore[override]
            (passed,) = ctx.saved_tensors
            return grad * passed, None, None

    return Clamp


def resolve_clip_range(
    who: str, clip_range: float | None, low: float | None, high: float | None
) -> tuple[float, float]:
    """``(low, high)`` from explicit bounds, falling back to the symmetric ``clip_range``."""
    low = clip_range if low is None else low
    high = clip_range if high is None else high
    if low is None or high is None:
        raise ValueError(
            f"policy_loss_fn {who!r}: set clip_range, or both clip_range_low and clip_range_high"
        )
    return float(low), float(high)


def ppo_clipped_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    action_mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO loss and its metrics (``pg_loss``, ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``)."""
    tm = token_mean_for(loss_agg_mode, action_mask, logprob, old_logprob, advantages)
    if tm is not None:
        # token-mean: one fused node with the same value and gradient (see _ppo_token_mean). A
        # NaN loss (NaN inputs) takes the general path, whose backward zeroes the gradient where
        # the log-ratio is NaN.
        pg_loss, clip_sum, lower_sum, kl_sum = _ppo_token_mean().apply(
            logprob, old_logprob, advantages, tm.mask, tm.denominator, clip_low, clip_high, clip_ratio_c
        )
        den = tm.denominator
        value, clipfrac, clipfrac_lower, neg_kl = torch.stack(
            (pg_loss.detach(), clip_sum / den, lower_sum / den, kl_sum / den)
        ).tolist()
        if not math.isnan(value):
            return pg_loss, {
                "pg_loss": value,
                "pg_clipfrac": clipfrac,
                "pg_clipfrac_lower": clipfrac_lower,
                "ppo_kl": -neg_kl,
            }
    log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_max = torch.maximum(loss_unclipped, loss_clipped)
    # Dual clip: for A < 0 the pessimistic bound is capped at -A * c, so a huge ratio on a bad
    # action cannot blow the loss up.
    loss_dual = torch.minimum(-advantages * clip_ratio_c, loss_max)
    negative = advantages < 0
    pg_losses = torch.where(negative, loss_dual, loss_max)
    pg_loss = aggregate_loss(pg_losses, action_mask, loss_agg_mode)
    with torch.no_grad():
        clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(logprob.dtype), action_mask)
        lower = torch.gt(loss_max, -advantages * clip_ratio_c) & negative
        clipfrac_lower = masked_mean(lower.to(logprob.dtype), action_mask)
        ppo_kl = masked_mean(-log_ratio, action_mask)
    return pg_loss, {
        "pg_loss": pg_loss.item(),
        "pg_clipfrac": float(clipfrac),
        "pg_clipfrac_lower": float(clipfrac_lower),
        "ppo_kl": float(ppo_kl),
    }


def _share(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """Autograd's share of ``maximum(a, b)``'s gradient that goes to ``a`` (1 if ``a > b``, 1/2 on
    a tie, 0 if ``a < b``), as ``1 - (le + lt) / 2`` in float buffers."""
    torch.le(a, b, out=out)
    return out.add_(torch.lt(a, b, out=tmp)).mul_(-0.5).add_(1.0)


@functools.cache
def _ppo_token_mean() -> Any:
    """:func:`ppo_clipped_loss` for ``token-mean`` as one autograd node.

    The forward is the general path's arithmetic (``where`` by a 0/1 ``lerp``, which returns one
    end exactly) plus the metrics' masked sums; it also folds the backward's routing into one
    factor. Autograd's backward of the general path gives ``d logprob = ((g * -A) * Q) * r`` with
    ``g = mask * grad / n``, where ``Q`` collects the ``where``/``maximum``/``minimum``/``clamp``
    routing: the share of the (dual-)clip branch that reaches ``r`` (1, 1/2 or 1/4 on ties, as
    autograd splits them, else 0), times the ±20 clamp's pass-through flag. ``Q`` is a power of
    two or 0, so ``(g * -A) * (Q * r)`` rounds exactly as autograd's chain; the backward is two
    products in the gradient's buffer instead of about twenty tensors and ten ``where`` passes.
    """
    from torch.autograd.function import once_differentiable

    class PPOTokenMean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logprob, old_logprob, advantages, mask, denominator, clip_low, clip_high, clip_c):  # type: ignore[override]
            x = logprob - old_logprob
            log_ratio = torch.clamp(x, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            passed = torch.eq(log_ratio, x, out=x)  # the ±20 clamp's pass-through flag
            scratch = torch.empty_like(x)
            kl_sum = torch.mul(log_ratio, mask, out=scratch).sum()
            ratio = log_ratio.exp_()
            neg_adv = torch.neg(advantages)
            unclipped = neg_adv * ratio
            clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
            band = torch.eq(clipped, ratio, out=torch.empty_like(x))  # the ratio clamp's flag
            clipped.mul_(neg_adv)
            clip_sum = torch.gt(clipped, unclipped, out=scratch).mul_(mask).sum()
            tmp = torch.empty_like(x)
            # Reaching ratio through maximum(unclipped, clipped): all of it if the clamp passed
            # ratio through, else the unclipped branch's share.
            route = torch.maximum(_share(unclipped, clipped, scratch, tmp), band, out=band)
            loss_max = torch.maximum(unclipped, clipped, out=unclipped)
            cap = torch.mul(neg_adv, clip_c, out=clipped)
            negative = torch.lt(advantages, 0.0, out=tmp)
            above = torch.gt(loss_max, cap, out=scratch)
            # Where A < 0, minimum(cap, loss_max) passes loss_max's share: 1 below the cap,
            # 1/2 on it, 0 above: 1 - (ge + gt) / 2; where A >= 0, all of it.
            capped = torch.ge(loss_max, cap, out=passed.new_empty(passed.shape)).add_(above)
            capped.mul_(negative).mul_(-0.5).add_(1.0)
            lower_sum = above.mul_(negative).mul_(mask).sum()
            factor = capped.mul_(route).mul_(passed).mul_(ratio)
            dual = torch.minimum(cap, loss_max, out=cap)
            pg_losses = torch.lerp(loss_max, dual, negative, out=loss_max)
            loss = pg_losses.mul_(mask).sum() / denominator
            ctx.save_for_backward(neg_adv, factor, mask, denominator)
            ctx.mark_non_differentiable(clip_sum, lower_sum, kl_sum)
            return loss, clip_sum, lower_sum, kl_sum

        @staticmethod
        @once_differentiable
        def backward(ctx, grad, *_):  # type: ignore[override]
            neg_adv, factor, mask, denominator = ctx.saved_tensors
            grad_logprob = torch.mul(mask, grad / denominator).mul_(neg_adv).mul_(factor)
            return grad_logprob, None, None, None, None, None, None, None

    return PPOTokenMean


class PPOPolicyLossFn(PolicyLossFn):
    """PPO: ``max(-A r, -A clip(r, 1 - low, 1 + high))``, capped at ``-A c`` where ``A < 0``.

    ``r = exp(clamp(logprob - old_logprob, -20, 20))``. ``clip_range_low`` / ``clip_range_high``
    override the symmetric ``clip_range`` (DAPO's clip-higher).
    """

    def __init__(
        self,
        clip_range: float | None = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        self.clip_range_low, self.clip_range_high = resolve_clip_range(
            "ppo", clip_range, clip_range_low, clip_range_high
        )
        if clip_ratio_c <= 1.0:
            raise ValueError(
                f"policy_loss_fn 'ppo': clip_ratio_c must be > 1.0 (dual clip), got {clip_ratio_c}"
            )
        self.clip_ratio_c = clip_ratio_c

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate loss over valid tokens."""
        return ppo_clipped_loss(
            logprob,
            old_logprob,
            action_mask,
            advantages,
            self.clip_range_low,
            self.clip_range_high,
            self.clip_ratio_c,
            self.loss_agg_mode,
        )


__all__ = ["PPOPolicyLossFn", "clamp_flagged", "ppo_clipped_loss", "resolve_clip_range"]
