"""Reasoning parsers: split ``<think>...</think>`` off a reply (``reasoning_parser``).

The API returns the reasoning as ``message.reasoning_content`` (vLLM's and DeepSeek's field) and
the rest as ``content``; the recorded tokens keep both, exactly as generated.

- ``qwen3``: the model opens ``<think>`` itself (or the template does and the model closes it).
  Text before ``</think>`` is reasoning (a leading ``<think>`` dropped); without ``</think>``, a
  reply that starts with ``<think>`` was cut off while thinking (all reasoning), any other reply is
  plain content (thinking was off).
- ``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so a reply without
  ``</think>`` is all reasoning (cut off while thinking).
"""

from __future__ import annotations

from collections.abc import Callable

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _split(text: str, open_in_prompt: bool) -> tuple[str | None, str]:
    head = text.lstrip()
    opened = head.startswith(THINK_OPEN)
    if opened:
        head = head[len(THINK_OPEN) :]
    if THINK_CLOSE in head:
        reasoning, content = head.split(THINK_CLOSE, 1)
        return reasoning.strip(), content.lstrip()
    if opened or open_in_prompt:
        return head.strip(), ""
    return None, text


def parse_qwen3(text: str) -> tuple[str | None, str]:
    """``(reasoning or None, content)``."""
    return _split(text, open_in_prompt=False)


def parse_deepseek_r1(text: str) -> tuple[str | None, str]:
    """``(reasoning or None, content)``."""
    return _split(text, open_in_prompt=True)


REASONING_PARSERS: dict[str, Callable[[str], tuple[str | None, str]]] = {
    "deepseek_r1": parse_deepseek_r1,
    "qwen3": parse_qwen3,
}


def get_reasoning_parser(name: str) -> Callable[[str], tuple[str | None, str]]:
    """The parser called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning_parser {name!r}; this version has: {', '.join(sorted(REASONING_PARSERS))}"
        ) from None
