"""The transformers engine's lean decoding step against transformers' own forward."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.rollout.lean_decoding import LeanDecoder, LogitsDiffer, NotCovered
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer.batch import position_ids_from_mask

ENGINE_LOG = "trinity.rollout.transformers_generate"


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("lean_llama") / "model", seed=1, architecture="llama")


def _load(path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


@torch.inference_mode()
def _both_ways(model, decoder, steps=6, room=1):
    """Logits of ``steps`` one-token steps over a left-padded batch, from transformers' forward
    and from ``decoder`` (rows dropped on the way, the state grown from ``room`` columns)."""
    generator = torch.Generator().manual_seed(0)
    lengths = [7, 5, 3, 1, 6]
    width = max(lengths)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True)
    cache = out.past_key_values
    state = decoder.start(cache, mask, room=room)
    positions = mask.sum(-1, keepdim=True)
    pairs = []
    for step in range(steps):
        tokens = torch.randint(0, vocab, (mask.shape[0],), generator=generator)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        reference = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        pairs.append((decoder.step(state, tokens, positions).float(), reference.float()))
        if step in (1, 3):  # drop a row (the second time the first one: order kept)
            keep = torch.arange(mask.shape[0])[torch.arange(mask.shape[0]) != (2 if step == 1 else 0)]
            cache.batch_select_indices(keep)
            state.select(keep)
            mask, positions = mask[keep], positions[keep]
        positions = positions + 1
    return pairs, state


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_lean_step_gives_transformers_logits(tiny_model_path, llama_path, arch):
    model = _load(tiny_model_path if arch == "qwen2" else llama_path)
    decoder = LeanDecoder.for_model(model)
    pairs, state = _both_ways(model, decoder)
    assert state.keys[0].shape[0] == 3  # two rows dropped
    assert state.keys[0].shape[2] > 7 + 1  # grew past its first room
    for lean, reference in pairs:
        torch.testing.assert_close(lean, reference, atol=1e-4, rtol=0)
        assert torch.equal(lean.argmax(-1), reference.argmax(-1))


def test_lean_step_in_bfloat16_stays_close(tiny_model_path):
    model = _load(tiny_model_path, torch.bfloat16)
    decoder = LeanDecoder.for_model(model)
    pairs, _ = _both_ways(model, decoder, steps=3)
    for lean, reference in pairs:
        assert float((lean - reference).abs().max()) <= 5e-2 * max(1.0, float(reference.abs().max()))


def test_weights_written_in_place_reach_the_lean_step(tiny_model_path, llama_path):
    model = _load(tiny_model_path)
    decoder = LeanDecoder.for_model(model)
    # The fused products are the model's own weights (slices of one tensor), not copies.
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.q_proj.weight.data_ptr() == decoder.layers[1].qkv_weight.data_ptr()
    assert attn.v_proj.bias.data_ptr() == decoder.layers[1].qkv_bias[-attn.v_proj.bias.shape[0] :].data_ptr()
    assert (
        mlp.up_proj.weight.data_ptr()
        == decoder.layers[1].gate_up_weight[mlp.gate_proj.weight.shape[0] :].data_ptr()
    )
    other = _load(create_tiny_model(llama_path.parent.parent / "other_qwen2", seed=5))
    with torch.no_grad():  # as the engine's weight sync: copies into the model's tensors
        for target, value in zip(model.parameters(), other.parameters(), strict=True):
            target.copy_(value)
    for lean, reference in _both_ways(model, decoder, steps=2)[0]:
        torch.testing.assert_close(lean, reference, atol=1e-4, rtol=0)
    with torch.no_grad():  # a tensor replaced outright is seen too
        layer = model.model.layers[0].mlp.up_proj
        layer.weight = torch.nn.Parameter(layer.weight * 0.5)
    for lean, reference in _both_ways(model, decoder, steps=2)[0]:
        torch.testing.assert_close(lean, reference, atol=1e-4, rtol=0)


def test_models_it_does_not_cover_are_refused_with_the_reason(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(NotCovered, match="GPT2LMHeadModel is not one of LlamaForCausalLM, Qwen2ForCausalLM"):
        LeanDecoder.for_model(gpt2)

    def tiny_qwen2(**changes):
        sizes = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2}
        return Qwen2ForCausalLM(Qwen2Config(num_attention_heads=2, num_key_value_heads=1, **sizes, **changes))

    sliding = tiny_qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(NotCovered, match="sliding-window"):
        LeanDecoder.for_model(sliding)
    gelu = tiny_qwen2(hidden_act="gelu")
    with pytest.raises(NotCovered, match="activation 'gelu'"):
        LeanDecoder.for_model(gelu)


def test_an_engine_whose_check_fails_decodes_with_transformers(tiny_model_path, monkeypatch, caplog):
    from trinity.rollout.transformers_engine import TransformersEngine

    real_step = LeanDecoder.step

    def off(self, state, tokens, positions):
        return real_step(self, state, tokens, positions) + 1.0  # as a model it gets wrong would

    monkeypatch.setattr(LeanDecoder, "step", off)
    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)
    assert engine.lean is None
    assert "decoding with transformers' forward: the lean decoding step's logits differ" in caplog.text
    with pytest.raises(LogitsDiffer, match=r"accepted 0\.0001 of that"):
        LeanDecoder.for_model(engine.model)
    monkeypatch.undo()
    plain = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0, lean_decoding=False)
    args = {"n": 3, "max_tokens": 10, "temperature": 1.0, "seed": 2}
    assert [e.tokens.tolist() for e in engine.generate(["hello"], **args)] == [
        e.tokens.tolist() for e in plain.generate(["hello"], **args)
    ]


def test_engine_decodes_with_the_lean_step_and_drops_finished_rows(tiny_model_path, monkeypatch):
    from trinity.rollout.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)
    assert engine.lean is not None
    rows: list[int] = []
    forwards: list[int] = []
    real_step = LeanDecoder.step

    def counted(self, state, tokens, positions):
        rows.append(tokens.shape[0])
        return real_step(self, state, tokens, positions)

    monkeypatch.setattr(LeanDecoder, "step", counted)
    engine.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    exps = engine.generate(["hello there"], n=8, max_tokens=30, temperature=1.0, seed=2)
    lengths = sorted(e.response_length for e in exps)
    assert lengths[0] < lengths[-1]
    # The prompt's prefill is the model's only forward; the lean step runs the last prompt
    # column for the 8 rows, then one step per token with the unfinished rows.
    assert len(forwards) == 1
    assert rows == [8] + [sum(length > step for length in lengths) for step in range(1, lengths[-1])]


def test_enforce_eager_turns_the_lean_step_off(tiny_model_path):
    from trinity.config import InferenceModelConfig
    from trinity.rollout import create_engines

    default = create_engines(
        InferenceModelConfig(model_path=str(tiny_model_path), engine_type="transformers", dtype="float32")
    )
    eager = create_engines(
        InferenceModelConfig(
            model_path=str(tiny_model_path), engine_type="transformers", dtype="float32", enforce_eager=True
        )
    )
    assert default[0].lean is not None and eager[0].lean is None


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sample"])
def test_one_sample_calls_run_their_prompt_then_lean_steps(tiny_model_path, temperature):
    """``n: 1`` (no shared prefill): transformers runs the whole prompt, the lean step the rest;
    the same tokens and log-probs as without the lean step."""
    from trinity.rollout.transformers_engine import TransformersEngine

    lean = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)
    plain = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0, lean_decoding=False)
    prompts = ["x", "hello there", "12+34="]
    args = {"n": 1, "max_tokens": 16, "temperature": temperature, "seed": 9}
    a, b = lean.generate(prompts, **args), plain.generate(prompts, **args)
    assert [e.tokens.tolist() for e in a] == [e.tokens.tolist() for e in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)
