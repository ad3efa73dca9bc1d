"""A rollout model served by another process, for ``trinity debug``'s two-terminal recipe.

``trinity debug --module inference_model`` loads the model once and serves it with
:func:`build_debug_app`: the usual OpenAI-compatible API (``/v1/...``, see
:mod:`trinity.serving.openai_api`) plus a few routes under :data:`DEBUG_ROUTE` that hand out
whole Experiences. ``trinity debug --module workflow`` in another terminal then runs workflows
against it through :class:`RemoteModelWrapper`, without loading the model again.

Why routes of its own: the OpenAI API answers text and per-token strings, not token ids, renders
``tools`` only with a tool-call parser, and takes only OpenAI's sampling fields. Experiences
rebuilt from it would differ from those a local :class:`~trinity.explorer.model_wrapper.ModelWrapper`
returns. The debug routes run the very same wrapper calls in the serving process and send the
Experiences back (token ids, ``prompt_length``, logprobs, ``info``), so a remote run gives what a
local run gives. Workflows that talk OpenAI (``get_openai_client``, ``base_url``) use ``/v1``
of the same server; with ``enable_history`` those calls are collected by
:meth:`RemoteModelWrapper.extract_experience_from_history` as locally.

The client side uses the standard library only (no HTTP package needed); the server side needs
FastAPI, as the OpenAI API does.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any

from trinity.explorer.model_wrapper import WrapperBase

if TYPE_CHECKING:
    import torch
    from fastapi import FastAPI

    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper

#: Where the debug routes live, next to ``/v1``.
DEBUG_ROUTE = "/trinity/debug"
#: Header naming the :class:`RemoteModelWrapper` an OpenAI call comes from (keeps the histories
#: of several debug runs against one server apart).
CLIENT_HEADER = "x-trinity-debug-client"
# OpenAI calls whose Experiences nobody collected are forgotten beyond this many.
MAX_KEPT_CALLS = 10_000

# Built-in exception types a remote call re-raises as themselves, so a workflow's traceback reads
# as in a local run (``TypeError: unknown rollout argument(s) ...``); others become RuntimeError.
_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e for e in (TypeError, ValueError, KeyError, IndexError, NotImplementedError)
}


# -- Experiences on the wire -----------------------------------------------------------------


def experience_to_wire(exp: Experience) -> dict[str, Any]:
    """A JSON-ready dict of ``exp``: tensors as lists, with their dtypes."""
    out: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for name, value in exp.to_dict().items():
        if hasattr(value, "tolist"):
            dtypes[name] = str(value.dtype)
            value = value.tolist()
        out[name] = value
    out["_dtypes"] = dtypes
    return out


def experience_from_wire(data: dict[str, Any]) -> Experience:
    """The Experience :func:`experience_to_wire` described (same tensor dtypes)."""
    import numpy as np

    from trinity.experience import Experience

    data = dict(data)
    for name, dtype in data.pop("_dtypes", {}).items():
        data[name] = np.asarray(data[name], dtype=dtype)
    return Experience.from_dict(data)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else str(value)


def _dumps(value: Any) -> bytes:
    # allow_nan: a logprob may be -inf, which Python's json reads back; anything else that is not
    # JSON (a tensor in ``info``...) goes as a list or its text.
    return json.dumps(value, allow_nan=True, default=_plain).encode()


# -- server side -----------------------------------------------------------------------------


class _CallStore:
    """Experiences of the OpenAI calls, kept until a :class:`RemoteModelWrapper` collects them."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.calls: collections.deque[tuple[int, str, list[dict[str, Any]]]] = collections.deque(
            maxlen=MAX_KEPT_CALLS
        )
        self.lock = threading.Lock()

    def record(self, experiences: list[Experience], context: Any) -> None:
        client = context.headers.get(CLIENT_HEADER, "")
        wire = [experience_to_wire(e) for e in experiences]
        with self.lock:
            self.calls.append((next(self.seq), client, wire))

    def take(self, client: str, clear: bool) -> list[tuple[int, list[dict[str, Any]]]]:
        """The calls of ``client`` and those of no known client, oldest first."""
        with self.lock:
            mine = [c for c in self.calls if c[1] in (client, "")]
            if clear:
                self.calls = collections.deque(
                    (c for c in self.calls if c[1] not in (client, "")), maxlen=MAX_KEPT_CALLS
                )
        return [(seq, wire) for seq, _, wire in mine]


def build_debug_app(model: ModelWrapper) -> FastAPI:
    """The OpenAI API app of ``model`` plus the debug routes (:data:`DEBUG_ROUTE`) that
    :class:`RemoteModelWrapper` calls. The model's ``api_key`` guards both."""
    from fastapi import Body
    from fastapi.responses import Response

    from trinity.serving.openai_api.server import build_app

    # Route signatures name only module-level types: with postponed annotations, FastAPI reads
    # them from this module's globals, and fastapi is imported here, not there.
    store = _CallStore()
    json_body = Body(...)  # each debug route takes one JSON object
    app = build_app(model, recorder=store.record)

    def answer(value: Any, status: int = 200) -> Response:
        return Response(_dumps(value), status_code=status, media_type="application/json")

    async def call(work: Any) -> Response:
        try:
            return answer(await work)
        except Exception as exc:  # sent back whole; the client raises it
            status = 400 if isinstance(exc, tuple(_ERRORS.values())) else 500
            return answer({"error": {"type": type(exc).__name__, "message": str(exc)}}, status)

    async def experiences(work: Any) -> dict[str, Any]:
        done = await work
        return {"seq": next(store.seq), "experiences": [experience_to_wire(e) for e in done]}

    @app.get(f"{DEBUG_ROUTE}/info")
    async def info() -> Any:
        engine = model.engine
        return answer(
            {
                "name": model.name,
                "model_path": model.model_path,
                "model_version": model.model_version,
                "engine_seed": getattr(engine, "seed", 0),
                "default_seed": engine.default_args.seed,
                "chat_template": getattr(engine, "chat_template", None),
                "limits": model._limits(),
                "pid": os.getpid(),
            }
        )

    # Sampling as ModelWrapper.chat / generate do, seeds included; nothing is recorded here:
    # the client keeps its own history of what it hands out.
    @app.post(f"{DEBUG_ROUTE}/chat")
    async def chat(body: dict[str, Any] = json_body) -> Any:
        return await call(
            experiences(
                model._sample_chat_async(
                    body["messages"],
                    tools=body.get("tools"),
                    chat_template_kwargs=body.get("chat_template_kwargs"),
                    **body.get("rollout_args", {}),
                )
            )
        )

    @app.post(f"{DEBUG_ROUTE}/generate")
    async def generate(body: dict[str, Any] = json_body) -> Any:
        return await call(experiences(model._sample_async(body["prompts"], **body.get("rollout_args", {}))))

    @app.post(f"{DEBUG_ROUTE}/logprobs")
    async def logprobs(body: dict[str, Any] = json_body) -> Any:

        async def work() -> list[float]:
            out = await model.logprobs_async(body["tokens"], body.get("temperature", 1.0))
            return out.tolist()

        return await call(work())

    @app.post(f"{DEBUG_ROUTE}/history")
    async def history(body: dict[str, Any] = json_body) -> Any:
        calls = store.take(body.get("client", ""), bool(body.get("clear", True)))
        return answer({"calls": [{"seq": seq, "experiences": wire} for seq, wire in calls]})

    return app


# -- client side -----------------------------------------------------------------------------


class RemoteModelError(ConnectionError):
    """The served model cannot be reached (or did not answer as a debug server)."""


def _root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")


# Requests to 127.0.0.1 must not go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(url: str, body: Any = None, *, api_key: str = "EMPTY", timeout: float | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if api_key and api_key != "EMPTY":
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else _dumps(body)
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with _OPENER.open(req, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read()).get("error", {})
        except (ValueError, AttributeError):
            error = {}
        message = error.get("message") or f"HTTP {exc.code}"
        raise _ERRORS.get(error.get("type", ""), RuntimeError)(message) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RemoteModelError(f"the inference model at {url} does not answer: {reason}") from None


def probe(base_url: str, api_key: str = "EMPTY", timeout: float = 3.0) -> dict[str, Any] | None:
    """The debug server's info at ``base_url`` (``.../v1``), or ``None`` when it does not answer."""
    try:
        info = _request(f"{_root(base_url)}{DEBUG_ROUTE}/info", api_key=api_key, timeout=timeout)
    except Exception:
        return None
    return info if isinstance(info, dict) and "model_version" in info else None


class RemoteModelWrapper(WrapperBase):
    """What a workflow sees of a model served by :func:`build_debug_app` in another process.

    It offers :class:`~trinity.explorer.model_wrapper.ModelWrapper`'s API (``chat``,
    ``generate``, their async twins, ``logprobs``, ``convert_messages_to_experience``,
    ``seed_calls``, ``extract_experience_from_history``, ``get_openai_client``, ``tokenizer``,
    ``model_version``...) and returns the Experiences the served wrapper makes, so a workflow
    behaves as with the model loaded in its own process.

    Args:
        base_url: the served model's ``http://127.0.0.1:<port>/v1``.
        name: the model's name (``rollout``, an auxiliary model's name).
        model_path: where the tokenizer is loaded from (default: the server's model path).
        api_key: the server's API key (``"EMPTY"``: none).
        enable_history: record every returned Experience, OpenAI calls included.
        timeout: seconds one call may take.

    Raises:
        RemoteModelError: the server does not answer.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "rollout",
        model_path: str | None = None,
        api_key: str = "EMPTY",
        enable_history: bool = False,
        timeout: float | None = 3600.0,
    ) -> None:
        self.openai_base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.enable_history = enable_history
        self.name = name
        self.client_id = uuid.uuid4().hex
        self._info: dict[str, Any] = self._call("info")
        self.model_path = model_path or self._info.get("model_path")
        self._tokenizer: Any = None
        self._history: list[tuple[int, list[Experience]]] = []
        self._lock = threading.Lock()
        self._seeds: Any = None

    def _call(self, route: str, body: Any = None) -> Any:
        url = f"{_root(self.openai_base_url)}{DEBUG_ROUTE}/{route}"
        return _request(url, body, api_key=self.api_key, timeout=self.timeout)

    # -- what workflows read ---------------------------------------------------------------

    @property
    def model_version(self) -> int:
        """Version of the served weights (as when this wrapper connected)."""
        return int(self._info["model_version"])

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded here from ``model_path`` (no weights)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    # -- seeds, as ModelWrapper.seed_calls: the served engine's seed gives the same samples --

    def _engine_seed(self) -> int:
        return int(self._info.get("engine_seed", 0))

    def _engine_default_seed(self) -> int | None:
        return self._info.get("default_seed")

    # -- generation ------------------------------------------------------------------------

    def _sampled(self, route: str, body: dict[str, Any]) -> list[Experience]:
        answer = self._call(route, body)
        experiences = [experience_from_wire(e) for e in answer["experiences"]]
        if self.enable_history:
            with self._lock:
                self._history.append((answer["seq"], experiences))
        return experiences

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Sample replies to ``messages`` on the served model (see :meth:`ModelWrapper.chat`)."""
        body = {"messages": messages, "rollout_args": self._with_seed(rollout_args)}
        if tools:
            body["tools"] = tools
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        return self._sampled("chat", body)

    def generate(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Sample continuations of raw prompts on the served model, prompt-major."""
        return self._sampled(
            "generate", {"prompts": list(prompts), "rollout_args": self._with_seed(rollout_args)}
        )

    async def chat_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Async twin of :meth:`chat`."""
        args = self._with_seed(rollout_args)  # drawn now, in call order, as locally
        return await asyncio.to_thread(
            self.chat, messages, tools=tools, chat_template_kwargs=chat_template_kwargs, **args
        )

    async def generate_async(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Async twin of :meth:`generate`."""
        args = self._with_seed(rollout_args)
        return await asyncio.to_thread(self.generate, prompts, **args)

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Logprobs of ``tokens[1:]`` under the served weights, ``(len(tokens) - 1,)``."""
        import torch

        values = self._call("logprobs", {"tokens": [int(t) for t in tokens], "temperature": temperature})
        return torch.tensor(values, dtype=torch.float32)

    async def logprobs_async(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Async twin of :meth:`logprobs`."""
        return await asyncio.to_thread(self.logprobs, tokens, temperature)

    def _limits(self) -> dict[str, Any]:
        return dict(self._info.get("limits") or {})

    def _chat_template(self) -> str | None:
        return self._info.get("chat_template")

    # -- history ---------------------------------------------------------------------------

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        """Experiences handed out since the last extraction, in call order: those of
        :meth:`chat` / :meth:`generate` and those of this wrapper's OpenAI clients (needs
        ``enable_history``)."""
        if not self.enable_history:
            raise RuntimeError(
                "extract_experience_from_history needs enable_history: set "
                "explorer.rollout_model.enable_history: true in the config"
            )
        served = self._call("history", {"client": self.client_id, "clear": clear_history})["calls"]
        with self._lock:
            calls = list(self._history)
            if clear_history:
                self._history.clear()
        calls += [(c["seq"], [experience_from_wire(e) for e in c["experiences"]]) for c in served]
        return [exp for _, batch in sorted(calls, key=lambda c: c[0]) for exp in batch]

    # -- OpenAI API ------------------------------------------------------------------------

    def start_openai_server(self) -> str:
        """The served model's OpenAI API URL (the server is already running)."""
        return self.openai_base_url

    def _client_kwargs(self, given: dict[str, Any]) -> dict[str, Any]:
        # The header tags this wrapper's calls, so its history holds only its own calls.
        headers = {CLIENT_HEADER: self.client_id, **given.pop("default_headers", {})}
        return super()._client_kwargs({"default_headers": headers, **given})

    def close(self) -> None:
        """Nothing to release: the server belongs to the other process."""
