"""LoRA in the native trainer (``model.lora_configs``) on the tiny model, without Ray: only the
adapter trains, the reference is the base model, checkpoints resume, the merged export and the
weight sync carry base + adapter, and the transformers engine then scores as the trainer does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity.testing.conformance import make_rollouts
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.batch import build_batch, to_device
from trinity.trainer.convert import convert_checkpoint
from trinity.trainer.forward import forward_logprobs
from trinity.trainer.lora import merged_weights
from trinity.trainer.native import NativeTrainer

needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="LoRA needs the lora extra (peft)"
)

GRPO = {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 5e-2}}
LORA = {"name": "lora", "lora_rank": 4, "lora_alpha": 8}


def _logprobs(model, trainer, exps):
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        return forward_logprobs(model, batch)[0] * batch["action_mask"]


def _lora_config(config_factory, tiny_model_path, *loras, **sections):
    model = {"model_path": tiny_model_path, "max_prompt_tokens": 16, "max_response_tokens": 16}
    explorer = {"rollout_model": {"engine_type": "transformers"}}
    return config_factory(GRPO, model={**model, "lora_configs": list(loras)}, explorer=explorer, **sections)


def _lora_trainer(config_factory, tiny_model_path, sections=None, **keys):
    # On the CPU in float32, as the engines of these tests, so log-probs compare at 1e-4.
    config = _lora_config(config_factory, tiny_model_path, {**LORA, **keys}, **(sections or {}))
    return NativeTrainer(config, device="cpu")


@pytest.fixture
def lora_trainer(config_factory, tiny_model_path):
    return _lora_trainer(config_factory, tiny_model_path)


@needs_peft
def test_only_the_adapter_trains_and_the_reference_is_the_base(lora_trainer, tiny_model_path):
    trainer = lora_trainer
    assert trainer.ref_model is None  # no second copy of the model
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapter and all(".lora_" in n for n in adapter)
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    for _ in range(2):
        metrics = trainer.train_step(exps)
    assert metrics["lora/trainable_params"] == sum(p.numel() for p in adapter.values())
    for name, param in trainer.model.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name
    changed = [
        n for n, p in trainer.model.named_parameters() if n in adapter and not torch.equal(p, adapter[n])
    ]
    assert changed, "the adapter did not train"
    # The adapter now changes the policy, and the reference still equals the base model.
    batch, groups = trainer.prepare(exps)
    ref = trainer.ref_logprobs(batch, groups)
    expected = _logprobs(base, trainer, exps)
    assert torch.allclose(ref * batch["action_mask"], expected, atol=1e-5)
    assert not torch.allclose(_logprobs(trainer.model, trainer, exps), expected, atol=1e-3)
    assert metrics["actor/kl_loss"] > 0  # GRPO's KL against the base now sees the adapter


@needs_peft
def test_checkpoint_holds_the_adapter_and_a_merged_export_and_resumes(config_factory, tiny_model_path):
    trainer = _lora_trainer(config_factory, tiny_model_path)
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    trainer.train_step(exps)
    path = trainer.save_checkpoint()
    adapter_files = {p.name for p in (Path(path) / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= adapter_files
    assert ckpt.hf_weights_dir(path).name == "huggingface"
    # The merged export is base + adapter: Hugging Face loading gives the trainer's log-probs.
    export = AutoModelForCausalLM.from_pretrained(ckpt.hf_weights_dir(path), dtype=torch.float32)
    assert torch.allclose(
        _logprobs(export, trainer, exps), _logprobs(trainer.model, trainer, exps), atol=1e-5
    )
    merged = merged_weights(trainer.model, only_adapted=False)
    own = export.state_dict()
    assert set(merged) == set(own)
    assert all(torch.allclose(own[n], merged[n], atol=1e-6) for n in own)
    # Resume: a fresh trainer continues exactly as the one that saved.
    after_save = trainer.train_step(exps)
    resumed = _lora_trainer(config_factory, tiny_model_path)
    resumed.load_checkpoint(path)
    assert resumed.global_step == 1
    again = resumed.train_step(exps)
    assert again["actor/pg_loss"] == pytest.approx(after_save["actor/pg_loss"], rel=1e-5, abs=1e-7)
    for (n, a), (_, b) in zip(trainer.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), n


@needs_peft
def test_trinity_convert_copies_the_merged_export(config_factory, tiny_model_path, tmp_path):
    trainer = _lora_trainer(config_factory, tiny_model_path)
    trainer.train_step(make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path)))
    path = trainer.save_checkpoint()
    out = tmp_path / "converted"
    convert_checkpoint(path, out)  # what `trinity convert` runs
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    merged = merged_weights(trainer.model, only_adapted=False)
    assert all(torch.allclose(converted[n], merged[n], atol=1e-6) for n in converted)


def _engine_matches_trainer(engine, trainer, tokens) -> bool:
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    return torch.allclose(engine.logprobs(tokens), expected, atol=1e-4)


@needs_peft
@pytest.mark.parametrize("adapter_only", [True, False], ids=["adapter", "merged"])
def test_weight_sync_sends_what_the_adapter_changes_and_the_engine_then_matches(
    config_factory, tiny_model_path, adapter_only
):
    from trinity.rollout.transformers_engine import TransformersEngine

    trainer = _lora_trainer(config_factory, tiny_model_path)
    assert trainer.sync_adapter_only  # the rollout engine of these configs is transformers
    trainer.sync_adapter_only = adapter_only  # what a vLLM rollout engine gets: merged
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    adapted = {n.rsplit(".", 1)[0] for n in merged_weights(trainer.model)}
    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu")
    try:
        tokens = exps[0].tokens.tolist()
        for version in (1, 2):  # a second sync folds the new adapter into the base, not the last merge
            for _ in range(2):
                metrics = trainer.train_step(exps)
            state = trainer.state_dict()
            assert metrics["lora/sync_bytes"] == sum(t.numel() * t.element_size() for t in state.values())
            if adapter_only:
                assert set(state) == {f"{m}.lora_{h}.weight" for m in adapted for h in "AB"}
            else:  # only the adapted modules, merged, under the base names
                assert set(state) == {f"{m}.weight" for m in adapted} and set(state) < set(base)
            assert not _engine_matches_trainer(engine, trainer, tokens)
            engine.update_weights(state, version=version)
            assert _engine_matches_trainer(engine, trainer, tokens)
    finally:
        engine.shutdown()
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())
    assert (metrics["lora/sync_bytes"] < 0.2 * full_bytes) == adapter_only


@needs_peft
def test_an_engine_resumed_from_a_merged_checkpoint_takes_adapter_syncs(config_factory, tiny_model_path):
    from trinity.rollout.transformers_engine import TransformersEngine

    trainer = _lora_trainer(config_factory, tiny_model_path)
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    trainer.train_step(exps)
    path = trainer.save_checkpoint()
    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu")
    try:
        engine.load_checkpoint(ckpt.hf_weights_dir(path), version=1)  # the merged export
        tokens = exps[0].tokens.tolist()
        assert _engine_matches_trainer(engine, trainer, tokens)
        trainer.train_step(exps)
        engine.update_weights(trainer.state_dict(), version=2)
        assert _engine_matches_trainer(engine, trainer, tokens)
    finally:
        engine.shutdown()


@needs_peft
def test_target_and_exclude_modules_select_the_adapted_modules(config_factory, tiny_model_path):
    trainer = _lora_trainer(
        config_factory, tiny_model_path, target_modules="q_proj,v_proj", exclude_modules=r".*layers\.0\..*"
    )
    adapted = {n.rsplit(".", 1)[0] for n in merged_weights(trainer.model)}
    assert adapted and all(n.endswith(("q_proj", "v_proj")) and ".layers.0." not in n for n in adapted)


@needs_peft
def test_more_than_one_adapter_is_refused_in_one_line(config_factory, tiny_model_path):
    config = _lora_config(config_factory, tiny_model_path, {"name": "a"}, {"name": "b"})
    with pytest.raises(ValueError, match="trains one") as info:
        NativeTrainer(config)
    assert "\n" not in str(info.value)


def test_without_peft_lora_is_refused_in_one_line(config_factory, tiny_model_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if the lora extra were not installed
    with pytest.raises(ImportError, match=r"pip install 'trinity-core\[lora\]'") as info:
        _lora_trainer(config_factory, tiny_model_path)
    assert "\n" not in str(info.value)


@needs_peft
def test_a_broadcast_sync_carries_the_adapter_to_the_engine(config_factory, tiny_model_path):
    """``sync_method: nccl`` (gloo on CPU): the adapter halves arrive with the broadcast."""
    from concurrent.futures import ThreadPoolExecutor

    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.sync.broadcast import WeightSender

    trainer = _lora_trainer(config_factory, tiny_model_path)
    exps = make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    trainer.train_step(exps)
    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu")
    sender = WeightSender(2, "gloo", 20)
    try:
        with ThreadPoolExecutor(2) as pool:
            joined = pool.submit(engine.init_weight_group, sender.spec, 1)
            sender.connect()
            joined.result()
            metas = sender.prepare(trainer.state_dict(), 3)
            received = pool.submit(engine.receive_weights, metas, 3)
            sender.send()
            received.result()
        assert engine.model_version == 3
        assert _engine_matches_trainer(engine, trainer, exps[0].tokens.tolist())
    finally:
        engine.close_weight_group()
        sender.close()
        engine.shutdown()


@needs_peft
def test_gradient_checkpointing_trains_the_adapter(config_factory, tiny_model_path):
    trainer = _lora_trainer(config_factory, tiny_model_path, {"trainer": {"gradient_checkpointing": True}})
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train_step(make_rollouts(AutoTokenizer.from_pretrained(tiny_model_path)))
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if n in before)
