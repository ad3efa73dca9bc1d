"""A tiny, locally built causal LM and tokenizer for tests, examples and benchmarks.

Nothing is downloaded: the tokenizer is a character-level vocabulary built with the
``tokenizers`` library, and the model is a randomly initialised (seeded) Qwen2 or Llama
with a few thousand parameters. Both are saved in Hugging Face format, so every code path that
loads ``AutoTokenizer`` / ``AutoModelForCausalLM`` from a path works unchanged.

    path = create_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, IM_START, IM_END)

# Printable ASCII plus newline and tab (the chat template needs "\n").
DEFAULT_VOCAB_CHARS = "".join(chr(c) for c in range(32, 127)) + "\n\t"

# ChatML, as used by Qwen models. ``{% generation %}`` marks what the assistant produces
# (its content and the closing <|im_end|>, which is the token that ends a generation), so
# ``apply_chat_template(..., return_assistant_tokens_mask=True)`` can find those tokens.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- generation -%}{{ message['content'] }}{{ '<|im_end|>' }}{%- endgeneration -%}"
    "{{ '\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ``ByteLevel`` pre-tokenisation uses)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(vocab_chars: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one token per byte of ``vocab_chars`` (UTF-8).

    It is a byte-level BPE without merges, the same shape as Qwen's tokenizers, because
    transformers 5 loads every ``qwen2`` checkpoint with ``Qwen2Tokenizer`` (byte-level BPE)
    whatever the saved tokenizer class says; with this shape both loaders agree. Bytes outside
    the vocabulary are dropped when encoding. Special tokens (ids 0..3): ``<|pad|>``,
    ``<|endoftext|>`` (eos), ``<|im_start|>``, ``<|im_end|>``. The tokenizer carries a ChatML
    ``chat_template`` with ``{% generation %}`` markers.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = DEFAULT_VOCAB_CHARS if vocab_chars is None else vocab_chars
    if not chars:
        raise ValueError("vocab_chars is empty: the tokenizer needs at least one character")
    table = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for byte in chars.encode("utf-8"):
        vocab.setdefault(table[byte], len(vocab))

    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def create_tiny_model(
    path: str | Path,
    *,
    vocab_chars: str | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    architecture: str = "qwen2",
) -> Path:
    """Save a seeded, randomly initialised causal LM and its tokenizer at ``path``.

    The same arguments always give the same weights. ``architecture`` is ``"qwen2"`` or
    ``"llama"``. For vLLM (its CPU backend needs attention heads of at least 32 dimensions) use
    ``hidden_size=128, num_heads=4``. Generation stops on ``<|im_end|>`` or ``<|endoftext|>`` (both are in the
    saved ``generation_config.eos_token_id``). Returns ``path`` as a :class:`Path`.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    configs = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if architecture not in configs:
        raise ValueError(f"architecture must be one of {sorted(configs)}, got {architecture!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")

    tokenizer = build_tokenizer(vocab_chars)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id]
    config = configs[architecture](
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=eos_ids,
        # A wider init than the default 0.02 gives a peakier next-token distribution, so
        # samples are not pure noise and greedy decoding is stable under float round-off.
        initializer_range=0.2,
    )
    # fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# -- a tiny vision-language model ----------------------------------------------------------------

#: Qwen-VL's image placeholder tokens, added to the tiny tokenizer after the text ones.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# ChatML with Qwen-VL's image items: a message's content is a string or a list of
# {"type": "text", "text": ...} / {"type": "image", ...} items; each image is written as
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad to one token per
# merged patch). Assistant turns carry {% generation %} markers as in CHAT_TEMPLATE.
VLM_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for item in content -%}"
    "{%- if item['type'] == 'image' or item['type'] == 'image_url' -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- else -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- generation -%}{{ render(message['content']) }}{{ '<|im_end|>' }}{%- endgeneration -%}"
    "{{ '\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}{{ render(message['content']) }}{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def create_tiny_vlm(
    path: str | Path,
    *,
    vocab_chars: str | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    vision_dim: int = 32,
    min_pixels: int = 28 * 28 * 4,
    max_pixels: int = 28 * 28 * 16,
    seed: int = 0,
) -> Path:
    """Save a seeded, randomly initialised Qwen2-VL model, its tokenizer and image processor.

    Built like :func:`create_tiny_model` (character tokenizer, nothing downloaded), plus Qwen-VL's
    vision tokens, a one-layer vision tower of width ``vision_dim`` (14-pixel patches merged 2x2)
    and a ``Qwen2VLImageProcessor`` that resizes every image to between ``min_pixels`` and
    ``max_pixels`` pixels (the defaults give 1 to 4 image tokens per image). The folder loads with
    ``AutoModelForImageTextToText``, ``AutoTokenizer`` and ``AutoImageProcessor`` like a real
    Qwen2-VL checkpoint, and :class:`trinity.multimodal.MultiModalProcessor` reads it. The same
    arguments always give the same weights. Returns ``path`` as a :class:`Path`.
    """
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(f"hidden_size ({hidden_size}) / num_heads ({num_heads}) must be an even integer")
    tokenizer = build_tokenizer(vocab_chars)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END, *VISION_TOKENS]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in VISION_TOKENS}
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id]
    # M-RoPE splits each head's rotary half-dimension over (time, height, width).
    half = hidden_size // num_heads // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": max(1, num_heads // 2),
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
            "tie_word_embeddings": True,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
            "eos_token_id": eos_ids,
            "initializer_range": 0.2,  # as create_tiny_model: a peakier next-token distribution
        },
        vision_config={
            "depth": 1,
            "embed_dim": vision_dim,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out)
    return out
