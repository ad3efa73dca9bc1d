"""trinity.testing conformance checks over every registered component."""

from __future__ import annotations

import pytest

import trinity_algos.hooks as hooks
from trinity.testing import ListReader, check_component, make_experiences

COMPONENTS = [
    *[("advantage_fn", n, c) for n, c in hooks.ADVANTAGE_FNS.items()],
    *[("policy_loss_fn", n, c) for n, c in hooks.POLICY_LOSS_FNS.items()],
    *[("kl_fn", n, c) for n, c in hooks.KL_FNS.items()],
    *[("entropy_loss_fn", n, c) for n, c in hooks.ENTROPY_LOSS_FNS.items()],
    *[("sample_strategy", n, c) for n, c in hooks.SAMPLE_STRATEGIES.items()],
    *[("algorithm_type", n, c) for n, c in hooks.ALGORITHM_TYPES.items()],
    *[("selector", n, c) for n, c in hooks.SELECTORS.items()],
]


@pytest.mark.parametrize("kind,name,cls", COMPONENTS, ids=[f"{k}:{n}" for k, n, _ in COMPONENTS])
def test_conformance(algos_manager, kind, name, cls):
    kwargs = {}
    if kind == "sample_strategy" and name == "mix":
        kwargs["auxiliary_buffers"] = {"sft_dataset": ListReader(make_experiences(8, start=100))}
    check_component(kind, cls, **kwargs)
