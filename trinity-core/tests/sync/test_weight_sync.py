"""Packing the trainer's weights for ``sync_method: memory`` (the transports themselves:
test_transport.py; the broadcast of ``nccl``: test_broadcast.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.sync.memory import pack_weights
from trinity.testing.tiny_model import create_tiny_model


@pytest.fixture
def models(tmp_path):
    return str(create_tiny_model(tmp_path / "a", hidden_size=32, seed=0)), str(
        create_tiny_model(tmp_path / "b", hidden_size=32, seed=1)
    )


def test_pack_weights_snapshots_cpu_copies_that_load(models):
    trained = AutoModelForCausalLM.from_pretrained(models[1])
    packed = pack_weights(trained)
    assert all(t.device.type == "cpu" and not t.requires_grad for t in packed.values())
    with torch.no_grad():
        next(trained.parameters()).add_(1.0)  # the packed copy does not follow later updates
    engine = AutoModelForCausalLM.from_pretrained(models[0])
    engine.load_state_dict(packed)
    expected = AutoModelForCausalLM.from_pretrained(models[1]).state_dict()
    for name, tensor in engine.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    with pytest.raises(TypeError, match="needs a torch module or a state dict"):
        pack_weights([1, 2])
