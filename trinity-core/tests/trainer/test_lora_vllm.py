"""LoRA served by vLLM (``enable_lora``), without vLLM: the keys that start vLLM's LoRA support,
what the trainer sends to a vLLM rollout engine, and the PEFT adapter folder the engine writes
from it. ``trinity-core/tests/explorer/test_vllm_lora_real.py`` runs it on a real vLLM."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity.config import load_config
from trinity.config.no_effect import find_no_effect
from trinity.rollout.vllm_start import engine_kwargs
from trinity.testing.conformance import make_rollouts
from trinity.trainer.native import NativeTrainer

needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="LoRA needs the lora extra (peft)"
)

GRPO = {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 5e-2}}


def _config(config_factory, tiny_model_path, lora=None, sync_method="memory", engine="vllm", **model):
    loras = [{"name": "lora", "lora_rank": 4, "lora_alpha": 8, **(lora or {})}] if lora is not False else None
    return config_factory(
        GRPO,
        model={"model_path": tiny_model_path, "max_prompt_tokens": 16, "max_response_tokens": 16,
               "lora_configs": loras, **model},
        explorer={"rollout_model": {"engine_type": engine}},
        synchronizer={"sync_method": sync_method},
    )  # fmt: skip


def test_lora_starts_vllm_with_its_lora_arguments(config_factory, tiny_model_path):
    rm = _config(config_factory, tiny_model_path, max_cpu_loras=2).explorer.rollout_model
    assert rm.enable_lora
    # Rank 4 is below vLLM's smallest max_lora_rank (8); one adapter slot.
    assert rm.lora_kwargs == {"max_loras": 1, "max_lora_rank": 8, "max_cpu_loras": 2}
    kwargs = engine_kwargs(rm)
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8 and kwargs["max_cpu_loras"] == 2
    rank_16 = _config(config_factory, tiny_model_path, {"lora_rank": 16}, fully_sharded_loras=True)
    assert rank_16.explorer.rollout_model.lora_kwargs == {
        "max_loras": 1, "max_lora_rank": 16, "fully_sharded_loras": True}  # fmt: skip
    plain = _config(config_factory, tiny_model_path, lora=False).explorer.rollout_model
    assert not plain.enable_lora and "enable_lora" not in engine_kwargs(plain)


def test_lora_kwargs_given_by_the_user_win(config_factory, tiny_model_path):
    config = config_factory(
        GRPO,
        model={"model_path": tiny_model_path, "max_prompt_tokens": 16, "max_response_tokens": 16,
               "lora_configs": [{"lora_rank": 8}]},
        explorer={"rollout_model": {"engine_type": "vllm", "lora_kwargs": {"max_lora_rank": 64, "max_loras": 2}}},
    )  # fmt: skip
    assert config.explorer.rollout_model.lora_kwargs == {"max_loras": 2, "max_lora_rank": 64}


def _warned(tmp_path, yaml_text: str) -> list[str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml_text)
    return [key for key, _ in find_no_effect(load_config(path, resolve=False))]


def test_lora_serving_keys_warn_only_where_vllm_serves_no_adapter(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    served = "model: {model_path: /m, lora_configs: [{lora_rank: 8}], max_cpu_loras: 2, fully_sharded_loras: true}\n"
    assert _warned(tmp_path, served + "explorer: {rollout_model: {engine_type: vllm}}\n") == []
    assert _warned(tmp_path, served + "explorer: {rollout_model: {engine_type: transformers}}\n") == [
        "model.fully_sharded_loras", "model.max_cpu_loras"]  # fmt: skip
    no_lora = "model: {model_path: /m}\nexplorer: {rollout_model: {engine_type: vllm, enable_lora: true, lora_kwargs: {max_loras: 2}}}\n"
    assert _warned(tmp_path, no_lora) == [
        "explorer.rollout_model.enable_lora",
        "explorer.rollout_model.lora_kwargs",
    ]
    # enable_lora as model.lora_configs sets it (Trinity-RFT's derived value) says nothing.
    agrees = "model: {model_path: /m, lora_configs: [{lora_rank: 8}]}\nexplorer: {rollout_model: {engine_type: vllm, enable_lora: true}}\n"
    assert _warned(tmp_path, agrees) == []


@needs_peft
@pytest.mark.parametrize(
    ("sync_method", "adapter_only"), [("memory", True), ("checkpoint", True), ("nccl", False)]
)
def test_a_vllm_rollout_engine_gets_the_adapter_except_over_nccl(
    config_factory, tiny_model_path, sync_method, adapter_only
):
    config = _config(config_factory, tiny_model_path, sync_method=sync_method)
    if sync_method == "nccl":  # a train-only job syncs nccl through checkpoints: as mode both does
        config.synchronizer.sync_method = "nccl"
    trainer = NativeTrainer(config, device="cpu")
    assert trainer.sync_adapter_only == adapter_only
    assert (
        all(name.endswith((".lora_A.weight", ".lora_B.weight")) for name in trainer.state_dict())
        == adapter_only
    )


@needs_peft
def test_the_adapter_folder_written_for_vllm_is_the_trained_adapter(
    config_factory, tiny_model_path, tmp_path
):
    """What the vLLM engine loads (:func:`write_peft_adapter` over a sync's adapter halves, B
    pre-scaled) is a PEFT adapter that gives the trainer's log-probs over the base weights."""
    import peft

    from trinity.sync.lora_weights import write_peft_adapter

    trainer = NativeTrainer(_config(config_factory, tiny_model_path), device="cpu")
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    for _ in range(2):
        trainer.train_step(exps)
    assert write_peft_adapter(trainer.state_dict(), str(tmp_path)) == 4
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    served = peft.PeftModel.from_pretrained(base, str(tmp_path)).eval()
    tokens = torch.tensor([exps[0].tokens.tolist()])
    with torch.no_grad():
        expected = trainer.model(input_ids=tokens).logits
        got = served(input_ids=tokens).logits
        untrained = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)(
            input_ids=tokens
        ).logits
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the adapter changed the model
    assert torch.allclose(got, expected, atol=1e-5)


def test_an_adapter_with_half_a_module_or_two_ranks_is_refused(tmp_path):
    from trinity.sync.lora_weights import write_peft_adapter

    a, b = torch.zeros(4, 8), torch.zeros(8, 4)
    with pytest.raises(ValueError, match="only one of lora_A and lora_B"):
        write_peft_adapter({"m.q_proj.lora_A.weight": a}, str(tmp_path))
    with pytest.raises(ValueError, match="different ranks"):
        write_peft_adapter(
            {"m.q.lora_A.weight": a, "m.q.lora_B.weight": b,
             "m.k.lora_A.weight": torch.zeros(2, 8), "m.k.lora_B.weight": torch.zeros(8, 2)},
            str(tmp_path),
        )  # fmt: skip
