"""Sample strategies, fed by a small in-memory reader."""

from __future__ import annotations

import pytest
import torch

from trinity.experience import EID, BufferExhausted, Experience
from trinity_algos.sample_strategy import (
    DefaultSampleStrategy,
    MixSampleStrategy,
    StalenessControlSampleStrategy,
    WarmupSampleStrategy,
)


class MemoryReader:
    """Reads a list front to back; raises BufferExhausted at the end; records request sizes."""

    def __init__(self, items):
        self.items = list(items)
        self.requests = []

    def read(self, batch_size, timeout=None):
        self.requests.append(batch_size)
        if not self.items:
            raise BufferExhausted("empty")
        out, self.items = self.items[:batch_size], self.items[batch_size:]
        return out

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def exp(i, version=0, logprobs=True):
    return Experience(
        tokens=torch.arange(5),
        prompt_length=2,
        logprobs=torch.full((3,), -1.0) if logprobs else None,
        reward=1.0,
        eid=EID(batch=0, task=i),
        model_version=version,
    )


@pytest.mark.parametrize("cls", [DefaultSampleStrategy, WarmupSampleStrategy])
def test_default_reads_train_batch_size(cls):
    reader = MemoryReader([exp(i) for i in range(10)])
    strategy = cls(experience_buffer=reader, train_batch_size=4)
    batch, metrics = strategy.sample(0)
    assert [e.eid.task for e in batch] == [0, 1, 2, 3]
    assert reader.requests == [4] and "timing/read_experience" in metrics


def test_mix_splits_and_marks_expert_rows():
    usual = MemoryReader([exp(i) for i in range(10)])
    expert = MemoryReader([exp(100 + i, logprobs=False) for i in range(10)])
    strategy = MixSampleStrategy(
        experience_buffer=usual,
        auxiliary_buffers={"sft_dataset": expert},
        train_batch_size=5,
        expert_data_ratio=0.3,
    )
    batch, metrics = strategy.sample(step=7)
    # ceil(0.3 * 5) = 2 expert rows, 3 usual rows
    assert usual.requests == [3] and expert.requests == [2]
    assert [e.info["is_expert"] for e in batch] == [False, False, False, True, True]
    for i, e in enumerate(batch[3:]):
        assert e.reward == 0.0
        assert torch.equal(e.logprobs, torch.zeros(3)) and torch.equal(e.advantages, torch.zeros(3))
        assert e.eid.tid == f"expert/7/{i}"  # its own group, never a rollout's
    assert metrics["sample/expert_count"] == 2.0


def test_mix_without_its_buffer_names_the_key():
    with pytest.raises(ValueError, match=r"auxiliary_buffers\.demo"):
        MixSampleStrategy(experience_buffer=MemoryReader([]), train_batch_size=4, sft_dataset_name="demo")


def test_staleness_control_drops_old_experiences():
    versions = [0, 3, 1, 4, 2, 4, 4]
    reader = MemoryReader([exp(i, v) for i, v in enumerate(versions)])
    strategy = StalenessControlSampleStrategy(experience_buffer=reader, train_batch_size=3, max_staleness=1)
    strategy.set_model_version(4)  # oldest allowed: 3
    batch, metrics = strategy.sample(step=0)
    assert [e.model_version for e in batch] == [3, 4, 4]
    assert metrics["sample/stale_dropped"] == 3.0  # versions 0, 1, 2
    assert reader.requests == [3, 2, 1]  # asks only for what is still missing
    state = strategy.state_dict()
    fresh = StalenessControlSampleStrategy(experience_buffer=MemoryReader([]), train_batch_size=3)
    fresh.load_state_dict(state)
    assert fresh.dropped_total == 3 and fresh.model_version == 4


def test_staleness_control_uses_step_until_told_and_keeps_partial_batch_at_end():
    reader = MemoryReader([exp(0, 5), exp(1, 9)])
    strategy = StalenessControlSampleStrategy(experience_buffer=reader, train_batch_size=4, max_staleness=0)
    batch, metrics = strategy.sample(step=9)  # no set_model_version: step 9 is the version
    assert [e.model_version for e in batch] == [9]
    assert metrics["sample/stale_dropped"] == 1.0
    with pytest.raises(BufferExhausted):
        strategy.sample(step=9)
