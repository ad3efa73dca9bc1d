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
wrapper's history (``ModelWrapper._record``); serve mode (:mod:`trinity.serving.serve`) passes
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
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from trinity.serving.openai_api.chat import chat
from trinity.serving.openai_api.completions import complete
from trinity.serving.openai_api.schema import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    validation_message,
)

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper

logger = logging.getLogger("trinity.serving.openai_api")  # one logger for the whole API (enable_log_requests)

ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models"
# Threads that wait on the engine for the requests in flight (an engine without native async
# generation runs each call in a thread; the transformers engine batches concurrent calls).
MAX_ENGINE_THREADS = 256


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
        return await chat(model, body, record_for(request, body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_model(model, body.model)
        return await complete(model, body, record_for(request, body))

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
