"""``POST /v1/chat/completions`` (see :mod:`.server` for what it accepts and answers)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response

from trinity.rollout.base import StreamEnd, StreamItem
from trinity.serving.openai_api.reasoning import get_reasoning_stream_prefix
from trinity.serving.openai_api.replies import (
    CLIENT_ERRORS,
    Record,
    annotate,
    assistant_message,
    chat_logprobs,
    check_args,
    client_error,
    logprob_entries,
    reasoning_parser_of,
    served_by_vllm,
    tool_plan,
    usage,
)
from trinity.serving.openai_api.schema import APIError, ChatCompletionRequest, template_messages
from trinity.serving.openai_api.streaming import Sent, StreamText, items, open_stream, sse
from trinity.serving.openai_api.tool_parsers import ParsedReply, get_tool_call_stream_prefix

if TYPE_CHECKING:
    from trinity.explorer.model_wrapper import ModelWrapper

logger = logging.getLogger("trinity.serving.openai_api")  # one logger for the whole API (enable_log_requests)


async def chat(model: ModelWrapper, body: ChatCompletionRequest, record: Record) -> Response:
    tools, tool_parser = tool_plan(model, body)
    reasoning_parser = reasoning_parser_of(model)
    messages = template_messages(body.messages)
    args = body.rollout_args()
    check_args(model, args)
    if body.stream:
        first, stream = await open_stream(
            lambda: model._stream_chat(
                messages,
                tools=tools,
                chat_template_kwargs=body.chat_template_kwargs,
                whole_context=True,
                **args,
            ),
            "chat completion",
        )
        chunks = chat_stream(
            model, body, first, stream, messages, tools, reasoning_parser, tool_parser, record
        )
        return sse(chunks, stream)
    try:
        experiences = await model._sample_chat_async(
            messages, tools=tools, chat_template_kwargs=body.chat_template_kwargs, whole_context=True, **args
        )
    except CLIENT_ERRORS as exc:
        raise client_error(exc) from None
    except Exception as exc:
        logger.exception("chat completion failed")
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error") from None

    tokenizer = model.tokenizer
    choices = []
    for i, exp in enumerate(experiences):
        message, parsed = assistant_message(exp.response_text or "", reasoning_parser, tool_parser)
        finish = "tool_calls" if parsed.tool_calls else exp.info.get("finish_reason", "stop")
        choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
        if body.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(tokenizer, exp)}
        choices.append(choice)
        annotate(exp, messages, message, tools, parsed)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    record(experiences, completion_id)  # after annotating: the history never holds a half-made record

    completion = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": usage(experiences, experiences[0].prompt_length if experiences else 0),
    }
    return JSONResponse(completion)


async def chat_stream(
    model: ModelWrapper,
    body: ChatCompletionRequest,
    first: StreamItem,
    stream: AsyncIterator[StreamItem],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reasoning_parser: Callable[[str], tuple[str | None, str]] | None,
    tool_parser: Callable[[str], ParsedReply] | None,
    record: Record,
) -> AsyncIterator[dict[str, Any]]:
    tokenizer = model.tokenizer
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model.name}  # fmt: skip
    reasoning_prefix = get_reasoning_stream_prefix(model.reasoning_parser) if reasoning_parser else None
    tool_prefix = get_tool_call_stream_prefix(model.tool_call_parser) if tool_parser else None  # type: ignore[arg-type]
    if served_by_vllm(model):
        # vLLM's parsers make the final message, and this package's prefix rules could split the
        # reply otherwise (vLLM's qwen3: no </think> = all reasoning). The vllm engine gives each
        # sample whole at its end anyway, so nothing is held back by sending it all at the end.
        reasoning_prefix = (lambda text: ("", "")) if reasoning_parser else None
        tool_prefix = (lambda text: "") if tool_parser else None
    stop = model.engine.sampling_args(**body.rollout_args()).stop

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        return {
            **head,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    texts = [StreamText(tokenizer, stop) for _ in range(body.n)]
    sent = [Sent() for _ in range(body.n)]

    def safe_fields(text: str) -> dict[str, str]:
        reasoning, content = reasoning_prefix(text) if reasoning_prefix else ("", text)
        return {"reasoning_content": reasoning, "content": tool_prefix(content) if tool_prefix else content}

    try:
        for i in range(body.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        end: StreamEnd | None = None
        async for item in items(first, stream):
            if isinstance(item, StreamEnd):
                end = item
                break
            delta = sent[item.index].delta(safe_fields(texts[item.index].add(item.token_ids)))
            logprobs = None
            if body.logprobs:
                logprobs = {"content": logprob_entries(tokenizer, item.token_ids, item.logprobs)}
            if delta or logprobs:
                yield chunk(item.index, delta, logprobs)
        if end is None:
            raise RuntimeError("the engine's stream ended without its Experiences")

        finals = []
        for exp in end.experiences:
            message, parsed = assistant_message(exp.response_text or "", reasoning_parser, tool_parser)
            finish = "tool_calls" if parsed.tool_calls else exp.info.get("finish_reason", "stop")
            finals.append((message, finish))
            annotate(exp, messages, message, tools, parsed)
        record(end.experiences, head["id"])  # complete: recorded as a call that does not stream

        for i, (message, finish) in enumerate(finals):
            rest = sent[i].delta(
                {
                    "reasoning_content": message.get("reasoning_content") or "",
                    "content": message["content"] or "",
                },
                final=True,
            )
            if rest:
                yield chunk(i, rest)
            for k, call in enumerate(message.get("tool_calls", ())):
                yield chunk(i, {"tool_calls": [{"index": k, **call}]})
            yield chunk(i, {}, finish=finish)
        if body.include_usage:
            counts = usage(end.experiences, end.experiences[0].prompt_length if end.experiences else 0)
            yield {**head, "choices": [], "usage": counts}
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
