"""CHORD (Zhang et al., "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised
Fine-Tuning and Reinforcement Learning via Dynamic Weighting", arXiv:2508.11408).

CHORD mixes RL on rollouts with SFT on expert data, weighting the SFT term globally by a
scheduled ``mu`` (CHORD-µ) and per token by ``φ(p) = p (1 - p)`` (CHORD-φ), which keeps the
expert signal away from tokens the policy already finds certain (p → 1) or finds absurd (p → 0).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, aggregate_loss
from trinity.algorithm.masked import token_mean_for
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.mix import ExpertMixLossFn
from trinity_algos.policy_loss.sft import SFTLossFn

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def mu_schedule(
    global_step: int, mu_warmup_steps: int, mu_decay_steps: int, mu_peak: float, mu_valley: float
) -> float:
    """CHORD's ``mu`` at ``global_step``: linear warm-up from 0 to ``mu_peak`` over
    ``mu_warmup_steps``, cosine decay to ``mu_valley`` over the next ``mu_decay_steps``, then
    ``mu_valley``. Steps are 1-based, as the trainer counts them."""
    if global_step < mu_warmup_steps:
        return mu_peak * global_step / mu_warmup_steps
    since_peak = global_step - mu_warmup_steps
    if since_peak >= mu_decay_steps:
        return mu_valley
    cosine = 0.5 * (1.0 + math.cos(math.pi * since_peak / mu_decay_steps))
    return mu_valley + (mu_peak - mu_valley) * cosine


class SFTISLossFn(PolicyLossFn):
    """SFT with an importance weight: ``agg(-sg(p) * logprob)`` with ``p = exp(logprob)``.

    The gradient of ``-sg(p) log p`` is ``-∇p``: the expert signal is the probability gradient,
    so tokens the policy finds unlikely barely move it.
    """

    def __call__(
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Probability-weighted negative log-likelihood."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob)
        if tm is not None:
            loss = tm.weighted(torch.exp(logprob.detach()), logprob, negate=True, overwrite=True)
        else:
            weight = torch.exp(logprob.detach())
            loss = aggregate_loss(-weight * logprob, action_mask, self.loss_agg_mode)
        return loss, {"sft_is_loss": loss.item()}


class SFTPhiLossFn(PolicyLossFn):
    """CHORD-φ's SFT: ``agg(-sg(φ(p)) * logprob)`` with ``φ(p) = p (1 - p)``, ``p = exp(logprob)``.

    With ``cutoff_prob < 1`` the log-likelihood term is ``min(logprob, log(cutoff_prob))``: tokens
    whose probability already exceeds the cutoff give a constant, i.e. no gradient (``φ`` itself
    uses the unclipped probability).
    """

    def __init__(self, loss_agg_mode: str = "token-mean", cutoff_prob: float = 1.0) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if not 0.0 < cutoff_prob <= 1.0:
            raise ValueError(f"policy_loss_fn 'sft_phi': cutoff_prob must be in (0, 1], got {cutoff_prob}")
        self.cutoff_prob = cutoff_prob

    def __call__(
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """φ-weighted negative log-likelihood."""
        tm = token_mean_for(self.loss_agg_mode, action_mask, logprob)
        with torch.no_grad():
            prob = torch.exp(logprob)
            if tm is not None:
                weight = torch.rsub(prob, 1.0).mul_(prob)  # p * (1 - p), in one buffer
            else:
                phi = prob * (1.0 - prob)
        if self.cutoff_prob < 1.0:
            logprob = torch.clamp(logprob, max=math.log(self.cutoff_prob))
        if tm is not None:
            loss = tm.weighted(weight, logprob, negate=True, overwrite=True)
        else:
            loss = aggregate_loss(-phi * logprob, action_mask, self.loss_agg_mode)
        return loss, {"sft_phi_loss": loss.item()}


class MIXCHORDPolicyLossFn(ExpertMixLossFn):
    """CHORD: ``(1 - mu_t) * PPO(usual rows) + mu_t * SFT(expert rows)`` with ``mu_t`` from
    :func:`mu_schedule` and SFT = :class:`SFTPhiLossFn` (``enable_phi_function``, CHORD-φ) or
    plain SFT (CHORD-µ).

    The step is the trainer's ``global_step`` (1-based), or Trinity-RFT's per-row ``step`` tensor
    (all rows equal) when that is given instead; a schedule that does not depend on the step
    (no warm-up, and no decay or ``mu_peak == mu_valley``) needs neither. Everything else
    (clip ranges, aggregation modes, the batch-size arguments and how they make each part a mean
    over its own samples across micro-batches) is as in ``mix``
    (:mod:`trinity_algos.policy_loss.mix`). Metrics as ``mix``, plus ``mu``.
    """

    def __init__(
        self,
        mu_warmup_steps: int = 0,
        mu_decay_steps: int = 0,
        mu_peak: float = 0.1,
        mu_valley: float = 0.1,
        enable_phi_function: bool = True,
        clip_range: float | None = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        use_dynamic_bsz: bool | None = None,
        ppo_mini_batch_size: int | None = None,
        ppo_micro_batch_size_per_gpu: int | None = None,
        ngpus_trainer: int | None = None,
        train_batch_size_usual: int | None = None,
        train_batch_size_expert: int | None = None,
        loss_agg_mode: str = "token-mean",
        sft_loss_agg_mode: str | None = None,
        grpo_loss_agg_mode: str | None = None,
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if mu_warmup_steps < 0 or mu_decay_steps < 0:
            raise ValueError("policy_loss_fn 'mix_chord': mu_warmup_steps and mu_decay_steps must be >= 0")
        for name, value in (("mu_peak", mu_peak), ("mu_valley", mu_valley)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"policy_loss_fn 'mix_chord': {name} must be in [0, 1], got {value}")
        self.mu_warmup_steps = mu_warmup_steps
        self.mu_decay_steps = mu_decay_steps
        self.mu_peak = mu_peak
        self.mu_valley = mu_valley
        self.enable_phi_function = enable_phi_function
        sft_mode = sft_loss_agg_mode or loss_agg_mode
        sft = (
            SFTPhiLossFn(loss_agg_mode=sft_mode) if enable_phi_function else SFTLossFn(loss_agg_mode=sft_mode)
        )
        self._setup_mix(
            "mix_chord",
            clip_range,
            clip_range_low,
            clip_range_high,
            clip_ratio_c,
            use_dynamic_bsz,
            ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu,
            ngpus_trainer,
            train_batch_size_usual,
            train_batch_size_expert,
            loss_agg_mode,
            sft,
            grpo_loss_agg_mode,
        )

    @property
    def schedule_uses_step(self) -> bool:
        """Whether ``mu`` changes with the step (else it is ``mu_valley`` throughout)."""
        return self.mu_warmup_steps > 0 or (self.mu_decay_steps > 0 and self.mu_peak != self.mu_valley)

    def current_mu(self, global_step: int | None = None, step: torch.Tensor | None = None) -> float:
        """``mu`` at ``global_step`` (or the value shared by the rows of ``step``)."""
        if global_step is None and step is not None:
            values = torch.as_tensor(step).reshape(-1)
            if values.numel():
                low, high = int(values.min()), int(values.max())
                if low != high:
                    raise ValueError(
                        f"policy_loss_fn 'mix_chord': the rows' step differ ({low}..{high}); "
                        "one micro-batch belongs to one training step"
                    )
                global_step = low
        if global_step is None:
            if self.schedule_uses_step:
                raise ValueError(
                    "policy_loss_fn 'mix_chord': the mu schedule needs the training step, but the "
                    "trainer passed neither global_step nor step"
                )
            return self.mu_valley
        return mu_schedule(
            int(global_step), self.mu_warmup_steps, self.mu_decay_steps, self.mu_peak, self.mu_valley
        )

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        global_step: int | None = None,
        step: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """CHORD loss with ``mu`` at the current step."""
        mu = self.current_mu(global_step, step)
        loss, metrics = self._mix(logprob, old_logprob, action_mask, advantages, expert_mask, mu)
        metrics["mu"] = mu
        return loss, metrics


__all__ = ["MIXCHORDPolicyLossFn", "SFTISLossFn", "SFTPhiLossFn", "mu_schedule"]
