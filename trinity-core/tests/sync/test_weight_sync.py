"""Weight-sync building blocks: packing, the memory path, reloading checkpoints (``nccl``: test_nccl.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.sync.checkpoint import sync_from_checkpoint, wait_for_weights
from trinity.sync.memory import apply_weights, pack_weights
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer import checkpoint as ckpt


class _Engine:
    """A stand-in rollout engine with the explorer engine's sync methods."""

    def __init__(self, path):
        self.model = AutoModelForCausalLM.from_pretrained(path)
        self.version = 0

    def update_weights(self, state_dict, version):
        self.model.load_state_dict(state_dict)
        self.version = version

    def load_checkpoint(self, path, version):
        self.update_weights(AutoModelForCausalLM.from_pretrained(path).state_dict(), version)


@pytest.fixture
def models(tmp_path):
    return str(create_tiny_model(tmp_path / "a", hidden_size=32, seed=0)), str(
        create_tiny_model(tmp_path / "b", hidden_size=32, seed=1)
    )


def test_pack_and_apply_weights(models):
    trained = AutoModelForCausalLM.from_pretrained(models[1])
    packed = pack_weights(trained)
    assert all(t.device.type == "cpu" and not t.requires_grad for t in packed.values())
    with torch.no_grad():
        next(trained.parameters()).add_(1.0)  # the packed copy does not follow later updates
    engine = _Engine(models[0])
    apply_weights(engine, packed, version=4)
    assert engine.version == 4
    expected = AutoModelForCausalLM.from_pretrained(models[1]).state_dict()
    for name, tensor in engine.model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_sync_from_latest_checkpoint(models, tmp_path):
    job = tmp_path / "job"
    engine = _Engine(models[0])
    assert sync_from_checkpoint(engine, job, current_version=0) is None
    ckpt.save_checkpoint(job, 2, model=AutoModelForCausalLM.from_pretrained(models[1]), state={})
    assert sync_from_checkpoint(engine, job, current_version=0) == 2
    assert engine.version == 2
    assert sync_from_checkpoint(engine, job, current_version=2) is None
    assert wait_for_weights(job, 2, timeout=1)[0] == 2
    with pytest.raises(TimeoutError, match="sync_timeout"):
        wait_for_weights(job, 3, timeout=0.2, poll_interval=0.05)


@pytest.mark.e2e
@pytest.mark.slow
def test_memory_sync_through_ray_object_store(models):
    ray = pytest.importorskip("ray")
    from trinity.sync.memory import publish_weights

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote_engine = ray.remote(_Engine).remote(models[0])
        ref = publish_weights(pack_weights(AutoModelForCausalLM.from_pretrained(models[1])))
        ray.get(apply_weights(remote_engine, ref, version=7))
        assert ray.get(remote_engine.__ray_call__.remote(lambda self: self.version)) == 7
        local = _Engine(models[0])
        apply_weights(local, ref, version=8)  # a local engine gets the object resolved for it
        expected = AutoModelForCausalLM.from_pretrained(models[1]).state_dict()
        for name, tensor in local.model.state_dict().items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    finally:
        if started:
            ray.shutdown()
