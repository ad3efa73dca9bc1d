"""The OpenAI-compatible HTTP server in front of a :class:`ModelWrapper` (FastAPI + uvicorn).

Agent code that speaks OpenAI (``openai.OpenAI(base_url=...)``, LangChain, the OpenAI Agents
SDK...) runs inside a workflow against the rollout model. The server binds 127.0.0.1 (never
another interface unless asked: it has no authentication beyond the optional API key) on a free
port or the configured one, and runs uvicorn with its own event loop in a background thread.

Endpoints:

- ``POST /v1/chat/completions``: ``messages`` (text, or text parts), ``tools`` / ``tool_choice``
  (``none``, ``auto``, ``required``, a named function), ``n``, ``temperature``, ``top_p``,
  ``top_k``, ``min_tokens``, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``,
  ``logprobs``, ``stream`` (+ ``stream_options.include_usage``), ``chat_template_kwargs``.
  With the model's ``reasoning_parser`` the reply's ``<think>`` part comes back as
  ``message.reasoning_content``; with ``tools`` the model's ``tool_call_parser`` turns the reply
  into ``message.tool_calls`` (``finish_reason: "tool_calls"``).
- ``POST /v1/completions``: ``prompt`` (a string or a list of strings), the same sampling fields,
  ``logprobs: 0``, ``stream``.
- ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``.

Tool choice follows vLLM: ``auto`` (the default when ``tools`` are given) needs
``enable_auto_tool_choice`` and a ``tool_call_parser``; ``required`` and a named function need a
parser, and are parsed the same way: there is no constrained decoding, the model may answer
without a call. ``none`` renders no tools and parses none.

Every call is one sample per choice from :meth:`ModelWrapper` (seeded per task like
``ModelWrapper.chat``, see :meth:`ModelWrapper.seed_calls`), and with ``enable_history`` each
sample is recorded as an Experience: the prompt's token ids as templated (tools included), the
response's token ids exactly as sampled (tool-call markup, ``<think>``, the stop string and the
EOS token included), their logprobs, and an ``action_mask`` covering the whole response (every
response token is the assistant's). ``messages`` holds the conversation with the parsed reply;
``info`` holds ``tool_calls`` / ``tool_call_error`` (a malformed call) and ``tools``.

Streaming (``stream: true``): the reply streams as the engine samples it (the transformers engine
hands out every decoding step's tokens; engines that cannot stream, vLLM's here, give each sample
whole once it is finished, see ``RolloutEngine.streams_tokens``). Each choice starts with a
``{"role": "assistant"}`` chunk; then text deltas, decoded incrementally (only text whose
decoding is stable: a character split over several tokens comes once it is whole; with ``stop``
strings, text that may begin one is held back), with the chunk's tokens' ``logprobs`` when asked;
choices of ``n > 1`` are interleaved, each chunk naming its ``index``. Only what the whole reply
will parse to is sent: ``<think>`` text goes to ``reasoning_content`` deltas, and with tools the
text from a tool call's opening on is held back and sent, once the reply is complete, as
``tool_calls`` deltas (or as content when the call is malformed), as in a non-streaming answer.
The last chunk of a choice carries its ``finish_reason``; ``stream_options.include_usage`` adds a
usage chunk. Concatenated, the deltas are exactly the non-streaming message, and the Experience
is recorded exactly as without streaming, once the sample is complete. A client that closes the
stream early cancels the call (the engine stops sampling it) and nothing is recorded.

Who keeps the Experiences is the app's ``recorder`` (:func:`build_app`): by default the
wrapper's history (``ModelWrapper._record``); serve mode (:mod:`trinity.explorer.serve`) passes
its own, which also learns the response id the client saw and the request's headers
(:class:`CallContext`), and adds its feedback routes to the app.

Bad requests are answered with OpenAI's error object, ``{"error": {"message", "type", "param",
"code"}}``: 400 for invalid fields and unsupported options, 401 for a missing or wrong API key,
400 (``context_length_exceeded``, vLLM's message) for a prompt that leaves no room for a reply
within ``max_model_len`` or for a ``max_tokens`` past what it leaves (without ``max_tokens`` a
reply is capped there: only ``max_model_len`` limits the API's prompts), 404 for unknown routes
and for a ``model`` the server does not serve (:attr:`ModelWrapper.served_model_names`), 405,
and 500 (``server_error``) when the engine fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from trinity.explorer.engines.base import PromptTooLong, StreamEnd, StreamItem
from trinity.explorer.openai_api import vllm_parsers
from trinity.explorer.openai_api.reasoning import get_reasoning_parser, get_reasoning_stream_prefix
from trinity.explorer.openai_api.schema import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    bad_request,
    error_body,
    template_messages,
    validation_message,
)
from trinity.explorer.openai_api.tool_parsers import (
    ParsedReply,
    get_tool_call_parser,
    get_tool_call_stream_prefix,
)

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper

logger = logging.getLogger("trinity.explorer.openai_api")

ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models"
# Threads that wait on the engine for the requests in flight (an engine without native async
# generation runs each call in a thread; the transformers engine batches concurrent calls).
MAX_ENGINE_THREADS = 256

try:  # what a chat template raises (jinja2 comes with transformers)
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError  # type: ignore[assignment,misc]

_CLIENT_ERRORS = (ValueError, TypeError, _TemplateError)


@dataclass(frozen=True)
class CallContext:
    """What a recorder learns about one API call besides its Experiences.

    ``response_id`` is the ``id`` of the completion the client received (all choices of the
    call share it, as in OpenAI's answer); ``headers`` are the request's (lower-case names);
    ``extra`` holds the body fields this server does not interpret (``user``, ``metadata``...).
    """

    response_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)


#: ``recorder(experiences, context)``: keeps a call's Experiences once they are complete
#: (annotated, in choice order). It runs on the server's event loop: it must not block long.
Recorder = Callable[["list[Experience]", CallContext], None]


# -- the server ------------------------------------------------------------------------------


class OpenAIServer:
    """Serves ``model`` on ``http://<host>:<port>/v1`` (port 0: any free port).

    The port is bound when the server is made (an ``OSError`` when it is taken), so the URL is
    known before :meth:`start`. :meth:`start` returns once the server accepts requests.
    ``app``: an app made by :func:`build_app` (with a recorder or routes of its own) instead of
    the plain one.
    """

    def __init__(
        self, model: ModelWrapper, port: int = 0, host: str = "127.0.0.1", *, app: FastAPI | None = None
    ) -> None:
        self.model = model
        self.app = app if app is not None else build_app(model)
        # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that
        # say they are TCP, and with Nagle on every response waits ~40 ms for a delayed ACK.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
            self._socket.listen(128)
        except OSError:
            self._socket.close()
            raise
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self, timeout: float = 30.0) -> None:
        config = uvicorn.Config(
            self.app,
            log_config=None,  # leave the process's logging alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Longer than clients keep idle connections (httpx: 5 s), so the client always closes
            # first and never sends a request into a connection the server is closing.
            timeout_keep_alive=75,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="trinity-openai-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                why = repr(self._error) if self._error else f"not serving after {timeout} s"
                raise RuntimeError(f"the OpenAI API server did not start: {why}")
            time.sleep(0.005)

    def _serve(self) -> None:
        assert self._server is not None
        loop = asyncio.new_event_loop()
        pool = ThreadPoolExecutor(MAX_ENGINE_THREADS, thread_name_prefix="trinity-openai-engine")
        loop.set_default_executor(pool)  # asyncio.to_thread in the engines' async twins
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._socket]))
        except BaseException as exc:  # reported by start(); the thread just ends
            self._error = exc
        finally:
            pool.shutdown(wait=False)
            loop.close()

    def stop(self) -> None:
        """Stop serving (requests in flight get a few seconds) and free the port."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._socket.close()


# -- the app ---------------------------------------------------------------------------------


def _error_response(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def build_app(
    model: ModelWrapper,
    recorder: Recorder | None = None,
    admit: Callable[[Mapping[str, str], Mapping[str, Any]], None] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``model``; ``recorder`` keeps each call's Experiences (default:
    the wrapper's history); ``admit(headers, extra)`` runs before a call samples anything and
    may refuse it by raising :class:`APIError`. Routes added to the app later are named in its
    404 answers."""

    def record_for(request: Request, body: Any) -> Callable[[list[Experience], str], None]:
        """Admit the call (or raise), and how to record it once it is answered."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        extra = dict(body.model_extra or {})
        if admit is not None:
            admit(headers, extra)
        if recorder is None:
            return lambda experiences, response_id: model._record(experiences)
        return lambda experiences, response_id: recorder(
            experiences, CallContext(response_id, headers, extra)
        )

    async def authorize(request: Request) -> None:
        key = model.api_key
        if key and key != "EMPTY" and request.headers.get("authorization", "") != f"Bearer {key}":
            raise APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' with the api_key of "
                "explorer.rollout_model (or of the auxiliary model)",
                type="authentication_error",
                code="invalid_api_key",
            )

    app = FastAPI(
        title=f"Trinity rollout API ({model.name})",
        dependencies=[Depends(authorize)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc.status, exc.body())

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return _error_response(400, error_body(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            message = f"no route {request.method} {request.url.path}; this server offers {_routes(app)}"
            kind = "not_found" if exc.status_code == 404 else "method_not_allowed"
            return _error_response(exc.status_code, error_body(message, code=kind))
        return _error_response(exc.status_code, error_body(str(exc.detail)))

    if model.log_requests:

        @app.middleware("http")
        async def _log(request: Request, call_next: Callable[[Request], Any]) -> Response:
            start = time.perf_counter()
            response = await call_next(request)
            logger.info(
                "%s %s %s %d %.1f ms",
                model.name,
                request.method,
                request.url.path,
                response.status_code,
                (time.perf_counter() - start) * 1000,
            )
            return response

    def model_card() -> dict[str, Any]:
        return {"id": model.name, "object": "model", "created": 0, "owned_by": "trinity",
                "root": model.model_path or model.name}  # fmt: skip

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str) -> JSONResponse:
        _check_model(model, model_id)
        return JSONResponse(model_card())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        _check_model(model, body.model)
        return await _chat(model, body, record_for(request, body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_model(model, body.model)
        return await _complete(model, body, record_for(request, body))

    return app


def _check_model(model: ModelWrapper, model_id: str | None) -> None:
    """404 for a model id this server does not serve (OpenAI's and vLLM's answer); a request
    without ``model`` gets the served one, as from vLLM."""
    if model_id is not None and not model.serves(model_id):
        names = ", ".join(repr(n) for n in model.served_model_names)
        raise APIError(
            404,
            f"The model `{model_id}` does not exist; this server serves {names} (more names: "
            "model_aliases in the model's config)",
            param="model",
            code="model_not_found",
        )


def _client_error(exc: Exception) -> APIError:
    """The 400 for an error the request caused: a prompt past the context length in vLLM's
    words (``context_length_exceeded``, OpenAI's code), others with their type named."""
    if isinstance(exc, PromptTooLong):
        return APIError(400, str(exc), code="context_length_exceeded")
    return bad_request(f"{type(exc).__name__}: {exc}")


def _routes(app: FastAPI) -> str:
    """``POST /v1/chat/completions, ...``: the app's API routes (those under ``/v1``)."""
    from fastapi.routing import APIRoute

    found = [
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute) and route.path.startswith("/v1/") and "{" not in route.path
        for method in sorted(route.methods)
    ]
    return ", ".join(found) or ROUTES


# -- /v1/chat/completions --------------------------------------------------------------------


def _tool_plan(
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
    if _served_by_vllm(model):
        parser = vllm_parsers.tool_call_parser(model.tool_call_parser, model.engine.tokenizer, tools)
        if parser is not None:
            return tools, parser
    return tools, get_tool_call_parser(model.tool_call_parser)


def _served_by_vllm(model: ModelWrapper) -> bool:
    """Whether the model runs on the ``vllm`` engine: its replies are then parsed by vLLM's own
    parsers (:mod:`~trinity.explorer.openai_api.vllm_parsers`)."""
    from trinity.explorer.engines.vllm_engine import VLLMEngine  # imports no vLLM

    return isinstance(model.engine, VLLMEngine)


def _reasoning_parser(model: ModelWrapper) -> Callable[[str], tuple[str | None, str]] | None:
    if not model.reasoning_parser:
        return None
    if _served_by_vllm(model):
        parser = vllm_parsers.reasoning_parser(model.reasoning_parser, model.engine.tokenizer)
        if parser is not None:
            return parser
    return get_reasoning_parser(model.reasoning_parser)


def _check_args(model: ModelWrapper, args: dict[str, Any]) -> None:
    try:
        model.engine.sampling_args(**args)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from None


_Record = Callable[["list[Experience]", str], None]  # (experiences, response id)


async def _chat(model: ModelWrapper, body: ChatCompletionRequest, record: _Record) -> Response:
    tools, tool_parser = _tool_plan(model, body)
    reasoning_parser = _reasoning_parser(model)
    messages = template_messages(body.messages)
    args = body.rollout_args()
    _check_args(model, args)
    if body.stream:
        first, stream = await _open_stream(
            lambda: model._stream_chat(
                messages,
                tools=tools,
                chat_template_kwargs=body.chat_template_kwargs,
                whole_context=True,
                **args,
            ),
            "chat completion",
        )
        chunks = _chat_stream(
            model, body, first, stream, messages, tools, reasoning_parser, tool_parser, record
        )
        return _sse(chunks, stream)
    try:
        experiences = await model._sample_chat_async(
            messages, tools=tools, chat_template_kwargs=body.chat_template_kwargs, whole_context=True, **args
        )
    except _CLIENT_ERRORS as exc:
        raise _client_error(exc) from None
    except Exception as exc:
        logger.exception("chat completion failed")
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error") from None

    tokenizer = model.tokenizer
    choices = []
    for i, exp in enumerate(experiences):
        message, parsed = _assistant_message(exp.response_text or "", reasoning_parser, tool_parser)
        finish = "tool_calls" if parsed.tool_calls else exp.info.get("finish_reason", "stop")
        choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
        if body.logprobs:
            choice["logprobs"] = {"content": _chat_logprobs(tokenizer, exp)}
        choices.append(choice)
        _annotate(exp, messages, message, tools, parsed)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    record(experiences, completion_id)  # after annotating: the history never holds a half-made record

    completion = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": _usage(experiences, experiences[0].prompt_length if experiences else 0),
    }
    return JSONResponse(completion)


def _assistant_message(
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


def _token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    return tokenizer.batch_decode([[t] for t in ids])


def _chat_logprobs(tokenizer: Any, exp: Experience) -> list[dict[str, Any]]:
    if exp.logprobs is None:
        return []
    return _logprob_entries(tokenizer, exp.tokens[exp.prompt_length :].tolist(), exp.logprobs.tolist())


def _logprob_entries(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    return [
        {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
        for s, lp in zip(_token_strings(tokenizer, ids), logprobs)
    ]


def _annotate(
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


def _usage(experiences: list[Experience], prompt_tokens: int) -> dict[str, int]:
    completion_tokens = sum(e.response_length for e in experiences)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# -- streaming -------------------------------------------------------------------------------


async def _open_stream(
    make: Callable[[], AsyncIterator[StreamItem]], what: str
) -> tuple[StreamItem, AsyncIterator[StreamItem]]:
    """The engine's stream and its first item: what fails before that (a bad template, an engine
    error) is answered with an error status, as without streaming."""
    try:
        stream = make()
        first = await stream.__anext__()
    except StopAsyncIteration:
        raise APIError(500, "the engine's stream ended without a result", type="server_error") from None
    except _CLIENT_ERRORS as exc:
        raise _client_error(exc) from None
    except Exception as exc:
        logger.exception("%s failed", what)
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error") from None
    return first, stream


async def _items(first: StreamItem, rest: AsyncIterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """``first``, then the rest of the stream (closed by its owner, not here)."""
    yield first
    async for item in rest:
        yield item


class _StreamText:
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


class _Sent:
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


async def _chat_stream(
    model: ModelWrapper,
    body: ChatCompletionRequest,
    first: StreamItem,
    stream: AsyncIterator[StreamItem],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reasoning_parser: Callable[[str], tuple[str | None, str]] | None,
    tool_parser: Callable[[str], ParsedReply] | None,
    record: _Record,
) -> AsyncIterator[dict[str, Any]]:
    tokenizer = model.tokenizer
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model.name}  # fmt: skip
    reasoning_prefix = get_reasoning_stream_prefix(model.reasoning_parser) if reasoning_parser else None
    tool_prefix = get_tool_call_stream_prefix(model.tool_call_parser) if tool_parser else None  # type: ignore[arg-type]
    if _served_by_vllm(model):
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

    texts = [_StreamText(tokenizer, stop) for _ in range(body.n)]
    sent = [_Sent() for _ in range(body.n)]

    def safe_fields(text: str) -> dict[str, str]:
        reasoning, content = reasoning_prefix(text) if reasoning_prefix else ("", text)
        return {"reasoning_content": reasoning, "content": tool_prefix(content) if tool_prefix else content}

    try:
        for i in range(body.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        end: StreamEnd | None = None
        async for item in _items(first, stream):
            if isinstance(item, StreamEnd):
                end = item
                break
            delta = sent[item.index].delta(safe_fields(texts[item.index].add(item.token_ids)))
            logprobs = None
            if body.logprobs:
                logprobs = {"content": _logprob_entries(tokenizer, item.token_ids, item.logprobs)}
            if delta or logprobs:
                yield chunk(item.index, delta, logprobs)
        if end is None:
            raise RuntimeError("the engine's stream ended without its Experiences")

        finals = []
        for exp in end.experiences:
            message, parsed = _assistant_message(exp.response_text or "", reasoning_parser, tool_parser)
            finish = "tool_calls" if parsed.tool_calls else exp.info.get("finish_reason", "stop")
            finals.append((message, finish))
            _annotate(exp, messages, message, tools, parsed)
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
            usage = _usage(end.experiences, end.experiences[0].prompt_length if end.experiences else 0)
            yield {**head, "choices": [], "usage": usage}
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def _sse(chunks: AsyncIterator[dict[str, Any]], stream: AsyncIterator[StreamItem]) -> StreamingResponse:
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


# -- /v1/completions -------------------------------------------------------------------------


async def _complete(model: ModelWrapper, body: CompletionRequest, record: _Record) -> Response:
    args = body.rollout_args()
    _check_args(model, args)
    if body.stream:
        first, stream = await _open_stream(
            lambda: model._stream(body.prompts, whole_context=True, **args), "completion"
        )
        return _sse(_completion_stream(model, body, first, stream, record), stream)
    try:
        experiences = await model._sample_async(body.prompts, whole_context=True, **args)
    except _CLIENT_ERRORS as exc:
        raise _client_error(exc) from None
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
            choice["logprobs"], _ = _completion_logprobs(tokenizer, ids, exp.logprobs.tolist(), 0)
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
        "usage": _usage(experiences, prompt_tokens),
    }
    return JSONResponse(completion)


def _completion_logprobs(
    tokenizer: Any, ids: list[int], logprobs: list[float], at: int
) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object of ``ids`` whose text starts at offset ``at``, and the next offset."""
    strings = _token_strings(tokenizer, ids)
    offsets = []
    for s in strings:
        offsets.append(at)
        at += len(s)
    return {"tokens": strings, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}, at


async def _completion_stream(
    model: ModelWrapper,
    body: CompletionRequest,
    first: StreamItem,
    stream: AsyncIterator[StreamItem],
    record: _Record,
) -> AsyncIterator[dict[str, Any]]:
    import torch

    tokenizer = model.tokenizer
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model.name}  # fmt: skip
    stop = model.engine.sampling_args(**body.rollout_args()).stop
    count = len(body.prompts) * body.n  # choice i is sample i % n of prompt i // n
    texts = [_StreamText(tokenizer, stop) for _ in range(count)]
    sent = [_Sent() for _ in range(count)]
    offsets = [0] * count

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        }

    try:
        end: StreamEnd | None = None
        async for item in _items(first, stream):
            if isinstance(item, StreamEnd):
                end = item
                break
            i = item.index
            delta = sent[i].delta({"text": texts[i].add(item.token_ids)}).get("text", "")
            logprobs = None
            if body.logprobs is not None:
                logprobs, offsets[i] = _completion_logprobs(
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
            yield {**head, "choices": [], "usage": _usage(end.experiences, prompt_tokens)}
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
