"""The tiny local model: deterministic, loadable with the Auto classes, usable chat template."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity.testing.tiny_model import IM_END, build_tokenizer, create_tiny_model


@pytest.fixture(scope="module")
def tiny_path(tiny_model):
    return tiny_model(seed=0)


def test_tokenizer_is_character_level_and_round_trips():
    tok = build_tokenizer()
    text = "Hello, world!\n\t~ 12+3"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>"
    assert tok.convert_tokens_to_ids(["<|im_start|>", IM_END]) == [2, 3]


def test_custom_vocab_drops_unknown_characters():
    tok = build_tokenizer("ab")
    assert len(tok) == 4 + 2
    assert tok.decode(tok("abcab")["input_ids"]) == "abab"
    with pytest.raises(ValueError, match="empty"):
        build_tokenizer("")


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_saved_model_loads_with_auto_classes(tmp_path, architecture):
    path = create_tiny_model(tmp_path / architecture, architecture=architecture)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == architecture
    text = "2 + 2 = 4\n"
    # transformers 5 loads qwen2 checkpoints with Qwen2Tokenizer: it must agree with ours.
    assert tok(text)["input_ids"] == build_tokenizer()(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text
    logits = model(torch.tensor([tok(text)["input_ids"]])).logits
    assert logits.shape == (1, len(text), len(tok))
    assert set(model.generation_config.eos_token_id) == {tok.eos_token_id, tok.convert_tokens_to_ids(IM_END)}


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, tiny_path):
    again = create_tiny_model(tmp_path / "again", seed=0)
    other = create_tiny_model(tmp_path / "other", seed=1)
    a, b, c = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (tiny_path, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_creating_a_model_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    create_tiny_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_chat_template_marks_exactly_the_assistant_tokens(tiny_path):
    tok = AutoTokenizer.from_pretrained(tiny_path)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == f"yo{IM_END}4{IM_END}"
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\nbe brief<|im_end|>\n")


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="architecture"):
        create_tiny_model(tmp_path / "x", architecture="gpt2")
    with pytest.raises(ValueError, match="divisible"):
        create_tiny_model(tmp_path / "y", hidden_size=10, num_heads=4)
