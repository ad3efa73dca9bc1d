"""Shared fixtures for the buffer tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trinity.experience import EID, Experience


def _make_experience(i: int, *, tokens: int = 16, writer: str = "w", model_version: int = 0) -> Experience:
    return Experience(
        tokens=torch.arange(tokens),
        prompt_length=tokens // 2,
        logprobs=torch.full((tokens - tokens // 2,), -0.5),
        reward=float(i),
        eid=EID(batch=writer, task=i, run=i % 3),
        model_version=model_version,
        prompt_text=f"prompt {i}",
        response_text=f"response {i}",
    )


@pytest.fixture
def make_experience() -> Callable[..., Experience]:
    """``make_experience(i, tokens=16, writer="w", model_version=0)``: a small deterministic
    experience whose ``eid`` is ``(writer, i)`` and reward is ``i``."""
    return _make_experience
