"""On-policy distillation advantages: ``on_policy_distill`` and ``jsd``.

Both compare, token by token, the student's log-prob ``s = old_logprob`` of each sampled
response token with a teacher's ``t = teacher_logprobs`` (the workflow records those on
``Experience.teacher_logprobs``). The advantage is per token, written on valid tokens only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import output_dtype, require

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def _row_sum_metrics(per_token: torch.Tensor, mask: torch.Tensor, name: str) -> dict[str, float]:
    """``name/mean`` and ``name/std`` (unbiased; 0 for one row) of the per-row sums."""
    per_row = (per_token * mask).sum(-1).to(torch.float64)
    return {
        f"{name}/mean": float(per_row.mean()) if per_row.numel() else 0.0,
        f"{name}/std": float(per_row.std()) if per_row.numel() > 1 else 0.0,
    }


def _set_token_advantages(batch: Batch, advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Write ``advantages`` = ``returns`` (zero, exactly, off the mask); metric ``advantages/mean``."""
    advantages = torch.where(mask != 0, advantages * mask, torch.zeros_like(advantages))
    batch["advantages"] = advantages
    batch["returns"] = advantages.clone()
    per_row = advantages.sum(-1).to(torch.float64)
    return {"advantages/mean": float(per_row.mean()) if per_row.numel() else 0.0}


class OnPolicyDistillAdvantageFn(AdvantageFn):
    """On-policy distillation (Agarwal et al., arXiv:2306.13649; Thinking Machines' "On-Policy
    Distillation", 2025): ``A_t = kl_coef * (t_t - s_t)``, minus the per-token estimate
    ``s - t = log pi_student - log pi_teacher`` of the reverse KL at the sampled token.

    Metrics: ``kl/mean`` / ``kl/std`` of the per-row summed ``s - t``, ``advantages/mean``.
    """

    required_inputs: ClassVar[tuple[str, ...]] = ("old_logprob", "teacher_logprobs")

    def __init__(self, kl_coef: float = 1.0) -> None:
        self.kl_coef = kl_coef

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "on_policy_distill"
        mask_in = require(batch, "action_mask", who)
        student = require(batch, "old_logprob", who)
        teacher = require(batch, "teacher_logprobs", who)
        dtype = output_dtype(student, teacher)
        mask = mask_in.to(dtype)
        student, teacher = student.to(dtype).detach(), teacher.to(dtype).detach()
        valid = mask != 0
        student = torch.where(valid, student, torch.zeros_like(student))
        teacher = torch.where(valid, teacher, torch.zeros_like(teacher))
        metrics = _row_sum_metrics(student - teacher, mask, "kl")
        metrics.update(_set_token_advantages(batch, self.kl_coef * (teacher - student), mask))
        return batch, metrics


class JSDAdvantageFn(AdvantageFn):
    """On-policy distillation with a generalised Jensen-Shannon divergence (GKD, Agarwal et al.,
    arXiv:2306.13649), per sampled token.

    With ``b = lambda_coef``, ``s`` and ``t`` the student's and teacher's log-probs divided by
    ``temperature``, and the mixture ``M = b * teacher + (1 - b) * student``
    (``m = log(b e^t + (1 - b) e^s)``), the divergence is
    ``JSD_b = b KL(teacher || M) + (1 - b) KL(student || M)``; ``b = 0`` stands for
    ``KL(student || teacher)`` and ``b = 1`` for ``KL(teacher || student)`` (upstream's labels).

    The tokens are sampled from the student, so the advantage is minus the per-token
    policy-gradient weight of that divergence: ``E_student[A grad log pi_student] =
    -grad JSD_b``, times ``kl_coef``:

    - ``0 < b < 1``: ``A = kl_coef * (1 - b) * (m - s)``;
    - ``b = 0``: ``A = kl_coef * (t - s)`` (the reverse KL of ``on_policy_distill``);
    - ``b = 1``: ``A = kl_coef * (exp(t - s) - 1)`` (forward KL, importance-weighted; the 1 is a
      baseline).

    ``A`` is positive where the teacher gives the token more probability than the student, zero
    where they agree. (Upstream Trinity-RFT uses ``-(b (t - m) + (1 - b)(s - m))``, which is
    ``>= 0`` for every token when ``0 < b < 1``, and ``s - t`` at ``b = 1``: neither descends the
    divergence on student samples.) Metric ``jsd/mean`` / ``jsd/std``: the per-row sum of the per-token estimate
    of ``JSD_b`` (``b e^(t-s) (t - m) + (1 - b)(s - m)``, or the pure KL at ``b = 0, 1``).
    ``chunk_size`` is accepted for upstream configs; everything here is elementwise on ``(B, T)``,
    so there is nothing to chunk.
    """

    required_inputs: ClassVar[tuple[str, ...]] = ("old_logprob", "teacher_logprobs")

    def __init__(
        self,
        lambda_coef: float = 0.5,
        kl_coef: float = 1.0,
        temperature: float = 1.0,
        chunk_size: int | None = None,
    ) -> None:
        if not 0.0 <= lambda_coef <= 1.0:
            raise ValueError(f"jsd: lambda_coef must be in [0, 1], got {lambda_coef}")
        if temperature <= 0:
            raise ValueError(f"jsd: temperature must be positive, got {temperature}")
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"jsd: chunk_size must be a positive int or None, got {chunk_size}")
        self.lambda_coef = lambda_coef
        self.kl_coef = kl_coef
        self.temperature = temperature
        self.chunk_size = chunk_size

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "jsd"
        mask_in = require(batch, "action_mask", who)
        student = require(batch, "old_logprob", who)
        teacher = require(batch, "teacher_logprobs", who)
        dtype = output_dtype(student, teacher)
        mask = mask_in.to(dtype)
        # Masked tokens may hold anything (padding): zero them so exp() stays finite.
        valid = mask != 0
        zero = torch.zeros_like(mask)
        s = torch.where(valid, student.to(dtype).detach(), zero) / self.temperature
        t = torch.where(valid, teacher.to(dtype).detach(), zero) / self.temperature
        b = self.lambda_coef
        if b == 0.0:
            divergence, advantage = s - t, t - s
        elif b == 1.0:
            ratio = torch.exp(t - s)
            divergence, advantage = ratio * (t - s), ratio - 1
        else:
            m = torch.logaddexp(t + math.log(b), s + math.log1p(-b))
            divergence = b * torch.exp(t - s) * (t - m) + (1 - b) * (s - m)
            advantage = (1 - b) * (m - s)
        metrics = _row_sum_metrics(divergence, mask, "jsd")
        metrics.update(_set_token_advantages(batch, self.kl_coef * advantage, mask))
        return batch, metrics


__all__ = ["JSDAdvantageFn", "OnPolicyDistillAdvantageFn"]
