"""Request models of the OpenAI-compatible API, and the OpenAI error shape.

The models accept what OpenAI clients and agent frameworks send; fields the engines cannot honour
are refused with a 400 naming the field (a sampling penalty, ``top_logprobs``, a JSON
``response_format``...), since an Experience recorded under a silently ignored setting would
teach the wrong thing. Unknown extra fields (``user``, ``metadata``, ``store``...) are accepted
and ignored, as OpenAI and vLLM do.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",  # OpenAI's field name
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- pieces ----------------------------------------------------------------------------------


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _FunctionName(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: _FunctionName


class Message(_Lenient):
    """A chat message. ``content`` may be a string, a list of text parts, or absent (an assistant
    message carrying ``tool_calls``); other keys (``name``, ``tool_call_id``,
    ``reasoning_content``...) reach the chat template unchanged."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


# -- requests --------------------------------------------------------------------------------


class _Sampling(_Lenient):
    """Fields shared by ``/v1/chat/completions`` and ``/v1/completions``."""

    model: str | None = None
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None  # vLLM's extension; <= 0 turns it off
    min_tokens: int | None = Field(None, ge=0)  # vLLM's extension
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @model_validator(mode="after")
    def _no_penalties(self) -> _Sampling:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(
                    f"{name} is not supported: the rollout engines sample without penalties "
                    "(the recorded logprobs must be those of the sampling distribution)"
                )
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by the rollout engines")
        return self

    def rollout_args(self) -> dict[str, Any]:
        """The engine's rollout arguments (unset ones keep the engine's defaults)."""
        args: dict[str, Any] = {"n": self.n}
        for name in ("temperature", "top_p", "top_k", "min_tokens", "max_tokens", "seed"):
            value = getattr(self, name)
            if value is not None:
                args[name] = value
        if self.stop:
            args["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return args

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# Keys of chat_template_kwargs that would change what apply_chat_template returns, not how the
# template renders.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"tokenize", "return_dict", "return_tensors", "return_assistant_tokens_mask", "chat_template",
     "tools", "conversation", "messages", "continue_final_message", "add_generation_prompt"}
)  # fmt: skip


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension (e.g. enable_thinking)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(
                "top_logprobs > 0 is not supported: the rollout engines report the sampled token's "
                "logprob only (use logprobs: true with top_logprobs 0 or unset)"
            )
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value and value.get("type", "text") != "text":
            raise ValueError(
                f"response_format {value.get('type')!r} is not supported: the rollout engines have "
                "no constrained decoding (ask for JSON in the prompt instead)"
            )
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(value or ()) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {reserved}")
        return value

    def rollout_args(self) -> dict[str, Any]:
        args = super().rollout_args()
        if self.max_completion_tokens is not None:  # OpenAI's newer name wins
            args["max_tokens"] = self.max_completion_tokens
        return args


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must be a string or a non-empty list of strings")
        return value

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(
                "logprobs > 0 (top alternatives) is not supported: the rollout engines report the "
                "sampled token's logprob only (use logprobs: 0)"
            )
        return value

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


# -- messages for the chat template ----------------------------------------------------------


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The request's messages as chat templates expect them.

    Text parts are joined with newlines (other parts are refused: the engines take text only);
    a missing ``content`` becomes ``""``; ``developer`` becomes ``system``; the JSON-text
    ``arguments`` of an assistant's ``tool_calls`` become objects (templates render them with
    ``tojson``, which would otherwise quote the JSON text a second time).
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        item = message.model_dump(exclude_none=True)
        content = message.content
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(
                        f"messages[{i}]: only text content parts are supported, got {kind!r}",
                        param=f"messages.{i}.content",
                    )
                texts.append(part["text"])
            content = "\n".join(texts)
        item["content"] = content or ""
        if item["role"] == "developer":
            item["role"] = "system"
        if message.tool_calls:
            item["tool_calls"] = [_call_for_template(call) for call in message.tool_calls]
        out.append(item)
    return out


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """``(message, param)`` for pydantic / FastAPI validation errors."""
    parts, param = [], None
    for error in errors[:3]:
        loc = [str(x) for x in error.get("loc", ()) if x != "body"]
        if error.get("type") == "json_invalid":
            parts.append(
                f"the request body is not valid JSON: {error.get('ctx', {}).get('error', '')}".rstrip(": ")
            )
            continue
        where = ".".join(loc)
        param = param or where or None
        msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    if len(errors) > 3:
        parts.append(f"(and {len(errors) - 3} more)")
    return "; ".join(parts) or "invalid request", param
