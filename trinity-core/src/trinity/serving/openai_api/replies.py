"""Pieces of the OpenAI API's answers shared by its routes (:mod:`.chat`, :mod:`.completions`):
the tools and parsers a request gets, the assistant message of a reply, logprob entries, usage,
what the history keeps of a chat reply, and which engine errors are the client's (400)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trinity.rollout.base import PromptTooLong
from trinity.serving.openai_api import vllm_parsers
from trinity.serving.openai_api.reasoning import get_reasoning_parser
from trinity.serving.openai_api.schema import APIError, ChatCompletionRequest, NamedToolChoice, bad_request
from trinity.serving.openai_api.tool_parsers import ParsedReply, get_tool_call_parser

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper

try:  # what a chat template raises (jinja2 comes with transformers)
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError  # type: ignore[assignment,misc]

CLIENT_ERRORS = (ValueError, TypeError, _TemplateError)


def client_error(exc: Exception) -> APIError:
    """The 400 for an error the request caused: a prompt past the context length in vLLM's
    words (``context_length_exceeded``, OpenAI's code), others with their type named."""
    if isinstance(exc, PromptTooLong):
        return APIError(400, str(exc), code="context_length_exceeded")
    return bad_request(f"{type(exc).__name__}: {exc}")


#: ``record(experiences, response_id)``: keeps one answered call (see ``build_app``).
Record = Callable[["list[Experience]", str], None]


def tool_plan(
    model: ModelWrapper, body: ChatCompletionRequest
) -> tuple[list[dict[str, Any]] | None, Callable[[str], ParsedReply] | None]:
    """``(tools for the chat template, tool-call parser)`` for a request (``None``: none)."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice is only allowed when tools are given", param="tool_choice")
        return None, None
    if choice == "none":
        return None, None
    names = [t.function.name for t in body.tools]
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request(
            f"tool_choice names function {choice.function.name!r}, which is not among the tools {names}",
            param="tool_choice",
        )
    where = "in this model's config (explorer.rollout_model or its auxiliary_models entry)"
    if choice in (None, "auto") and not (model.enable_auto_tool_choice and model.tool_call_parser):
        raise bad_request(
            f'"auto" tool choice needs enable_auto_tool_choice: true and a tool_call_parser (e.g. hermes) {where}',
            param="tool_choice",
        )
    if not model.tool_call_parser:
        raise bad_request(f"tool calls need a tool_call_parser (e.g. hermes) {where}", param="tool_choice")
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    if served_by_vllm(model):
        parser = vllm_parsers.tool_call_parser(model.tool_call_parser, model.engine.tokenizer, tools)
        if parser is not None:
            return tools, parser
    return tools, get_tool_call_parser(model.tool_call_parser)


def served_by_vllm(model: ModelWrapper) -> bool:
    """Whether the model runs on the ``vllm`` engine: its replies are then parsed by vLLM's own
    parsers (:mod:`~trinity.serving.openai_api.vllm_parsers`)."""
    from trinity.rollout.vllm_engine import VLLMEngine  # imports no vLLM

    return isinstance(model.engine, VLLMEngine)


def reasoning_parser_of(model: ModelWrapper) -> Callable[[str], tuple[str | None, str]] | None:
    if not model.reasoning_parser:
        return None
    if served_by_vllm(model):
        parser = vllm_parsers.reasoning_parser(model.reasoning_parser, model.engine.tokenizer)
        if parser is not None:
            return parser
    return get_reasoning_parser(model.reasoning_parser)


def check_args(model: ModelWrapper, args: dict[str, Any]) -> None:
    try:
        model.engine.sampling_args(**args)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from None


def assistant_message(
    text: str,
    reasoning_parser: Callable[[str], tuple[str | None, str]] | None,
    tool_parser: Callable[[str], ParsedReply] | None,
) -> tuple[dict[str, Any], ParsedReply]:
    reasoning, content = reasoning_parser(text) if reasoning_parser else (None, text)
    parsed = tool_parser(content) if tool_parser else ParsedReply(content)
    message: dict[str, Any] = {"role": "assistant"}
    # Only tool calls and no text: null content, as OpenAI answers; otherwise always a string.
    message["content"] = parsed.content if parsed.tool_calls else (parsed.content or "")
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
    return message, parsed


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    return tokenizer.batch_decode([[t] for t in ids])


def chat_logprobs(tokenizer: Any, exp: Experience) -> list[dict[str, Any]]:
    if exp.logprobs is None:
        return []
    return logprob_entries(tokenizer, exp.tokens[exp.prompt_length :].tolist(), exp.logprobs.tolist())


def logprob_entries(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    return [
        {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
        for s, lp in zip(token_strings(tokenizer, ids), logprobs)
    ]


def annotate(
    exp: Experience,
    messages: list[dict[str, Any]],
    message: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    parsed: ParsedReply,
) -> None:
    """What the history keeps besides the tokens: the whole response is the assistant's."""
    import torch

    exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
    reply = dict(message)
    if parsed.tool_calls:  # as the chat template takes them back (arguments as objects)
        reply["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": _maybe_json(c["function"]["arguments"])}}
            for c in message["tool_calls"]
        ]
    reply["content"] = reply.get("content") or ""
    exp.messages = [dict(m) for m in messages] + [reply]
    if tools:
        exp.info["tools"] = tools
    if parsed.tool_calls:
        exp.info["tool_calls"] = message["tool_calls"]
    if parsed.error:
        exp.info["tool_call_error"] = parsed.error


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def usage(experiences: list[Experience], prompt_tokens: int) -> dict[str, int]:
    completion_tokens = sum(e.response_length for e in experiences)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
