"""Advantages for multi-step (agentic) episodes: ``step_wise_grpo`` and ``gigpo``.

An episode (one run of a task) is several rows, one per model call: equal ``trajectory_ids``,
turn order in ``step_ids``, the task in ``group_ids``. Rows of one episode may sit anywhere in the
batch; within an episode, steps are ordered by ``step_ids`` (ties, or no ``step_ids``: by row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trinity.algorithm import AdvantageFn
from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import (
    group_stats,
    output_dtype,
    require,
    scalar_rewards,
    set_outcome_advantages,
)
from trinity_algos.advantage.group import grpo_normalize, unbiased_std_or_one

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def _episode_order(batch: Batch, who: str) -> tuple[torch.Tensor, int, torch.Tensor]:
    """``(inverse, n_episodes, order)``: each row's episode index, and the rows sorted by
    (episode, step, row), so each episode's steps are contiguous and in turn order."""
    trajectory_ids = require(batch, "trajectory_ids", who).reshape(-1)
    _, inverse = torch.unique(trajectory_ids, return_inverse=True)
    n = inverse.numel()
    rows = torch.arange(n, device=inverse.device)
    steps = batch.get("step_ids")
    steps = rows if steps is None else steps.reshape(-1).to(inverse.device)
    order = torch.argsort(steps, stable=True)  # stable: equal steps keep row order
    order = order[torch.argsort(inverse[order], stable=True)]
    return inverse, int(inverse.max()) + 1 if n else 0, order


class StepWiseGRPOAdvantageFn(AdvantageFn):
    """Step-wise GRPO (multi-step episodes; after rLLM, github.com/rllm-org/rllm, on GRPO,
    arXiv:2402.03300).

    Each episode is scored by the scalar ``rewards`` of its **last step** (highest ``step_ids``);
    those scores are normalised GRPO-style over the episodes of a task (``group_ids``):
    ``A = (R - mean_task) / (std_task + epsilon)``, unbiased std, and a task with a single episode
    gets mean 0 and std 1. The episode's advantage is broadcast to every step (every valid token of
    each of its rows); with ``enable_step_norm`` it is divided by the episode's number of steps.

    ``std_cal_level="batch"``: the std is taken over the last-step rewards of every episode of the
    batch (the mean stays per task). ``std_threshold``: a task whose std is ``<= std_threshold``,
    or that has a single episode, is dropped: every row of it gets an all-zero ``action_mask``
    (``filtered_count`` rows, ``skipped_group_ratio`` of the tasks).
    """

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    required_inputs: ClassVar[tuple[str, ...]] = ("trajectory_ids",)

    def __init__(
        self,
        epsilon: float = 1e-6,
        enable_step_norm: bool = False,
        std_cal_level: str = "group",
        std_threshold: float | None = None,
    ) -> None:
        if std_cal_level not in ("group", "batch"):
            raise ValueError(
                f"step_wise_grpo: std_cal_level must be 'group' or 'batch', got {std_cal_level!r}"
            )
        self.epsilon = epsilon
        self.enable_step_norm = enable_step_norm
        self.std_cal_level = std_cal_level
        self.std_threshold = std_threshold

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "step_wise_grpo"
        mask = require(batch, "action_mask", who)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        rewards = scalar_rewards(batch, who)
        group_ids = require(batch, "group_ids", who).reshape(-1)
        episode, n_episodes, order = _episode_order(batch, who)
        # ``order`` lists each episode's rows as one block in (step, row) order: its last step
        # ends the block.
        steps = torch.bincount(episode, minlength=n_episodes)
        last_row = order[torch.cumsum(steps, 0) - 1]
        episode_reward = rewards[last_row.to(rewards.device)]
        episode_task = group_ids[last_row.to(group_ids.device)]

        stats = group_stats(episode_reward, episode_task)
        batch_std = unbiased_std_or_one(episode_reward) if self.std_cal_level == "batch" else None
        episode_adv = grpo_normalize(episode_reward, stats, self.epsilon, batch_std)
        if self.enable_step_norm:
            episode_adv = episode_adv / steps.to(episode_adv.device, torch.float64)
        advantage = episode_adv[episode.to(episode_adv.device)]

        n_tasks = stats.count.shape[0]
        metrics = {
            "reward_mean": float(episode_reward.mean()) if n_episodes else 0.0,
            "reward_std": float(episode_reward.std()) if n_episodes > 1 else 0.0,
            "group_count": float(n_tasks),
            "episode_count": float(n_episodes),
        }
        keep = torch.ones_like(advantage, dtype=torch.bool)
        metrics["skipped_group_ratio"] = 0.0
        if self.std_threshold is not None:
            skipped_task = (stats.count == 1) | (stats.std <= self.std_threshold)
            keep = ~skipped_task[stats.inverse][episode.to(stats.inverse.device)]
            batch["action_mask"] = mask * keep.to(mask.device).unsqueeze(-1).to(mask.dtype)
            advantage = advantage * keep
            metrics["skipped_group_ratio"] = float(skipped_task.sum()) / n_tasks if n_tasks else 0.0
        metrics["filtered_count"] = float((~keep).sum())
        metrics["experience_count"] = float(keep.sum())
        return set_outcome_advantages(batch, advantage, dtype), metrics


class GiGPOAdvantageFn(AdvantageFn):
    """GiGPO, group-in-group policy optimisation (Feng et al., arXiv:2505.10978):
    ``A = A_E(episode) + omega * A_S(step)``.

    Step rewards ``r_t``: ``info[step_reward_key]`` of each step when any step of the episode has
    one (missing steps count 0); otherwise the episode's scalar ``rewards`` on its last step and 0
    before. ``R_t = sum_{k >= t} gamma^(k - t) r_k`` is the discounted return-to-go of step ``t``.

    - Episode level: the episode return ``sum_t r_t`` is normalised over the episodes of its task,
      ``A_E = (x - mean) / (F + epsilon)``, with ``F`` the unbiased std (``fnorm="std"``) or 1
      (``"none"``); a task with a single episode gets mean 0, ``F = 1``.
    - Step level (anchor states): the steps of a task's episodes that share
      ``info[env_state_hash_key]`` (compared as strings) form a group, and ``A_S`` is ``R_t``
      normalised the same way within it. A step alone in its group, or without a hash, gets 0.

    ``A`` is written on every valid token of the step's row.
    """

    reads_token_level_rewards = False  # upstream's grouped form: the scalar reward

    required_inputs: ClassVar[tuple[str, ...]] = ("trajectory_ids",)

    def __init__(
        self,
        omega: float = 1.0,
        gamma: float = 1.0,
        fnorm: str = "none",
        epsilon: float = 1e-6,
        step_reward_key: str = "step_reward",
        env_state_hash_key: str = "env_state_hash",
    ) -> None:
        if fnorm not in ("std", "none"):
            raise ValueError(f"gigpo: fnorm must be 'std' or 'none', got {fnorm!r}")
        self.omega = omega
        self.gamma = gamma
        self.fnorm = fnorm
        self.epsilon = epsilon
        self.step_reward_key = step_reward_key
        self.env_state_hash_key = env_state_hash_key

    def _normalize(self, values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / (F + epsilon)`` within each group (float64); singletons: mean 0, F 1."""
        stats = group_stats(values, group_ids)
        single = stats.count == 1
        mean = torch.where(single, torch.zeros_like(stats.mean), stats.mean)
        denom = torch.ones_like(stats.std)
        if self.fnorm == "std":
            denom = torch.where(single, denom, stats.std)
        return (values - mean[stats.inverse]) / (denom[stats.inverse] + self.epsilon)

    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        who = "gigpo"
        require(batch, "action_mask", who)
        dtype = output_dtype(batch.get("token_level_rewards"), batch.get("rewards"))
        rewards = scalar_rewards(batch, who).tolist()
        group_ids = require(batch, "group_ids", who).reshape(-1).tolist()
        episode, n_episodes, order = _episode_order(batch, who)
        n = len(rewards)
        info: list[dict[str, Any]] = list(batch.get("info") or [{}] * n)
        if len(info) != n:
            raise ValueError(f"advantage_fn 'gigpo': batch['info'] has {len(info)} rows, expected {n}")

        # Per episode, in step order: step rewards, discounted returns-to-go, the episode return.
        steps_of: list[list[int]] = [[] for _ in range(n_episodes)]
        for row, ep in zip(order.tolist(), episode[order].tolist()):
            steps_of[ep].append(row)
        return_to_go = [0.0] * n
        episode_return = [0.0] * n_episodes
        episode_task = [0] * n_episodes
        for ep, rows in enumerate(steps_of):
            step_rewards = self._step_rewards(rows, rewards, info)
            running = 0.0
            for row, r in zip(reversed(rows), reversed(step_rewards)):
                running = r + self.gamma * running
                return_to_go[row] = running
            episode_return[ep] = sum(step_rewards)
            episode_task[ep] = group_ids[rows[-1]]

        device = episode.device
        f64 = {"dtype": torch.float64, "device": device}
        a_e = self._normalize(torch.tensor(episode_return, **f64), torch.tensor(episode_task, device=device))[
            episode
        ]

        # Anchor-state groups: (task, state hash) over the whole batch.
        buckets: dict[tuple[int, str], list[int]] = {}
        for row in range(n):
            state = (info[row] or {}).get(self.env_state_hash_key)
            if state is not None:
                buckets.setdefault((group_ids[row], str(state)), []).append(row)
        anchored = [rows for rows in buckets.values() if len(rows) > 1]
        a_s = torch.zeros(n, **f64)
        if anchored:
            rows = [row for group in anchored for row in group]
            ids = [k for k, group in enumerate(anchored) for _ in group]
            values = torch.tensor([return_to_go[row] for row in rows], **f64)
            a_s[torch.tensor(rows, device=device)] = self._normalize(values, torch.tensor(ids, device=device))

        advantage = a_e + self.omega * a_s
        episode_stats = group_stats(
            torch.tensor(episode_return, **f64), torch.tensor(episode_task, device=device)
        )
        metrics = {
            "episode_reward_mean": float(episode_stats.mean.mean()) if n_episodes else 0.0,
            "episode_reward_std": float(episode_stats.std.mean()) if n_episodes else 0.0,
            "anchor_groups_total": float(len(buckets)),
            "anchor_groups_size_gt1": float(len(anchored)),
            "anchor_group_hit_ratio": len(anchored) / len(buckets) if buckets else 0.0,
            "mean_abs_A_E": float(a_e.abs().mean()) if n else 0.0,
            "mean_abs_A_S": float(a_s.abs().mean()) if n else 0.0,
            "experience_count": float(n),
        }
        return set_outcome_advantages(batch, advantage, dtype), metrics

    def _step_rewards(self, rows: list[int], rewards: list[float], info: list[dict[str, Any]]) -> list[float]:
        """``r_t`` of an episode's steps (``rows`` in step order)."""
        key = self.step_reward_key
        if any(key in (info[row] or {}) for row in rows):
            return [float((info[row] or {}).get(key, 0.0)) for row in rows]
        # Sparse: the terminal reward on the last step.
        return [0.0] * (len(rows) - 1) + [rewards[rows[-1]]]


__all__ = ["GiGPOAdvantageFn", "StepWiseGRPOAdvantageFn"]
