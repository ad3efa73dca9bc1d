"""What makes a taskset or dataset row usable: the checks the taskset reader, the SFT/DPO
readers and :meth:`trinity.workflow.Workflow.row_problem` share. A leaf module: it imports
nothing else of Trinity, so the workflow base class can use it without an import cycle."""

from __future__ import annotations

import reprlib
from typing import Any

_MAX_REASON_CHARS = 300
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 40
_ROLES = ("system", "user", "assistant", "tool", "function", "developer")


def type_name(value: Any) -> str:
    """The JSON-ish name of ``value``'s type for messages (``null`` for ``None``)."""
    return "null" if value is None else type(value).__name__


def short_repr(value: Any) -> str:
    """A bounded repr of a row value for messages; never raises (huge ints, odd objects)."""
    try:
        return _SHORT_REPR.repr(value)
    except Exception:  # e.g. int -> str over sys.get_int_max_str_digits()
        return f"<{type_name(value)}>"


def one_line(text: str, limit: int = _MAX_REASON_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters: reasons come from row data."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_messages(value: Any, key: str) -> str | None:
    """Why ``value`` is not a usable chat message list, or ``None`` when it is."""
    if not isinstance(value, list):
        return f"{key!r} must be a list of messages, got {type_name(value)}"
    if not value:
        return f"{key!r} is an empty message list"
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            return f"{key}[{i}] must be an object with role and content, got {type_name(msg)}"
        if msg.get("role") not in _ROLES:
            return f"{key}[{i}].role must be one of {', '.join(_ROLES)} (got {short_repr(msg.get('role'))})"
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return f"{key}[{i}].content must be a string, got {type_name(content)}"
    return None


def prompt_row_problem(row: dict[str, Any], fmt: Any) -> str | None:
    """Why a row cannot feed a prompt-based workflow, or ``None`` (the default of
    :meth:`trinity.workflow.Workflow.row_problem`)."""
    msg_key, prompt_key = fmt.messages_key, fmt.prompt_key
    # A row needs a prompt: a chat list under messages_key or a text under prompt_key. Which
    # one is not forced by prompt_type: Trinity-RFT tasksets commonly keep the default
    # prompt_type with a plaintext prompt_key, and workflows read the raw row themselves.
    if msg_key and row.get(msg_key) is not None:
        problem = check_messages(row[msg_key], msg_key)
        if problem:
            return problem
    elif prompt_key not in row:
        return f"missing prompt key {prompt_key!r} (row keys: {', '.join(sorted(map(str, row))) or 'none'})"
    else:
        prompt = row[prompt_key]
        if not isinstance(prompt, str):
            return f"prompt {prompt_key!r} must be a string, got {type_name(prompt)}"
        if not prompt.strip():
            return f"prompt {prompt_key!r} is empty"
    response = row.get(fmt.response_key)
    if response is not None and (
        isinstance(response, (dict, list)) or not isinstance(response, (str, int, float))
    ):
        return f"response {fmt.response_key!r} must be a string or number, got {type_name(response)}"
    system = row.get(fmt.system_prompt_key) if fmt.system_prompt_key else None
    if system is not None and not isinstance(system, str):
        return f"system prompt {fmt.system_prompt_key!r} must be a string, got {type_name(system)}"
    tools = row.get(fmt.tools_key) if fmt.tools_key else None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return f"tools {fmt.tools_key!r} must be a list of objects, got {type_name(tools)}"
    return None
