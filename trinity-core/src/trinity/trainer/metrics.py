"""Batch statistics logged by the trainer, with Trinity-RFT / veRL metric names."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.algorithm import masked_mean
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    valid = values[mask.bool()]
    if valid.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(masked_mean(values.float(), mask)),
        f"{prefix}/max": float(valid.max()),
        f"{prefix}/min": float(valid.min()),
    }


def step_summary(
    batch: Mapping[str, Any],
    timing: dict[str, float],
    global_step: int,
    max_response_length: int | None = None,
) -> dict[str, float]:
    """Metrics every back-end reports at the end of a step: data statistics, the step's timings,
    token throughput (``timing["timing/step"]`` must be set) and the global step."""
    out = data_metrics(batch, max_response_length)
    out.update(timing)
    n_tokens = float(batch["attention_mask"].sum())
    out["perf/total_num_tokens"] = n_tokens
    out["perf/throughput"] = n_tokens / max(timing["timing/step"], 1e-9)
    out["training/global_step"] = float(global_step)
    # How many episodes the step's experiences came from (fewer than experiences when the
    # workflow is step-wise: one experience per turn).
    if "trajectory_ids" in batch:
        out["training/num_trajectories"] = float(batch["trajectory_ids"].unique().numel())
    return out


def data_metrics(batch: Mapping[str, Any], max_response_length: int | None = None) -> dict[str, float]:
    """``critic/score``, ``critic/rewards``, ``critic/advantages``, ``critic/returns``,
    ``critic/values`` (mean/max/min), ``response_length/*`` and ``prompt_length/*``."""
    mask = batch["action_mask"]
    out = _stats("critic/score", batch["rewards"])
    if "token_level_rewards" in batch:
        out.update(_stats("critic/rewards", (batch["token_level_rewards"] * mask).sum(-1)))
    else:
        out.update(_stats("critic/rewards", batch["rewards"]))
    for key, name in (
        ("advantages", "critic/advantages"),
        ("returns", "critic/returns"),
        ("values", "critic/values"),
    ):
        if key in batch:
            out.update(_masked_stats(name, batch[key], mask))
    response_length = batch["response_mask"].sum(-1)
    out.update(_stats("response_length", response_length))
    if max_response_length:
        out["response_length/clip_ratio"] = float((response_length >= max_response_length).float().mean())
    prompt_length = batch["attention_mask"].sum(-1) - response_length
    out.update(_stats("prompt_length", prompt_length))
    return out


def logprob_agreement(batch: Mapping[str, Any]) -> dict[str, float]:
    """How far the trainer's log-probs of the sampled tokens are from the rollout engine's.

    ``batch["old_logprob"]`` must be the trainer's own forward of the weights the rollouts were
    sampled with (not copied from the rollout), and ``batch["has_rollout_logprobs"]`` true; over
    the tokens of ``action_mask``:

    * ``rollout/logprob_diff/mean`` and ``/max``: mean and largest ``|trainer - rollout|``;
    * ``rollout/importance_ratio/{mean,min,max,std}``: ``exp(trainer - rollout)``, the
      correction an off-policy update would apply for the engine/trainer mismatch alone;
    * ``training/rollout_probs_diff_{mean,max,std}``: veRL's names, ``|p_trainer - p_rollout|``.

    Two stacks computing the same model with different kernels (vLLM and FSDP, the lean
    decoding step and transformers' forward) agree to ~1e-5 in fp32; a value orders of magnitude
    larger means the engine is not running the trainer's weights (a failed sync, a stale tied
    head) or samples from another distribution (temperature, top-k). Off-policy settings
    (``sync_offset`` > 0, asynchronous sync) add the policy's own drift between the two weight
    versions. Returns ``{}`` where there is nothing to compare.
    """
    compared = _compared_logprobs(batch)
    if compared is None:
        return {}
    trainer, rollout = compared
    diff = trainer - rollout
    ratio = diff.exp()
    probs = (trainer.exp() - rollout.exp()).abs()
    return {
        "rollout/logprob_diff/mean": float(diff.abs().mean()),
        "rollout/logprob_diff/max": float(diff.abs().max()),
        "rollout/importance_ratio/mean": float(ratio.mean()),
        "rollout/importance_ratio/min": float(ratio.min()),
        "rollout/importance_ratio/max": float(ratio.max()),
        "rollout/importance_ratio/std": float(ratio.std(unbiased=False)),
        "training/rollout_probs_diff_mean": float(probs.mean()),
        "training/rollout_probs_diff_max": float(probs.max()),
        "training/rollout_probs_diff_std": float(probs.std(unbiased=False)),
    }


def logprob_diff_histogram(batch: Mapping[str, Any]) -> dict[str, Any]:
    """``{"rollout/logprob_diff/histogram": Histogram}`` of the signed per-token difference
    ``trainer - rollout`` over ``action_mask`` (the tokens :func:`logprob_agreement` compares;
    TensorBoard plots it per step), or ``{}`` where there is nothing to compare. A bf16 engine
    spreads it symmetrically around 0; a one-sided shift points at a different distribution
    (temperature, top-k/top-p renormalisation)."""
    from trinity.monitor.base import Histogram

    compared = _compared_logprobs(batch)
    if compared is None:
        return {}
    trainer, rollout = compared
    return {"rollout/logprob_diff/histogram": Histogram.of((trainer - rollout).detach().cpu().numpy())}


def _compared_logprobs(batch: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """The trainer's and the rollout engine's log-probs of the tokens of ``action_mask`` (flat),
    or ``None`` where there is nothing to compare (no rollout log-probs, no trainer forward of
    the sampling weights, no token trained). Expert rows (``mix``: SFT data in the batch, with
    no rollout log-probs) are left out: no engine sampled them."""
    if not batch.get("has_rollout_logprobs") or "old_logprob" not in batch:
        return None
    mask = batch["action_mask"].bool()
    expert = batch.get("expert_mask")
    if expert is not None and expert.any():
        mask = mask & ~expert.bool().to(mask.device).unsqueeze(-1)
    if not mask.any():
        return None
    trainer = batch["old_logprob"].float()[mask]
    return trainer, batch["rollout_logprobs"].float().to(trainer.device)[mask]


class MetricAccumulator:
    """Weighted means of per-micro-batch metrics (weights = the micro-batch loss weights)."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, float], weight: float, prefix: str = "") -> None:
        for key, value in metrics.items():
            self._sums[prefix + key] += float(value) * weight
            self._weights[prefix + key] += weight

    def result(self) -> dict[str, float]:
        return {k: self._sums[k] / w if w else 0.0 for k, w in self._weights.items()}


__all__ = ["MetricAccumulator", "data_metrics", "logprob_agreement", "logprob_diff_histogram"]
