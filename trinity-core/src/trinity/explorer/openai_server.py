"""A minimal OpenAI-compatible HTTP server in front of a :class:`ModelWrapper`.

Agent code that speaks OpenAI (``openai.OpenAI(base_url=...)``) can run inside a workflow
against the rollout model. The server binds 127.0.0.1 on a free port (never another
interface: it has no authentication) and serves, from a background thread:

- ``POST /v1/chat/completions``: ``messages``, ``n``, ``temperature``, ``top_p``, ``top_k``,
  ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``;
  no streaming, no tools.
- ``GET /v1/models``.

When the model wrapper has an ``api_key`` other than ``"EMPTY"``, requests must carry
``Authorization: Bearer <api_key>`` (what ``openai.OpenAI(api_key=...)`` sends).

It uses the standard library only: the traffic is one workflow's own requests.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.explorer.model_wrapper import ModelWrapper

_PASSED_THROUGH = ("n", "temperature", "top_p", "top_k", "stop", "seed", "max_tokens")


class OpenAIServer:
    """Serves ``model`` on ``http://127.0.0.1:<port>/v1`` (port 0: any free port)."""

    def __init__(self, model: ModelWrapper, port: int = 0) -> None:
        self.model = model
        handler = type("_Handler", (_Handler,), {"server_model": model})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="trinity-openai-api", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def chat_completion_request_to_args(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """``(messages, rollout_args, want_logprobs)`` from a chat completion request body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    if body.get("stream"):
        raise ValueError("streaming is not supported by the Trinity rollout API")
    args = {k: body[k] for k in _PASSED_THROUGH if body.get(k) is not None}
    if body.get("max_completion_tokens") is not None:
        args["max_tokens"] = body["max_completion_tokens"]
    return messages, args, bool(body.get("logprobs"))


def experiences_to_chat_completion(
    experiences: list[Any], model_name: str, tokenizer: Any, logprobs: bool
) -> dict:
    """An OpenAI ``chat.completion`` object for the samples of one request."""
    choices = []
    for i, exp in enumerate(experiences):
        choice: dict[str, Any] = {
            "index": i,
            "message": {"role": "assistant", "content": exp.response_text},
            "finish_reason": exp.info.get("finish_reason", "stop"),
        }
        if logprobs and exp.logprobs is not None:
            ids = exp.tokens[exp.prompt_length :].tolist()
            choice["logprobs"] = {
                "content": [
                    {"token": tokenizer.decode([t]), "logprob": float(lp), "top_logprobs": []}
                    for t, lp in zip(ids, exp.logprobs.tolist())
                ]
            }
        choices.append(choice)
    prompt_tokens = experiences[0].prompt_length if experiences else 0
    completion_tokens = sum(e.response_length for e in experiences)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class _Handler(BaseHTTPRequestHandler):
    server_model: ModelWrapper

    def log_message(self, format: str, *args: Any) -> None:  # requests are not worth a log line each
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(status, {"error": {"message": message, "type": kind}})

    def _authorized(self) -> bool:
        key = self.server_model.api_key
        if not key or key == "EMPTY":
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._error(
            401,
            "missing or wrong API key: send 'Authorization: Bearer <key>' with the api_key of "
            "explorer.rollout_model (or of the auxiliary model)",
            "authentication_error",
        )
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server_model.name, "object": "model"}]})
        else:
            self._error(404, f"no route GET {self.path}")

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route POST {self.path}; this server offers /v1/chat/completions")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            messages, args, want_logprobs = chat_completion_request_to_args(body)
        except (ValueError, json.JSONDecodeError) as exc:
            self._error(400, str(exc))
            return
        try:
            experiences = self.server_model.chat(messages, **args)
        except (TypeError, ValueError) as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
            return
        model = self.server_model
        self._send(
            200, experiences_to_chat_completion(experiences, model.name, model.tokenizer, want_logprobs)
        )
