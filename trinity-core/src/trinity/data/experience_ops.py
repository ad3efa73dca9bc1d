"""Built-in experience operators, under Trinity-RFT's names and arguments.

Groups are the experiences of one task (``eid.tid``); stats a workflow or an earlier operator
computed live in ``Experience.info`` (numbers) or ``Experience.metrics``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from trinity.data.operator import ExperienceOperator

if TYPE_CHECKING:
    from trinity.experience import Experience

_OPS = {
    "ADD": lambda reward, value: reward + value,
    "SUB": lambda reward, value: reward - value,
    "MUL": lambda reward, value: reward * value,
    "DIV": lambda reward, value: reward / value if value != 0 else reward,
}


def groups(experiences: Iterable[Experience]) -> dict[str, list[Experience]]:
    """Experiences by task (``eid.tid``), in first-seen order."""
    out: dict[str, list[Experience]] = defaultdict(list)
    for exp in experiences:
        out[exp.eid.tid].append(exp)
    return out


def _stat(exp: Experience, key: str) -> float | None:
    value = exp.info.get(key, exp.metrics.get(key))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _valid(reward: Any) -> bool:
    return isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)


class RewardShapingMapper(ExperienceOperator):
    """Reshape each reward with stats: ``reward = reward <op> weight * info[stats_key]`` for each
    of ``reward_shaping_configs`` (``stats_key``, ``op_type`` ADD / SUB / MUL / DIV, ``weight``),
    in order. An experience without the stat, or without a reward, is left as it is (counted in
    ``missing_stats``). Metrics: ``reward_diff/mean|min|max``."""

    def __init__(self, reward_shaping_configs: list[Mapping[str, Any]] | None = None) -> None:
        self.configs = []
        for i, cfg in enumerate(reward_shaping_configs or []):
            op = str(cfg.get("op_type", "ADD")).upper()
            if op not in _OPS:
                raise ValueError(
                    f"reward_shaping_configs[{i}].op_type {cfg.get('op_type')!r} is not one of ADD, SUB, MUL, DIV"
                )
            if not cfg.get("stats_key"):
                raise ValueError(f"reward_shaping_configs[{i}] needs a stats_key")
            self.configs.append((str(cfg["stats_key"]), _OPS[op], float(cfg.get("weight", 1.0))))

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"reward_shaping_configs": []}

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        diffs, missing = [], 0
        for exp in experiences:
            if not _valid(exp.reward):
                continue
            before = reward = float(exp.reward)
            for key, op, weight in self.configs:
                value = _stat(exp, key)
                if value is None:
                    missing += 1
                    continue
                reward = op(reward, weight * value)
            exp.reward = reward
            diffs.append(reward - before)
        metrics = {"missing_stats": float(missing)}
        if diffs:
            metrics.update(
                {
                    "reward_diff/mean": sum(diffs) / len(diffs),
                    "reward_diff/min": min(diffs),
                    "reward_diff/max": max(diffs),
                }
            )
        return experiences, metrics


class PassRateCalculator(ExperienceOperator):
    """Each group's pass rate (mean reward of its rollouts) into ``info["pass_rate"]``, and how
    many groups can teach anything: ``valid_ratio`` (0 < pass rate < 1), ``all_pass_ratio``,
    ``all_fail_ratio``, ``mean_pass_rate``."""

    def __init__(self, **_: Any) -> None:  # Trinity-RFT's takes (and ignores) any arguments
        pass

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        rates = []
        for members in groups(experiences).values():
            rewards = [float(e.reward) for e in members if _valid(e.reward)]
            if not rewards:
                continue
            rate = sum(rewards) / len(rewards)
            rates.append(rate)
            for exp in members:
                exp.info["pass_rate"] = rate
        if not rates:
            return experiences, {}
        n = len(rates)
        return experiences, {
            "valid_ratio": sum(0 < r < 1 for r in rates) / n,
            "all_pass_ratio": sum(r >= 1 for r in rates) / n,
            "all_fail_ratio": sum(r <= 0 for r in rates) / n,
            "mean_pass_rate": sum(rates) / n,
        }


class _ThresholdOperator(ExperienceOperator):
    """An operator with one argument, ``threshold`` (default 0.0)."""

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = float(threshold)

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"threshold": 0.0}


class RewardFilter(_ThresholdOperator):
    """Keep experiences whose reward is at least ``threshold``."""

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept = [e for e in experiences if _valid(e.reward) and e.reward >= self.threshold]
        return kept, {}


class RewardSTDFilter(_ThresholdOperator):
    """Drop whole groups whose reward standard deviation is at most ``threshold`` (all right or
    all wrong: no advantage signal; DAPO's dynamic sampling), and groups of one experience."""

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept, dropped_groups = [], 0
        for members in groups(experiences).values():
            rewards = [float(e.reward) for e in members if _valid(e.reward)]
            if len(rewards) < 2:
                dropped_groups += 1
                continue
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            # Equal rewards can leave a rounding residue (eight 1.1s have a mean of 1.1000000000000003).
            if max(rewards) - min(rewards) <= 1e-9 * max(1.0, abs(mean)):
                std = 0.0
            if std <= self.threshold:
                dropped_groups += 1
                continue
            kept.extend(members)
        return kept, {"dropped_groups": float(dropped_groups)}


class InvalidRewardFilter(ExperienceOperator):
    """Drop experiences whose reward is missing, NaN or infinite."""

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        return [e for e in experiences if _valid(e.reward)], {}


class DuplicateFilter(ExperienceOperator):
    """Drop experiences whose response repeats an earlier one: the same response token ids
    (``by: tokens``) or text (``by: text``) within its group (``scope: group``) or anywhere in
    the step (``scope: step``). The first of each is kept."""

    def __init__(self, scope: str = "group", by: str = "tokens") -> None:
        if scope not in ("group", "step"):
            raise ValueError(f"scope {scope!r} is not one of group, step")
        if by not in ("tokens", "text"):
            raise ValueError(f"by {by!r} is not one of tokens, text")
        self.scope, self.by = scope, by

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"scope": "group", "by": "tokens"}

    def _key(self, exp: Experience) -> Any:
        if self.by == "text":
            return exp.response_text
        # The raw bytes: hashing them is ~50x cheaper than a tuple of Python ints.
        response = exp.tokens[exp.prompt_length :]
        return (str(response.dtype), response.contiguous().numpy().tobytes())

    def process(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        seen: set[Any] = set()
        kept = []
        for exp in experiences:
            key = (exp.eid.tid if self.scope == "group" else None, self._key(exp))
            if key in seen:
                continue
            seen.add(key)
            kept.append(exp)
        return kept, {}


#: The built-in experience operators by their Trinity-RFT names.
EXPERIENCE_OPERATORS: dict[str, type[ExperienceOperator]] = {
    "reward_shaping_mapper": RewardShapingMapper,
    "pass_rate_calculator": PassRateCalculator,
    "reward_filter": RewardFilter,
    "reward_std_filter": RewardSTDFilter,
    "invalid_reward_filter": InvalidRewardFilter,
    "duplicate_filter": DuplicateFilter,
}
