"""Fixtures for config tests: a private plugin registry with small fake algorithms.

The fakes stand in for ``trinity-plugins-algos`` so these tests know every default exactly and
do not change when the real plugin does.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trinity import hookimpl, plugins
from trinity.algorithm import AdvantageFn, AlgorithmType, EntropyLossFn, KLFn, PolicyLossFn, SampleStrategy
from trinity.config import resolve as resolve_module


class GroupAdvantage(AdvantageFn):
    def __init__(self, epsilon: float = 1e-6, std_threshold: float | None = None) -> None:
        self.epsilon, self.std_threshold = epsilon, std_threshold

    def __call__(self, batch):
        return batch, {}


class GAEAdvantage(AdvantageFn):
    def __init__(self, gamma: float = 1.0, lam: float = 0.95) -> None:
        self.gamma, self.lam = gamma, lam

    def __call__(self, batch):
        return batch, {}


class ClipLoss(PolicyLossFn):
    def __init__(self, clip_range: float = 0.2, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)
        self.clip_range = clip_range

    def __call__(self, logprob, **kwargs):
        return logprob.sum(), {}


class SFTLoss(PolicyLossFn):
    def __call__(self, logprob, **kwargs):
        return logprob.sum(), {}


class K2(KLFn):
    def calculate_kl(self, logprob, ref_logprob):
        return 0.5 * (logprob - ref_logprob) ** 2


class NoKL(KLFn):
    def calculate_kl(self, logprob, ref_logprob):
        return logprob * 0


class DefaultEntropy(EntropyLossFn):
    def __call__(self, entropy, action_mask, loss_agg_mode="token-mean", **kwargs):
        return entropy.sum() * 0, {}


class DefaultSample(SampleStrategy):
    def sample(self, step):
        return [], {}


class FakePPO(AlgorithmType):
    use_critic = True
    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {
            "repeat_times": 1,
            "sample_strategy": "default",
            "advantage_fn": "gae",
            "policy_loss_fn": "clip",
            "kl_penalty_fn": "none",
            "kl_loss_fn": "k2",
            "entropy_loss_fn": "default",
        }


class FakeGRPO(AlgorithmType):
    use_reference = True

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {
            "repeat_times": 2,
            "sample_strategy": "default",
            "advantage_fn": "grpo",
            "advantage_fn_args": {"epsilon": 1e-3},
            "policy_loss_fn": "clip",
            "kl_penalty_fn": "none",
            "kl_loss_fn": "k2",
            "kl_loss_fn_args": {"kl_coef": 0.05},
            "entropy_loss_fn": "default",
        }

    @classmethod
    def check_config(cls, config) -> None:
        if config.algorithm.repeat_times < 2:
            raise ValueError(
                "algorithm.repeat_times must be at least 2 for grpo (it compares rollouts of a task)"
            )


class FakeSFT(AlgorithmType):
    use_advantage = False
    schema = "sft"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {"sample_strategy": "default", "policy_loss_fn": "sft", "kl_loss_fn": "none"}

    @classmethod
    def check_config(cls, config) -> None:
        if config.mode != "train":
            raise ValueError(f"mode must be 'train' for sft, got {config.mode!r}")


class FakeAlgorithms:
    """A plugin object registering the fakes under the names the examples use."""

    @hookimpl
    def register_algorithm_types(self, register):
        register("ppo", FakePPO)
        register("grpo", FakeGRPO)
        register("sft", FakeSFT)

    @hookimpl
    def register_advantage_fns(self, register):
        register("grpo", GroupAdvantage)
        register("gae", GAEAdvantage)
        register("ppo", GAEAdvantage)

    @hookimpl
    def register_policy_loss_fns(self, register):
        register("clip", ClipLoss)
        register("sft", SFTLoss)

    @hookimpl
    def register_kl_fns(self, register):
        register("k2", K2)
        register("low_var_kl", K2)
        register("none", NoKL)

    @hookimpl
    def register_entropy_loss_fns(self, register):
        register("default", DefaultEntropy)

    @hookimpl
    def register_sample_strategies(self, register):
        register("default", DefaultSample)


@pytest.fixture(autouse=True)
def fake_algorithms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[plugins.TrinityPluginManager]:
    """A fresh registry holding only the fakes; CPU back-ends; HOME and cwd in a temp dir."""
    manager = plugins.TrinityPluginManager(autoload=False)
    manager.register_plugin(FakeAlgorithms(), "fake-algorithms")
    previous = plugins.set_manager(manager)
    monkeypatch.setattr(resolve_module, "gpu_backend_available", lambda package: False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRINITY_CHECKPOINT_ROOT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        yield manager
    finally:
        plugins.set_manager(previous)


@pytest.fixture
def minimal_yaml() -> str:
    """A small valid config (grpo, one training taskset) for tests to append to or edit."""
    return MINIMAL


MINIMAL = """
    mode: both
    model:
      model_path: tiny-model
      max_prompt_tokens: 64
      max_response_tokens: 32
    algorithm:
      algorithm_type: grpo
      repeat_times: 4
    buffer:
      batch_size: 2
      explorer_input:
        tasksets:
          - name: train
            path: data/train.jsonl
"""


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write dedented YAML text to ``tmp_path/<name>`` and return its path."""

    def write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write
