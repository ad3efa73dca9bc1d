"""vLLM's own tool-call and reasoning parsers, for models served by the ``vllm`` engine.

With ``engine_type: vllm`` the OpenAI API parses a finished reply with vLLM's parser of the
configured name (``vllm serve --tool-call-parser hermes --reasoning-parser qwen3`` would give the
same ``tool_calls`` and ``reasoning_content``), so a workflow trained here meets the parsing it
will meet when the model is served by vLLM. Every name this API accepts (``hermes``,
``llama3_json``; ``qwen3``, ``deepseek_r1``) is one of vLLM's. What a stream sends as content
before a tool call or after the reasoning is still decided by this package's prefix rules
(``tool_parsers`` / ``reasoning``); the final message is vLLM's parse.

Where vLLM cannot be imported, lacks the name, or its parser refuses the model's tokenizer (vLLM's
``llama3_json`` and ``deepseek_r1`` look up their special tokens in it), the callers keep this
package's parsers; the last case is logged once.

vLLM's parsers differ from this package's in places: vLLM's ``qwen3`` reads a reply without
``</think>`` as all reasoning (the Qwen3 template opens ``<think>`` in the prompt), this package's
as all content; vLLM's ``hermes`` keeps the whitespace before a call in ``content``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from trinity.serving.openai_api.tool_parsers import ParsedReply, ToolCall

logger = logging.getLogger(__name__)
_WARNED: set[str] = set()


def _usable(kind: str, name: str, parser_cls: Any, tokenizer: Any) -> bool:
    """Whether vLLM's parser accepts ``tokenizer`` (built once to find out); warns once if not."""
    try:
        parser_cls(tokenizer)
    except Exception as exc:
        if name not in _WARNED:
            _WARNED.add(name)
            logger.warning(
                "vLLM's %s parser %r refuses this model's tokenizer (%s); using Trinity's %r instead",
                kind,
                name,
                " ".join(str(exc).split())[:200],
                name,
            )
        return False
    return True


def _vllm_request(tools: list[dict[str, Any]] | None) -> Any:
    """A minimal vLLM ``ChatCompletionRequest`` (the parsers' signature asks for one; the tools
    are what some of them read)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="trinity", messages=[{"role": "user", "content": ""}], tools=tools or None
    )


def tool_call_parser(
    name: str, tokenizer: Any, tools: list[dict[str, Any]] | None
) -> Callable[[str], ParsedReply] | None:
    """vLLM's tool-call parser ``name`` as ``text -> ParsedReply``; ``None`` without vLLM or the name."""
    try:
        from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
    except ImportError:
        return None
    if name not in ToolParserManager.list_registered():
        return None
    parser_cls = ToolParserManager.get_tool_parser(name)
    if not _usable("tool-call", name, parser_cls, tokenizer):
        return None
    request = _vllm_request(tools)

    def parse(text: str) -> ParsedReply:
        # One parser per reply: vLLM's parsers keep state between calls (for streaming).
        info = parser_cls(tokenizer).extract_tool_calls(text, request)
        if not info.tools_called:
            return ParsedReply(info.content if info.content is not None else text)
        calls = []
        for call in info.tool_calls:
            arguments = call.function.arguments
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(ToolCall(name=call.function.name, arguments=arguments, id=call.id))
        return ParsedReply(info.content or None, calls)

    return parse


def reasoning_parser(name: str, tokenizer: Any) -> Callable[[str], tuple[str | None, str]] | None:
    """vLLM's reasoning parser ``name`` as ``text -> (reasoning, content)``; ``None`` without
    vLLM or the name."""
    try:
        from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
    except ImportError:
        return None
    if name not in ReasoningParserManager.list_registered():
        return None
    parser_cls = ReasoningParserManager.get_reasoning_parser(name)
    if not _usable("reasoning", name, parser_cls, tokenizer):
        return None
    request = _vllm_request(None)

    def parse(text: str) -> tuple[str | None, str]:
        reasoning, content = parser_cls(tokenizer).extract_reasoning(text, request)
        return reasoning, content or ""

    return parse


__all__ = ["reasoning_parser", "tool_call_parser"]
