"""A tiny math model: :func:`trinity.testing.tiny_model.create_tiny_model` with a math vocabulary.

The character vocabulary covers everything the math tasks put in front of the model or ask of
it: digits, operators, the ``<think>``/``<answer>`` tags, the countdown prompt, the workflows'
system prompts and the chat template's role names. Characters outside the vocabulary would be
dropped silently by the tokenizer, so the tests check this coverage.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

#: Every character the math tasks and prompts use (see the module docstring).
MATH_VOCAB_CHARS = string.digits + "+-*/=()<>[]{}.,:;?!'\"#$%\\^_ \n" + string.ascii_letters


def create_math_model(path: str | Path, seed: int = 0, **model_args: Any) -> Path:
    """Save a seeded, randomly initialised tiny causal LM and its math tokenizer at ``path``.

    ``model_args`` go to ``create_tiny_model`` (``hidden_size``, ``num_layers``,
    ``num_heads``, ``architecture``). The same arguments always give the same weights.
    Returns ``path`` as a :class:`Path`, loadable with ``AutoModelForCausalLM`` /
    ``AutoTokenizer`` like any model path.
    """
    from trinity.testing.tiny_model import create_tiny_model

    return create_tiny_model(path, vocab_chars=MATH_VOCAB_CHARS, seed=seed, **model_args)
