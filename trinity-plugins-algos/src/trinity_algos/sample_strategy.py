"""Sample strategies: how the trainer draws each step's experiences from its buffers."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.algorithm import SampleStrategy
from trinity.experience import BufferExhausted
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from trinity.experience import BufferReader, Experience
else:
    torch = lazy_import("torch")


def mix_split(expert_data_ratio: float, train_batch_size: int) -> tuple[int, int]:
    """``(usual rows, expert rows)`` of a ``mix`` training batch: the expert share rounded up.
    The ``mix`` losses get the same counts (``MIXAlgorithm.derived_args``)."""
    expert = math.ceil(expert_data_ratio * train_batch_size)
    return train_batch_size - expert, expert


class DefaultSampleStrategy(SampleStrategy):
    """Reads ``train_batch_size`` experiences from the experience buffer each step."""

    def sample(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """The next ``train_batch_size`` experiences (fewer only if the reader times out)."""
        start = time.perf_counter()
        experiences = self.experience_buffer.read(self.train_batch_size)
        return experiences, {"timing/read_experience": time.perf_counter() - start}


class WarmupSampleStrategy(DefaultSampleStrategy):
    """Alias of ``default``, kept because Trinity-RFT configs name it."""


class MixSampleStrategy(SampleStrategy):
    """Mixes the policy's rollouts with expert (SFT) data at ``expert_data_ratio``.

    Each step reads ``ceil(expert_data_ratio * train_batch_size)`` expert experiences from the
    auxiliary buffer ``sft_dataset_name`` and the rest from the experience buffer. Expert
    experiences are marked ``info["is_expert"] = True`` (the trainer turns that into
    ``expert_mask``) and get a zero reward and zero ``logprobs`` / ``advantages`` so they batch
    with rollouts. They also get their own ``eid`` task per row, so a group-baseline advantage
    never groups them with each other or with rollouts of a real task.
    """

    def __init__(
        self,
        *,
        experience_buffer: BufferReader,
        auxiliary_buffers: Mapping[str, BufferReader] | None = None,
        train_batch_size: int,
        expert_data_ratio: float = 0.5,
        sft_dataset_name: str = "sft_dataset",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            experience_buffer=experience_buffer,
            auxiliary_buffers=auxiliary_buffers,
            train_batch_size=train_batch_size,
        )
        if not 0.0 <= expert_data_ratio <= 1.0:
            raise ValueError(
                f"algorithm.sample_strategy_args.expert_data_ratio must be in [0, 1], got {expert_data_ratio}"
            )
        if sft_dataset_name not in self.auxiliary_buffers:
            have = ", ".join(sorted(self.auxiliary_buffers)) or "none"
            raise ValueError(
                f"sample_strategy 'mix' reads expert data from "
                f"buffer.trainer_input.auxiliary_buffers.{sft_dataset_name}, which is not configured "
                f"(configured: {have}); add it or set algorithm.sample_strategy_args.sft_dataset_name"
            )
        self.expert_data_ratio = expert_data_ratio
        self.sft_dataset_name = sft_dataset_name
        self.usual_batch_size, self.expert_batch_size = mix_split(expert_data_ratio, train_batch_size)
        self.expert_buffer = self.auxiliary_buffers[sft_dataset_name]

    def sample(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """Rollouts first, then expert experiences."""
        start = time.perf_counter()
        usual = self.experience_buffer.read(self.usual_batch_size) if self.usual_batch_size else []
        expert = self.expert_buffer.read(self.expert_batch_size) if self.expert_batch_size else []
        for exp in usual:
            exp.info["is_expert"] = False
        for i, exp in enumerate(expert):
            self._mark_expert(exp, step, i)
        return usual + expert, {
            "timing/read_experience": time.perf_counter() - start,
            "sample/usual_count": float(len(usual)),
            "sample/expert_count": float(len(expert)),
        }

    @staticmethod
    def _mark_expert(exp: Experience, step: int, index: int) -> None:
        exp.info["is_expert"] = True
        exp.reward = 0.0
        n = exp.response_length
        if exp.logprobs is None:
            exp.logprobs = torch.zeros(n, dtype=torch.float32)
        exp.advantages = torch.zeros(n, dtype=torch.float32)
        exp.eid.batch = f"expert/{step}"
        exp.eid.task = index


class StalenessControlSampleStrategy(SampleStrategy):
    """Never trains on experiences produced by weights more than ``max_staleness`` versions old.

    An experience is dropped when ``exp.model_version < current_version - max_staleness``; reads
    continue until ``train_batch_size`` fresh experiences are collected. The trainer calls
    :meth:`set_model_version` after every weight update; until it does, ``step`` passed to
    :meth:`sample` stands in for the current version. Drops are counted per step
    (``sample/stale_dropped``) and in total (``sample/stale_dropped_total``, kept in
    ``state_dict`` across resumes).
    """

    def __init__(
        self,
        *,
        experience_buffer: BufferReader,
        auxiliary_buffers: Mapping[str, BufferReader] | None = None,
        train_batch_size: int,
        max_staleness: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            experience_buffer=experience_buffer,
            auxiliary_buffers=auxiliary_buffers,
            train_batch_size=train_batch_size,
        )
        if max_staleness < 0:
            raise ValueError(
                f"algorithm.sample_strategy_args.max_staleness must be >= 0, got {max_staleness}"
            )
        self.max_staleness = max_staleness
        self.model_version: int | None = None
        self.dropped_total = 0

    def set_model_version(self, version: int) -> None:
        """Tell the strategy which weight version the trainer now holds."""
        self.model_version = int(version)

    def sample(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """``train_batch_size`` experiences at most ``max_staleness`` versions old."""
        start = time.perf_counter()
        current = self.model_version if self.model_version is not None else step
        oldest_allowed = current - self.max_staleness
        kept: list[Experience] = []
        dropped = 0
        while len(kept) < self.train_batch_size:
            try:
                got = self.experience_buffer.read(self.train_batch_size - len(kept))
            except BufferExhausted:
                if not kept:
                    raise
                break  # train on the fresh experiences already read rather than lose them
            if not got:
                # The reader timed out with nothing: return a short batch rather than spin.
                break
            for exp in got:
                if exp.model_version < oldest_allowed:
                    dropped += 1
                else:
                    kept.append(exp)
        self.dropped_total += dropped
        return kept, {
            "timing/read_experience": time.perf_counter() - start,
            "sample/stale_dropped": float(dropped),
            "sample/stale_dropped_total": float(self.dropped_total),
            "sample/model_version": float(current),
        }

    def state_dict(self) -> dict[str, Any]:
        """Drop counter and last model version."""
        return {"dropped_total": self.dropped_total, "model_version": self.model_version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.dropped_total = int(state.get("dropped_total", 0))
        self.model_version = state.get("model_version")


__all__ = [
    "DefaultSampleStrategy",
    "MixSampleStrategy",
    "StalenessControlSampleStrategy",
    "WarmupSampleStrategy",
]
