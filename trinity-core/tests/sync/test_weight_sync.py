"""Packing the trainer's weights for ``sync_method: memory`` (the transports themselves:
test_transport.py; the broadcast of ``nccl``: test_broadcast.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.sync.memory import pack_weights


@pytest.fixture
def models(tiny_model):
    return str(tiny_model(hidden_size=32, seed=0)), str(tiny_model(hidden_size=32, seed=1))


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


def test_weights_travel_as_numpy_arrays_and_come_back_equal():
    """``to_wire`` / ``from_wire``: every dtype (those numpy lacks as same-size integers), tied
    tensors sent once and tied again, through pickle protocol 5 (Ray's serializer)."""
    import pickle

    import numpy as np

    from trinity.sync.memory import from_wire, to_wire

    embed = torch.randn(5, 3)
    state = {
        "embed.weight": embed,
        "lm_head.weight": embed,
        "half": torch.randn(4, 2).to(torch.bfloat16),
        "fp16": torch.randn(3).half(),
        "steps": torch.arange(3),
        "flags": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
    }
    if hasattr(torch, "float8_e4m3fn"):
        state["fp8"] = torch.randn(6).to(torch.float8_e4m3fn)
    wire = to_wire(state)
    assert all(isinstance(array, np.ndarray) for array, _ in wire.values())
    assert wire["embed.weight"][0] is wire["lm_head.weight"][0]
    out_of_band: list = []
    data = pickle.dumps(wire, protocol=5, buffer_callback=out_of_band.append)
    # The arrays' memory travels beside the pickle (what Ray puts in its object store), once.
    assert len(out_of_band) == len(state) - 1
    received = pickle.loads(data, buffers=out_of_band)
    back = from_wire(received)
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), (
            name
        )
    assert back["embed.weight"] is back["lm_head.weight"]
