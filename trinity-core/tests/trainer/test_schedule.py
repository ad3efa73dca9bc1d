"""Learning-rate schedules: warm-up, constant, cosine with a floor (veRL's formulas)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from trinity.config import OptimizerConfig
from trinity.trainer.schedule import build_scheduler, warmup_steps


def _lrs(opt_config: OptimizerConfig, total: int | None, n: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=opt_config.lr)
    scheduler = build_scheduler(optimizer, opt_config, total)
    out = []
    for _ in range(n):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_constant_with_warmup_steps():
    lrs = _lrs(OptimizerConfig(lr=1.0, lr_warmup_steps=4), None, 6)
    assert lrs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


def test_cosine_with_warmup_ratio_and_floor():
    config = OptimizerConfig(lr=2.0, lr_warmup_steps_ratio=0.2, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    assert warmup_steps(config, 10) == 2
    lrs = _lrs(config, 10, 11)
    assert lrs[0] == pytest.approx(0.2)  # warm-up starts at the floor
    assert lrs[1] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    assert lrs[2] == pytest.approx(2.0)
    # Half-way through the decay: floor + (1 - floor) * (1 + cos(pi/2)) / 2.
    assert lrs[6] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    assert lrs[10] == pytest.approx(0.2)
    assert all(a >= b for a, b in itertools.pairwise(lrs[2:]))  # non-increasing after warm-up


def test_warmup_style_alias_and_errors():
    assert _lrs(OptimizerConfig(lr=1.0, warmup_style="cosine", min_lr_ratio=0.0), 4, 3)[2] == pytest.approx(
        0.5
    )
    with pytest.raises(ValueError, match=r"trainer\.total_steps"):
        _lrs(OptimizerConfig(lr_scheduler_type="cosine"), None, 1)
    with pytest.raises(ValueError, match="lr_warmup_steps_ratio"):
        warmup_steps(OptimizerConfig(lr_warmup_steps_ratio=0.1), None)
    with pytest.raises(ValueError, match="lr_scheduler_type 'linear'"):
        _lrs(OptimizerConfig(lr_scheduler_type="linear"), 10, 1)
