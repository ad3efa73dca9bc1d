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

Streaming: the engines return whole samples, so a stream carries each choice in a few chunks once
it is sampled (role and reasoning, content, one chunk per tool call, finish) rather than token by
token; clients assemble it as any OpenAI stream.

Bad requests are answered with OpenAI's error object, ``{"error": {"message", "type", "param",
"code"}}``: 400 for invalid fields and unsupported options, 401 for a missing or wrong API key,
404 / 405 for unknown routes, 500 (``server_error``) when the engine fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trinity.explorer.openai_api.reasoning import get_reasoning_parser
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
from trinity.explorer.openai_api.tool_parsers import ParsedReply, get_tool_call_parser

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


# -- the server ------------------------------------------------------------------------------


class OpenAIServer:
    """Serves ``model`` on ``http://<host>:<port>/v1`` (port 0: any free port).

    The port is bound when the server is made (an ``OSError`` when it is taken), so the URL is
    known before :meth:`start`. :meth:`start` returns once the server accepts requests.
    """

    def __init__(self, model: ModelWrapper, port: int = 0, host: str = "127.0.0.1") -> None:
        self.model = model
        self.app = build_app(model)
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


def build_app(model: ModelWrapper) -> FastAPI:
    """The FastAPI app serving ``model``."""

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
            message = f"no route {request.method} {request.url.path}; this server offers {ROUTES}"
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
        if model_id != model.name:
            raise APIError(404, f"no model {model_id!r}; this server serves {model.name!r}",
                           param="model", code="model_not_found")  # fmt: skip
        return JSONResponse(model_card())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        return await _chat(model, body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        return await _complete(model, body)

    return app


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
    return tools, get_tool_call_parser(model.tool_call_parser)


def _check_args(model: ModelWrapper, args: dict[str, Any]) -> None:
    try:
        model.engine.sampling_args(**args)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from None


async def _chat(model: ModelWrapper, body: ChatCompletionRequest) -> Response:
    tools, tool_parser = _tool_plan(model, body)
    reasoning_parser = get_reasoning_parser(model.reasoning_parser) if model.reasoning_parser else None
    messages = template_messages(body.messages)
    args = body.rollout_args()
    _check_args(model, args)
    try:
        experiences = await model._sample_chat_async(
            messages, tools=tools, chat_template_kwargs=body.chat_template_kwargs, **args
        )
    except _CLIENT_ERRORS as exc:
        raise bad_request(f"{type(exc).__name__}: {exc}") from None
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
    model._record(experiences)  # after annotating: the history never holds a half-made record

    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": _usage(experiences, experiences[0].prompt_length if experiences else 0),
    }
    if body.stream:
        return _sse(_chat_chunks(completion, body.include_usage))
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
    ids = exp.tokens[exp.prompt_length :].tolist()
    return [
        {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
        for s, lp in zip(_token_strings(tokenizer, ids), exp.logprobs.tolist())
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


def _chat_chunks(completion: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        return {
            **head,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    for choice in completion["choices"]:
        i, message = choice["index"], choice["message"]
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if "reasoning_content" in message:
            first["reasoning_content"] = message["reasoning_content"]
        yield chunk(i, first, choice["logprobs"])
        if message.get("content"):
            yield chunk(i, {"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls", ())):
            yield chunk(i, {"tool_calls": [{"index": k, **call}]})
        yield chunk(i, {}, finish=choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": completion["usage"]}


def _sse(chunks: Iterator[dict[str, Any]]) -> StreamingResponse:
    def events() -> Iterator[str]:
        for item in chunks:
            yield f"data: {json.dumps(item)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


# -- /v1/completions -------------------------------------------------------------------------


async def _complete(model: ModelWrapper, body: CompletionRequest) -> Response:
    args = body.rollout_args()
    _check_args(model, args)
    try:
        experiences = await model._sample_async(body.prompts, **args)
    except _CLIENT_ERRORS as exc:
        raise bad_request(f"{type(exc).__name__}: {exc}") from None
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
            strings = _token_strings(tokenizer, exp.tokens[exp.prompt_length :].tolist())
            offsets, at = [], 0
            for s in strings:
                offsets.append(at)
                at += len(s)
            choice["logprobs"] = {
                "tokens": strings,
                "token_logprobs": exp.logprobs.tolist(),
                "top_logprobs": None,
                "text_offset": offsets,
            }
        choices.append(choice)
        exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
    model._record(experiences)

    prompt_tokens = sum(e.prompt_length for e in experiences[:: body.n])
    completion = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": _usage(experiences, prompt_tokens),
    }
    if body.stream:
        return _sse(_completion_chunks(completion, body.include_usage))
    return JSONResponse(completion)


def _completion_chunks(completion: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    head = {k: completion[k] for k in ("id", "object", "created", "model")}
    for choice in completion["choices"]:
        yield {**head, "choices": [{**choice, "finish_reason": None}]}
        yield {**head, "choices": [{"index": choice["index"], "text": "", "logprobs": None,
                                    "finish_reason": choice["finish_reason"]}]}  # fmt: skip
    if include_usage:
        yield {**head, "choices": [], "usage": completion["usage"]}
