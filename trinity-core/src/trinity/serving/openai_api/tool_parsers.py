"""Tool-call parsers: the text a model generated -> OpenAI ``tool_calls`` (``tool_call_parser``).

A parser sees the reply text (after any reasoning was split off) and returns a
:class:`ParsedReply`: the remaining ``content`` and the :class:`ToolCall` list. Parsing is
all-or-nothing: when the text looks like tool calls but one of them is malformed (not JSON, no
``name``, arguments that are not an object), no call is returned, ``content`` is the whole text
(what the model wrote reaches the agent unchanged) and ``error`` says what was wrong, so a reward
function can tell a malformed call from a plain answer. The recorded tokens never change: parsing
only shapes the API's answer.

Parsers (names as in vLLM's ``--tool-call-parser``):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, any number,
  anywhere in the reply (Hermes, Qwen 2.5 / Qwen 3 chat templates). A final block may lack its
  closing tag (generation stopped at EOS right after the JSON). Text outside the blocks is the
  content.
- ``llama3_json``: the whole reply is one or more JSON objects ``{"name": ..., "parameters": {...}}``
  (separated by ``;`` or whitespace), optionally after ``<|python_tag|>`` (Llama 3.1+ JSON tool
  calling). A reply not starting with ``{`` is plain content.

Streaming (:func:`get_tool_call_stream_prefix`): for the reply text so far, the prefix of the
parsed ``content`` that no continuation can change. Since parsing is all-or-nothing (a later
malformed call turns everything back into content), a stream holds the text back from the first
call's opening on and sends the calls (or that text) once the reply is complete.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One parsed call; ``arguments`` is JSON text, as in the OpenAI API."""

    name: str
    arguments: str
    id: str = field(default_factory=_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ParsedReply:
    """``content`` (``None`` when only tool calls remain), the calls, and why text that looked
    like tool calls was not parsed (``error``; then ``tool_calls`` is empty)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


def _call_from_object(obj: Any, argument_keys: tuple[str, ...]) -> ToolCall:
    """A :class:`ToolCall` from a decoded JSON value, or ``ValueError`` saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object with 'name' and arguments, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("the object has no 'name' string")
    args: Any = {}
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # already JSON text (the OpenAI form): passed on as written
        return ToolCall(name, args)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {name!r} are a {type(args).__name__}, not an object")
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _json_call(text: str, argument_keys: tuple[str, ...]) -> ToolCall:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    return _call_from_object(obj, argument_keys)


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def parse_hermes(text: str) -> ParsedReply:
    """``<tool_call>`` JSON blocks (see the module docstring)."""
    if HERMES_OPEN not in text:
        return ParsedReply(text)
    calls: list[ToolCall] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(HERMES_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, body_start)
        body = text[body_start:] if end < 0 else text[body_start:end]
        try:
            calls.append(_json_call(body.strip(), ("arguments", "parameters")))
        except ValueError as exc:
            return ParsedReply(text, [], f"tool call {len(calls) + 1}: {exc}")
        if end < 0:
            break
        pos = end + len(HERMES_CLOSE)
    content = "".join(outside).strip()
    return ParsedReply(content or None, calls)


PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str) -> ParsedReply:
    """One or more JSON call objects making up the whole reply (see the module docstring)."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):
        return ParsedReply(text)
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
            calls.append(_call_from_object(obj, ("parameters", "arguments")))
        except json.JSONDecodeError as exc:
            return ParsedReply(text, [], f"tool call {len(calls) + 1}: not valid JSON ({exc.msg})")
        except ValueError as exc:
            return ParsedReply(text, [], f"tool call {len(calls) + 1}: {exc}")
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
    return ParsedReply(None, calls)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def hermes_stream_prefix(text: str) -> str:
    """The content a reply starting with ``text`` has whatever follows (see the module
    docstring): the text before the first ``<tool_call>`` (or what may start one), without
    trailing whitespace (dropped when calls follow); nothing when it starts with whitespace
    (kept without calls, dropped with them)."""
    if not text or text[0].isspace():
        return ""
    cut = text.find(HERMES_OPEN)
    if cut < 0:
        cut = len(text) - _partial_suffix(text, HERMES_OPEN)
    return text[:cut].rstrip()


def llama3_json_stream_prefix(text: str) -> str:
    """All of ``text`` once it is sure to be plain content (it does not open with ``{`` or the
    python tag); nothing before."""
    body = text.lstrip()
    if not body or body.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(body):
        return ""
    return text


TOOL_CALL_STREAM_PREFIXES: dict[str, Callable[[str], str]] = {
    "hermes": hermes_stream_prefix,
    "llama3_json": llama3_json_stream_prefix,
}


def get_tool_call_stream_prefix(name: str) -> Callable[[str], str]:
    """For parser ``name``: reply text so far -> the prefix of the parsed content it is sure of."""
    get_tool_call_parser(name)
    return TOOL_CALL_STREAM_PREFIXES[name]


TOOL_CALL_PARSERS: dict[str, Callable[[str], ParsedReply]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
}


def get_tool_call_parser(name: str) -> Callable[[str], ParsedReply]:
    """The parser called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return TOOL_CALL_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool_call_parser {name!r}; this version has: {', '.join(sorted(TOOL_CALL_PARSERS))}"
        ) from None
