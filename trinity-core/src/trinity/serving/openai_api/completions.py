"""``POST /v1/completions`` (see :mod:`.server` for what it accepts and answers)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response

from trinity.rollout.base import StreamEnd, StreamItem
from trinity.serving.openai_api.replies import (
    CLIENT_ERRORS,
    Record,
    check_args,
    client_error,
    token_strings,
    usage,
)
from trinity.serving.openai_api.schema import APIError, CompletionRequest
from trinity.serving.openai_api.streaming import Sent, StreamText, items, open_stream, sse

if TYPE_CHECKING:
    from trinity.explorer.model_wrapper import ModelWrapper

logger = logging.getLogger("trinity.serving.openai_api")  # one logger for the whole API (enable_log_requests)


async def complete(model: ModelWrapper, body: CompletionRequest, record: Record) -> Response:
    args = body.rollout_args()
    check_args(model, args)
    if body.stream:
        first, stream = await open_stream(
            lambda: model._stream(body.prompts, whole_context=True, **args), "completion"
        )
        return sse(completion_stream(model, body, first, stream, record), stream)
    try:
        experiences = await model._sample_async(body.prompts, whole_context=True, **args)
    except CLIENT_ERRORS as exc:
        raise client_error(exc) from None
    except Exception as exc:
        logger.exception("completion failed")
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error") from None

    import torch

    tokenizer = model.tokenizer
    choices = []
    for i, exp in enumerate(experiences):  # prompt-major: choice i is sample i % n of prompt i // n
        choice: dict[str, Any] = {
            "index": i,
            "text": exp.response_text or "",
            "logprobs": None,
            "finish_reason": exp.info.get("finish_reason", "stop"),
        }
        if body.logprobs is not None and exp.logprobs is not None:
            ids = exp.tokens[exp.prompt_length :].tolist()
            choice["logprobs"], _ = completion_logprobs(tokenizer, ids, exp.logprobs.tolist(), 0)
        choices.append(choice)
        exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    record(experiences, completion_id)

    prompt_tokens = sum(e.prompt_length for e in experiences[:: body.n])
    completion = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": usage(experiences, prompt_tokens),
    }
    return JSONResponse(completion)


def completion_logprobs(
    tokenizer: Any, ids: list[int], logprobs: list[float], at: int
) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object of ``ids`` whose text starts at offset ``at``, and the next offset."""
    strings = token_strings(tokenizer, ids)
    offsets = []
    for s in strings:
        offsets.append(at)
        at += len(s)
    return {"tokens": strings, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}, at


async def completion_stream(
    model: ModelWrapper,
    body: CompletionRequest,
    first: StreamItem,
    stream: AsyncIterator[StreamItem],
    record: Record,
) -> AsyncIterator[dict[str, Any]]:
    import torch

    tokenizer = model.tokenizer
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model.name}  # fmt: skip
    stop = model.engine.sampling_args(**body.rollout_args()).stop
    count = len(body.prompts) * body.n  # choice i is sample i % n of prompt i // n
    texts = [StreamText(tokenizer, stop) for _ in range(count)]
    sent = [Sent() for _ in range(count)]
    offsets = [0] * count

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        }

    try:
        end: StreamEnd | None = None
        async for item in items(first, stream):
            if isinstance(item, StreamEnd):
                end = item
                break
            i = item.index
            delta = sent[i].delta({"text": texts[i].add(item.token_ids)}).get("text", "")
            logprobs = None
            if body.logprobs is not None:
                logprobs, offsets[i] = completion_logprobs(
                    tokenizer, item.token_ids, item.logprobs, offsets[i]
                )
            if delta or logprobs:
                yield chunk(i, delta, logprobs)
        if end is None:
            raise RuntimeError("the engine's stream ended without its Experiences")
        for exp in end.experiences:
            exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
        record(end.experiences, head["id"])
        for i, exp in enumerate(end.experiences):
            rest = sent[i].delta({"text": exp.response_text or ""}, final=True).get("text", "")
            yield chunk(i, rest, finish=exp.info.get("finish_reason", "stop"))
        if body.include_usage:
            prompt_tokens = sum(e.prompt_length for e in end.experiences[:: body.n])
            yield {**head, "choices": [], "usage": usage(end.experiences, prompt_tokens)}
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
