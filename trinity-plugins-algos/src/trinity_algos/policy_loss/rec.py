"""REC: REINFORCE with clipping and regularisation for off-policy data (Yao et al., "Group-Relative
REINFORCE Is Secretly an Off-Policy Algorithm", arXiv:2509.24203)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss, masked_mean
from trinity.algorithm.masked import TokenMean, token_mean_for
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import LOG_RATIO_CLAMP

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

CLIP_MODES = ("none", "one-side", "gspo-one-side", "two-side", "ring")
WEIGHTS = (
    "none",
    "importance_sampling",
    "truncated_importance_sampling",
    "gspo_importance_sampling",
    "advantage",
)
REGULARIZERS = ("none", "k2", "forward-kl")


class RECPolicyLossFn(PolicyLossFn):
    """REC: ``-A' * logprob * keep + regulariser``, every weight a constant for the gradient.

    With ``r = exp(logprob - old_logprob)`` per token (log-ratio clamped to ±20), ``s`` the
    sequence ratio ``exp(mean_t(logprob - old_logprob))``, ``εl``/``εh`` = ``epsilon_low`` /
    ``epsilon_high`` and ``εl'``/``εh'`` their ``_prime`` forms:

    - ``clip_mode`` (which tokens keep their gradient): ``none`` all; ``two-side``
      ``1-εl <= r <= 1+εh``; ``one-side`` ``r <= 1+εh`` where ``A >= 0`` and ``r >= 1-εl``
      where ``A <= 0``; ``gspo-one-side`` the same on ``s`` (and the loss is then always
      ``seq-mean-token-mean``); ``ring`` two-side, plus ``r <= 1-εl'`` where ``A >= 0`` and
      ``r >= 1+εh'`` where ``A <= 0``.
    - ``weight`` (``A'``): ``none`` ``A``; ``importance_sampling`` ``A r``;
      ``truncated_importance_sampling`` ``A clip(r, 1-εl', 1+εh')``; ``gspo_importance_sampling``
      ``A s``; ``advantage`` ``A exp(A / temp)``. With ``fix_opd_advantage`` ``A`` is first shifted
      by ``old_logprob - sg(logprob)`` (on-policy distillation's advantage is
      ``teacher - old_logprob``; this makes it ``teacher - logprob``).
    - ``regularizer``: ``k2`` adds ``regularizer_coef * (logprob - old_logprob)²`` (Kimi's ½
      absorbed into the coefficient), ``forward-kl`` adds ``-regularizer_coef * logprob``.

    Defaults are Trinity-RFT's effective ones (its ``default_args``: ``εl' = 0.6``, ``εh' = 2``).
    Metrics: ``pg_loss``, ``pg_clipfrac`` (share of valid tokens without gradient), ``ppo_kl``.
    """

    def __init__(
        self,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        epsilon_low_prime: float = 0.6,
        epsilon_high_prime: float = 2.0,
        clip_mode: str = "none",
        weight: str = "none",
        regularizer: str = "none",
        regularizer_coef: float = 0.0,
        temp: float = 1.0,
        loss_agg_mode: str = "token-mean",
        fix_opd_advantage: bool = False,
    ) -> None:
        for name, value, choices in (
            ("clip_mode", clip_mode, CLIP_MODES),
            ("weight", weight, WEIGHTS),
            ("regularizer", regularizer, REGULARIZERS),
        ):
            if value not in choices:
                raise ValueError(f"policy_loss_fn 'rec': {name} {value!r} is not one of {', '.join(choices)}")
        for name, value, upper in (
            ("epsilon_low", epsilon_low, 1.0),
            ("epsilon_high", epsilon_high, None),
            ("epsilon_low_prime", epsilon_low_prime, 1.0),
            ("epsilon_high_prime", epsilon_high_prime, None),
        ):
            if value <= 0.0 or (upper is not None and value > upper):
                bound = f"(0, {upper}]" if upper is not None else "> 0"
                raise ValueError(f"policy_loss_fn 'rec': {name} must be in {bound}, got {value}")
        if regularizer_coef < 0.0:
            raise ValueError(f"policy_loss_fn 'rec': regularizer_coef must be >= 0, got {regularizer_coef}")
        if temp <= 0.0:
            raise ValueError(f"policy_loss_fn 'rec': temp must be > 0, got {temp}")
        # gspo-one-side always averages per sequence; saying so here also makes the trainer weight
        # micro-batches by sequences, as that aggregation needs.
        super().__init__(
            loss_agg_mode="seq-mean-token-mean" if clip_mode == "gspo-one-side" else loss_agg_mode
        )
        self.epsilon_low = epsilon_low
        self.epsilon_high = epsilon_high
        self.epsilon_low_prime = epsilon_low_prime
        self.epsilon_high_prime = epsilon_high_prime
        self.clip_mode = clip_mode
        self.weight = weight
        self.regularizer = regularizer
        self.regularizer_coef = regularizer_coef
        self.temp = temp
        self.fix_opd_advantage = fix_opd_advantage

    def _keep(
        self, ratio: torch.Tensor, seq_ratio: torch.Tensor | None, advantages: torch.Tensor
    ) -> torch.Tensor:
        low, high = 1.0 - self.epsilon_low, 1.0 + self.epsilon_high
        pos, neg = advantages >= 0, advantages <= 0
        if self.clip_mode == "two-side":
            return (ratio >= low) & (ratio <= high)
        if self.clip_mode == "one-side":
            return (pos & (ratio <= high)) | (neg & (ratio >= low))
        if self.clip_mode == "gspo-one-side":
            assert seq_ratio is not None
            return (pos & (seq_ratio <= high)) | (neg & (seq_ratio >= low))
        if self.clip_mode == "ring":
            band = (ratio >= low) & (ratio <= high)
            far_low = pos & (ratio <= 1.0 - self.epsilon_low_prime)
            far_high = neg & (ratio >= 1.0 + self.epsilon_high_prime)
            return band | far_low | far_high
        return torch.ones_like(ratio, dtype=torch.bool)

    def _keep_float(self, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor | None:
        """:meth:`_keep` as a 0/1 float tensor for the token-level clip modes (``None`` for
        ``none``: keep everything), from comparisons written straight into float buffers and
        ``and`` / ``or`` as product / maximum; the same values as ``_keep(...).float()``."""
        if self.clip_mode == "none":
            return None

        def flag(op: Any, a: torch.Tensor, b: float) -> torch.Tensor:
            return op(a, b, out=torch.empty_like(a))

        low, high = 1.0 - self.epsilon_low, 1.0 + self.epsilon_high
        if self.clip_mode == "two-side":
            return flag(torch.ge, ratio, low).mul_(flag(torch.le, ratio, high))
        if self.clip_mode == "one-side":
            upper = flag(torch.ge, advantages, 0.0).mul_(flag(torch.le, ratio, high))
            lower = flag(torch.le, advantages, 0.0).mul_(flag(torch.ge, ratio, low))
            return torch.maximum(upper, lower, out=upper)
        # ring
        keep = flag(torch.ge, ratio, low).mul_(flag(torch.le, ratio, high))
        far_low = flag(torch.ge, advantages, 0.0).mul_(flag(torch.le, ratio, 1.0 - self.epsilon_low_prime))
        far_high = flag(torch.le, advantages, 0.0).mul_(flag(torch.ge, ratio, 1.0 + self.epsilon_high_prime))
        return torch.maximum(torch.maximum(keep, far_low, out=keep), far_high, out=keep)

    def _token_mean_call(
        self,
        tm: TokenMean,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``token-mean`` with token-level clipping and weights: the general path's arithmetic on
        float indicators, one mask count, and the constant per-token factors folded into the
        mask. Returns the loss, clip fraction and ``ppo_kl``."""
        with torch.no_grad():
            log_ratio = logprob.detach() - old_logprob
            ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp_()
            keep = self._keep_float(ratio, advantages)
            if keep is None:
                clipfrac = torch.zeros_like(tm.denominator) / tm.denominator
            else:
                clipfrac = tm.mean(torch.mul(keep, -1.0, out=tm.scratch()).add_(1.0))  # 1 - keep
            ppo_kl = tm.neg_mean(log_ratio)
            if self.weight == "importance_sampling":
                weighted = ratio.mul_(advantages)
            elif self.weight == "truncated_importance_sampling":
                weighted = ratio.clamp_(1.0 - self.epsilon_low_prime, 1.0 + self.epsilon_high_prime)
                weighted = weighted.mul_(advantages)
            elif self.weight == "advantage":
                weighted = torch.div(advantages, self.temp).exp_().mul_(advantages)
            else:
                weighted = advantages
            if self.fix_opd_advantage:
                weighted = torch.sub(weighted, log_ratio, out=log_ratio)
            # -weighted * logprob * keep * mask == logprob * -(weighted * keep * mask) for a 0/1
            # keep and mask.
            if keep is not None:
                weighted = keep.mul_(weighted)
            elif weighted is advantages:
                weighted = advantages.detach().clone()
        if self.regularizer == "none":
            return tm.weighted(weighted, logprob, negate=True, overwrite=True), clipfrac, ppo_kl
        with torch.no_grad():
            factor = weighted.mul_(tm.mask).neg_()
            coef = tm.mask * self.regularizer_coef
        pg_losses = logprob * factor
        if self.regularizer == "forward-kl":
            pg_losses = pg_losses - logprob * coef
        else:  # k2
            pg_losses = pg_losses + (logprob - old_logprob).square() * coef
        return pg_losses.sum() / tm.denominator, clipfrac, ppo_kl

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """REC loss over valid tokens."""
        tm = None
        if self.clip_mode != "gspo-one-side" and self.weight != "gspo_importance_sampling":
            tm = token_mean_for(self.loss_agg_mode, action_mask, logprob, old_logprob, advantages)
        if tm is not None:
            loss, clipfrac, ppo_kl = self._token_mean_call(tm, logprob, old_logprob, advantages)
            return loss, {
                "pg_loss": loss.item(),
                "pg_clipfrac": float(clipfrac),
                "ppo_kl": float(ppo_kl),
            }
        with torch.no_grad():
            log_ratio = logprob - old_logprob
            ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            seq_ratio = None
            if self.clip_mode == "gspo-one-side" or self.weight == "gspo_importance_sampling":
                seq_log_ratio = masked_mean(log_ratio, action_mask, axis=-1)
                seq_ratio = torch.exp(
                    torch.clamp(seq_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
                ).unsqueeze(-1)
            keep = self._keep(ratio, seq_ratio, advantages)
            weighted = advantages
            if self.weight == "importance_sampling":
                weighted = advantages * ratio
            elif self.weight == "truncated_importance_sampling":
                weighted = advantages * torch.clamp(
                    ratio, 1.0 - self.epsilon_low_prime, 1.0 + self.epsilon_high_prime
                )
            elif self.weight == "gspo_importance_sampling":
                weighted = advantages * seq_ratio
            elif self.weight == "advantage":
                weighted = advantages * torch.exp(advantages / self.temp)
            if self.fix_opd_advantage:
                weighted = weighted - log_ratio
        pg_losses = -weighted * logprob * keep.to(logprob.dtype)
        if self.regularizer == "forward-kl":
            pg_losses = pg_losses - self.regularizer_coef * logprob
        elif self.regularizer == "k2":
            pg_losses = pg_losses + self.regularizer_coef * (logprob - old_logprob).square()
        loss = aggregate_loss(pg_losses, action_mask, self.loss_agg_mode)
        with torch.no_grad():
            clipfrac = masked_mean((~keep).to(logprob.dtype), action_mask)
            ppo_kl = masked_mean(-log_ratio, action_mask)
        return loss, {
            "pg_loss": loss.item(),
            "pg_clipfrac": float(clipfrac),
            "ppo_kl": float(ppo_kl),
        }


__all__ = ["RECPolicyLossFn"]
