"""Reasoning parsers: split ``<think>...</think>`` off a reply (``reasoning_parser``).

The API returns the reasoning as ``message.reasoning_content`` (vLLM's and DeepSeek's field) and
the rest as ``content``; the recorded tokens keep both, exactly as generated.

- ``qwen3``: the model opens ``<think>`` itself (or the template does and the model closes it).
  Text before ``</think>`` is reasoning (a leading ``<think>`` dropped); without ``</think>``, a
  reply that starts with ``<think>`` was cut off while thinking (all reasoning), any other reply is
  plain content (thinking was off).
- ``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so a reply without
  ``</think>`` is all reasoning (cut off while thinking).

Streaming (:func:`get_reasoning_stream_prefix`): for the text of a reply so far, the part of its
``(reasoning, content)`` that no continuation can change, so a stream sends only what the whole
reply will parse to. ``deepseek_r1`` and a ``qwen3`` reply opening with ``<think>`` stream at
once; a ``qwen3`` reply that does not open with ``<think>`` is content unless a ``</think>``
still comes, so it is held back until ``</think>`` or the end.
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


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def _stream_prefix(text: str, open_in_prompt: bool) -> tuple[str, str]:
    """The prefixes of ``_split(text + more)``'s reasoning and content that hold for any ``more``."""
    head = text.lstrip()
    if len(head) < len(THINK_OPEN) and THINK_OPEN.startswith(head):
        return "", ""  # maybe "<think>" still coming
    opened = head.startswith(THINK_OPEN)
    if opened:
        head = head[len(THINK_OPEN) :]
    if THINK_CLOSE in head:
        reasoning, content = head.split(THINK_CLOSE, 1)
        return reasoning.strip(), content.lstrip()
    if opened or open_in_prompt:  # reasoning so far, bar what may be the start of "</think>"
        return head[: len(head) - _partial_suffix(head, THINK_CLOSE)].strip(), ""
    return "", ""


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


REASONING_STREAM_PREFIXES: dict[str, Callable[[str], tuple[str, str]]] = {
    "deepseek_r1": lambda text: _stream_prefix(text, open_in_prompt=True),
    "qwen3": lambda text: _stream_prefix(text, open_in_prompt=False),
}


def get_reasoning_stream_prefix(name: str) -> Callable[[str], tuple[str, str]]:
    """For parser ``name``: reply text so far -> ``(reasoning, content)`` prefixes that the whole
    reply's parse is sure to start with (see the module docstring)."""
    get_reasoning_parser(name)  # the same error for an unknown name
    return REASONING_STREAM_PREFIXES[name]


def get_reasoning_parser(name: str) -> Callable[[str], tuple[str | None, str]]:
    """The parser called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning_parser {name!r}; this version has: {', '.join(sorted(REASONING_PARSERS))}"
        ) from None
