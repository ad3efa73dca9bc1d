"""Advantages built from (discounted) returns: PPO's GAE, REINFORCE, REINFORCE++ and ReMax."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm import AdvantageFn, masked_whiten
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    output_dtype,
    require,
    scalar_rewards,
    set_outcome_advantages,
    token_level_rewards,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` along the last axis (no reset inside the row)."""
    if gamma == 1.0:
        return rewards.flip(-1).cumsum(-1).flip(-1)
    returns = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        returns[..., t] = running
    return returns


class PPOAdvantageFn(AdvantageFn):
    """PPO: generalised advantage estimation over ``token_level_rewards`` and critic ``values``.

    Masked tokens (multi-turn observations, padding) are skipped: they neither add a TD step
    nor break the recursion, exactly as veRL's ``compute_gae_advantage_return``.
    ``returns = advantages + values`` before the advantages are whitened over valid tokens.
    Both are zero on masked tokens.
    """

    def __init__(self, gamma: float = 1.0, lam: float = 1.0) -> None:
        self.gamma = gamma
        self.lam = lam

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask_in = require(batch, "action_mask", "ppo")
        values = require(batch, "values", "ppo")
        rewards = token_level_rewards(batch, "ppo")
        dtype = output_dtype(values, rewards)
        mask = mask_in.to(dtype)
        rewards = rewards.to(dtype)
        values = values.to(dtype).detach()
        gamma, lam = self.gamma, self.lam
        with torch.no_grad():
            next_value = torch.zeros_like(values[:, 0])
            last_gae = torch.zeros_like(values[:, 0])
            advantages = torch.empty_like(values)
            for t in range(values.shape[-1] - 1, -1, -1):
                m = mask[:, t]
                delta = rewards[:, t] + gamma * next_value - values[:, t]
                gae = delta + gamma * lam * last_gae
                next_value = values[:, t] * m + (1 - m) * next_value
                last_gae = gae * m + (1 - m) * last_gae
                advantages[:, t] = last_gae
            returns = (advantages + values) * mask
            advantages = masked_whiten(advantages, mask) * mask
        batch["advantages"] = advantages
        batch["returns"] = returns
        return batch, {"returns_mean": float(returns.sum() / mask.sum().clamp(min=1))}


class REINFORCEAdvantageFn(AdvantageFn):
    """REINFORCE (Williams, 1992): the scalar reward itself, ``A = r``, on every valid token.

    Upstream's grouped form (``REINFORCEGroupAdvantage``): ``r`` is ``Experience.reward`` (the
    batch's ``rewards``), not the sum of ``token_level_rewards``; no baseline, no arguments.
    """

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        require(batch, "action_mask", "reinforce")
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        scores = scalar_rewards(batch, "reinforce")
        mean = float(scores.mean()) if scores.numel() else 0.0
        return set_outcome_advantages(batch, scores, dtype), {"reward_mean": mean}


class REINFORCEPlusPlusAdvantageFn(AdvantageFn):
    """REINFORCE++: discounted returns of ``token_level_rewards`` (``gamma``), whitened over the
    valid tokens of the whole batch; ``returns`` are the raw discounted returns."""

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = gamma

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask_in = require(batch, "action_mask", "reinforceplusplus")
        rewards = token_level_rewards(batch, "reinforceplusplus")
        dtype = output_dtype(rewards)
        mask = mask_in.to(dtype)
        with torch.no_grad():
            returns = discounted_returns(rewards.to(dtype), self.gamma) * mask
            advantages = masked_whiten(returns, mask) * mask
        batch["advantages"] = advantages
        batch["returns"] = returns
        return batch, {}


class REMAXAdvantageFn(AdvantageFn):
    """ReMax: ``A_t = G_t - b`` where ``G_t`` is the undiscounted return-to-go and ``b`` the
    reward of the greedy rollout of the same prompt.

    ``b`` comes from ``batch["reward_baselines"] (B,)`` when present, else from
    ``info[i]["reward_baseline"]`` (the workflow that runs the greedy rollout records it there).
    """

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        mask_in = require(batch, "action_mask", "remax")
        rewards = token_level_rewards(batch, "remax")
        dtype = output_dtype(rewards)
        mask = mask_in.to(dtype)
        baselines = batch.get("reward_baselines")
        if baselines is None:
            baselines = torch.tensor(
                self._baselines_from_info(batch, mask.shape[0]), dtype=dtype, device=mask.device
            )
        with torch.no_grad():
            returns = discounted_returns(rewards.to(dtype) * mask, 1.0) * mask
            advantages = returns - baselines.to(dtype).unsqueeze(-1) * mask
        batch["advantages"] = advantages
        batch["returns"] = returns
        return batch, {"reward_baseline_mean": float(baselines.to(torch.float64).mean())}

    @staticmethod
    def _baselines_from_info(batch: Batch, n_rows: int) -> list[float]:
        info = batch.get("info")
        if info is None or len(info) != n_rows:
            raise KeyError(
                "advantage_fn 'remax' needs the greedy-rollout reward of every row: "
                "batch['reward_baselines'] or batch['info'][i]['reward_baseline']"
            )
        missing = [i for i, row in enumerate(info) if "reward_baseline" not in (row or {})]
        if missing:
            raise KeyError(
                f"advantage_fn 'remax': info[i]['reward_baseline'] is missing for rows {missing[:10]}; "
                "the workflow must record the greedy rollout's reward there"
            )
        return [float(row["reward_baseline"]) for row in info]


__all__ = [
    "PPOAdvantageFn",
    "REINFORCEAdvantageFn",
    "REINFORCEPlusPlusAdvantageFn",
    "REMAXAdvantageFn",
    "discounted_returns",
]
