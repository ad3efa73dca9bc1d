"""Streaming answers of the OpenAI API: the engine's stream opened with its first item,
incremental detokenizing (:class:`StreamText`), per-field deltas (:class:`Sent`) and the
server-sent events response (:func:`sse`)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from trinity.rollout.base import StreamItem
from trinity.serving.openai_api.replies import CLIENT_ERRORS, client_error
from trinity.serving.openai_api.schema import APIError, error_body

logger = logging.getLogger("trinity.serving.openai_api")  # one logger for the whole API (enable_log_requests)


async def open_stream(
    make: Callable[[], AsyncIterator[StreamItem]], what: str
) -> tuple[StreamItem, AsyncIterator[StreamItem]]:
    """The engine's stream and its first item: what fails before that (a bad template, an engine
    error) is answered with an error status, as without streaming."""
    try:
        stream = make()
        first = await stream.__anext__()
    except StopAsyncIteration:
        raise APIError(500, "the engine's stream ended without a result", type="server_error") from None
    except CLIENT_ERRORS as exc:
        raise client_error(exc) from None
    except Exception as exc:
        logger.exception("%s failed", what)
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error") from None
    return first, stream


async def items(first: StreamItem, rest: AsyncIterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """``first``, then the rest of the stream (closed by its owner, not here)."""
    yield first
    async for item in rest:
        yield item


class StreamText:
    """The text of one sample's tokens so far, decoded incrementally as vLLM's detokenizer does:
    each new piece is decoded with the few tokens before it (tokenizers that drop a word's leading
    space at the start of a decode get the context they need), and only once it does not end in
    an incomplete character (U+FFFD). With stop strings, the text is cut before the first one and
    the characters that may begin one are held back."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.decoded = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        """Add tokens; the text so far that the whole response's text is sure to start with."""
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        now = self._decode(self.ids[self.prefix_offset :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.decoded += now[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        text = self.decoded
        if self.stop:
            hits = [text.find(s) for s in self.stop if s in text]
            text = text[: min(hits)] if hits else text[: len(text) - self.hold]
        return text


class Sent:
    """What one choice's deltas carried so far, field by field."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def delta(self, values: dict[str, str], final: bool = False) -> dict[str, str]:
        """The new part of each field (``values`` must extend what was sent)."""
        out: dict[str, str] = {}
        for name, value in values.items():
            sent = self.fields.get(name, "")
            if len(value) <= len(sent):
                continue
            if not value.startswith(sent):  # cannot happen with prefix-safe parsers; never resend
                if final:
                    logger.warning("streamed %s diverged from the final reply; the rest is not sent", name)
                continue
            out[name] = value[len(sent) :]
            self.fields[name] = value
        return out


def sse(chunks: AsyncIterator[dict[str, Any]], stream: AsyncIterator[StreamItem]) -> StreamingResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``[DONE]``. An engine failure
    mid-stream is sent as an OpenAI error object (clients raise it). After the response, also
    when the client went away mid-stream, the chunks and the engine's ``stream`` are closed:
    closing an unfinished stream cancels the call."""

    async def close() -> None:
        await chunks.aclose()  # type: ignore[attr-defined]
        await stream.aclose()  # type: ignore[attr-defined]

    async def events() -> AsyncIterator[str]:
        try:
            async for item in chunks:
                yield f"data: {json.dumps(item)}\n\n"
        except Exception as exc:
            logger.exception("streamed completion failed")
            error = error_body(f"the engine failed: {type(exc).__name__}: {exc}", type="server_error")
            yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"

    # Runs after the response, also when a disconnect cancelled it mid-stream.
    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        background=BackgroundTask(chunks.aclose),  # type: ignore[attr-defined]
    )
