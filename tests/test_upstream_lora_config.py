"""Upstream's ``examples/grpo_lora_gsm8k/gsm8k.yaml`` (stored unchanged under ``upstream_configs/``):
it loads with its adapter, and its tiny CPU form (the native trainer on the tiny model) trains
the adapter alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trinity.config import load_config

UPSTREAM = Path(__file__).parent / "upstream_configs" / "grpo_lora_gsm8k" / "gsm8k.yaml"


def test_the_lora_example_loads_unchanged(upstream_env):
    config = load_config(UPSTREAM)
    (lora,) = config.model.lora_configs
    assert (lora.name, lora.lora_rank, lora.lora_alpha, lora.target_modules) == ("lora", 32, 32, "all-linear")
    assert config.explorer.rollout_model.enable_lora
    assert config.synchronizer.sync_method == "checkpoint"


def test_its_tiny_cpu_form_trains_only_the_adapter(upstream_env, tiny_model):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    from transformers import AutoTokenizer

    from trinity.testing.conformance import make_rollouts
    from trinity.trainer.native import NativeTrainer

    model = str(tiny_model(hidden_size=32, num_layers=2))
    overrides = {
        "model.model_path": model,
        "model.max_response_tokens": 8,
        "model.max_model_len": 32,
        "trainer.trainer_type": "native",
        "trainer.max_token_len_per_gpu": 512,
        "algorithm.repeat_times": 2,
        "buffer.batch_size": 2,
    }
    config = load_config(UPSTREAM, overrides)
    trainer = NativeTrainer(config, device="cpu")
    tok = AutoTokenizer.from_pretrained(model)
    exps = make_rollouts(tok, answers=(("4", 1.0), ("5", 0.0)))
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    metrics = trainer.train_step(exps)
    assert metrics["lora/trainable_params"] > 0 and metrics["lora/sync_bytes"] > 0
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if n in frozen)
