"""The model handle workflows receive: a thin, history-keeping front of a rollout engine.

It implements the :class:`trinity.workflow.ModelWrapperProtocol` protocol (``chat``, ``generate``,
async twins, ``logprobs``, ``convert_messages_to_experience``, ``get_openai_client``).
With ``enable_history`` every Experience it hands out, including those made for OpenAI API
calls (:mod:`trinity.serving.openai_api`), is also recorded, for workflows whose agent code
never sees Experiences; :meth:`ModelWrapper.extract_experience_from_history` collects them.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trinity.config.sections.explorer import InferenceModelConfig
    from trinity.experience import Experience
    from trinity.rollout.base import RolloutEngine, StreamItem
    from trinity.serving.openai_api.server import OpenAIServer


class WrapperBase:
    """What the local :class:`ModelWrapper` and the debug remote wrapper
    (:class:`trinity.serving.remote_model.RemoteModelWrapper`) share: per-task call seeds and
    the OpenAI clients. Subclasses set ``name``, ``api_key``, ``_lock`` and ``_seeds`` and
    provide ``openai_base_url``, :meth:`_engine_seed` and :meth:`_engine_default_seed`."""

    name: str
    api_key: str
    openai_base_url: str
    _lock: threading.Lock
    _seeds: Iterator[int] | None

    def _engine_seed(self) -> int:
        raise NotImplementedError

    def _engine_default_seed(self) -> int | None:
        raise NotImplementedError

    def seed_calls(self, key: str | None) -> None:
        """Seed this wrapper's calls that ask for no ``seed`` from ``key``, one seed per call.

        The workflow runner calls it with the task's identity before each task, so a task's
        samples depend on the task, the weights and the engine's seed, not on which runner ran
        it or what shared the engine's batch: a job with fixed seeds samples the same rollouts
        on every run. ``None`` goes back to the engine's own seed stream.
        """
        if key is None:
            self._seeds = None
            return
        digest = hashlib.sha256(f"{self._engine_seed()}/{key}".encode()).digest()
        self._seeds = itertools.count(int.from_bytes(digest[:7], "big"))

    def _with_seed(self, rollout_args: dict[str, Any]) -> dict[str, Any]:
        if (
            self._seeds is None
            or rollout_args.get("seed") is not None
            or self._engine_default_seed() is not None
        ):
            return rollout_args
        with self._lock:
            seed = next(self._seeds)
        return {**rollout_args, "seed": seed}

    @property
    def base_url(self) -> str:
        """Same as :attr:`openai_base_url` (Trinity-RFT's name)."""
        return self.openai_base_url

    @property
    def model_name(self) -> str:
        """The model id the OpenAI API reports."""
        return self.name

    #: Further model ids the OpenAI API answers to (``model_aliases``; ``"*"``: any id).
    aliases: tuple[str, ...] = ()
    model_path: str | None = None

    @property
    def served_model_names(self) -> list[str]:
        """The model ids the OpenAI API answers to: :attr:`model_name`, the model's path (what
        Trinity-RFT's workflows send: ``openai_client.model_path``) and the configured aliases;
        any other id is answered with a 404, as OpenAI and vLLM do."""
        names = [self.name, *([self.model_path] if self.model_path else []), *self.aliases]
        return list(dict.fromkeys(names))

    def serves(self, model_id: str) -> bool:
        """Whether the OpenAI API answers requests for ``model_id`` (see :attr:`served_model_names`)."""
        return "*" in self.aliases or model_id in self.served_model_names

    # -- token limits (see trinity.rollout.base) -------------------------------------

    @property
    def max_model_len(self) -> int | None:
        """Longest sequence (prompt + response) the model serves; ``None``: no limit."""
        return self._limits().get("max_model_len")

    @property
    def max_prompt_tokens(self) -> int | None:
        """Longest prompt of a workflow's call (longer ones are masked out or refused)."""
        return self._limits().get("max_prompt_tokens")

    @property
    def max_response_tokens(self) -> int | None:
        """Default ``max_tokens`` of a call."""
        return self._limits().get("max_response_tokens")

    @property
    def enable_prompt_truncation(self) -> bool:
        """Whether a call's prompt over :attr:`max_prompt_tokens` is answered with placeholders
        masked out of training (else it is sampled while it fits :attr:`max_model_len`)."""
        return bool(self._limits().get("enable_prompt_truncation", True))

    def _limits(self) -> dict[str, Any]:
        raise NotImplementedError

    def _chat_template(self) -> str | None:
        raise NotImplementedError

    def convert_messages_to_experience(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Experience:
        """One Experience for a whole conversation.

        ``tokens`` is the chat template applied to ``messages``; the prompt is everything before
        the first assistant turn; ``action_mask`` marks exactly the assistant tokens (from the
        template's ``{% generation %}`` markers; for templates without them, each assistant turn
        is located by templating the conversation up to it). Logprobs are recomputed under the
        current weights.

        The token limits hold as for sampled calls (Trinity-RFT's rules): a prompt over
        ``max_prompt_tokens`` (with ``enable_prompt_truncation``) gives a placeholder masked out of
        training, and a conversation past ``max_model_len`` is cut there
        (``info["truncate_status"]``: ``"prompt_truncated"`` / ``"response_truncated"``).
        """
        import torch

        from trinity.experience import Experience
        from trinity.rollout.base import PROMPT_TRUNCATED

        ids, mask = assistant_token_mask(self.tokenizer, messages, self._chat_template(), tools)
        if 1 not in mask:
            raise ValueError("convert_messages_to_experience: the conversation has no assistant message")
        prompt_length = mask.index(1)
        limits = self._limits()
        info: dict[str, Any] = {}
        max_prompt = limits.get("max_prompt_tokens")
        if (
            limits.get("enable_prompt_truncation", True)
            and max_prompt is not None
            and prompt_length > max_prompt
        ):
            return Experience(
                tokens=torch.tensor(ids[: max_prompt + 1], dtype=torch.long),
                prompt_length=max_prompt,
                logprobs=torch.zeros(1, dtype=torch.float32),
                action_mask=torch.zeros(1, dtype=torch.bool),
                prompt_text=self.tokenizer.decode(ids[:max_prompt]),
                response_text="",
                messages=[dict(m) for m in messages],
                info={"truncate_status": PROMPT_TRUNCATED, "prompt_tokens": prompt_length},
                model_version=self.model_version,
            )
        max_len = limits.get("max_model_len")
        if max_len is not None and len(ids) > max_len:
            if prompt_length >= max_len:
                from trinity.rollout.base import PromptTooLong

                raise PromptTooLong(prompt_length, max_len)
            ids, mask = ids[:max_len], mask[:max_len]
            info["truncate_status"] = "response_truncated"
        logprobs = self.logprobs(ids)[prompt_length - 1 :] if prompt_length > 0 else None
        return Experience(
            tokens=torch.tensor(ids, dtype=torch.long),
            prompt_length=prompt_length,
            logprobs=logprobs,
            action_mask=torch.tensor(mask[prompt_length:], dtype=torch.bool),
            prompt_text=self.tokenizer.decode(ids[:prompt_length]),
            response_text=self.tokenizer.decode(ids[prompt_length:]),
            messages=[dict(m) for m in messages],
            info=info,
            model_version=self.model_version,
        )

    def _openai_module(self, what: str) -> Any:
        try:
            import openai
        except ImportError:
            raise ImportError(
                f"{what}() needs the openai package: pip install openai "
                f"(or send HTTP requests to {self.openai_base_url}/chat/completions yourself)"
            ) from None
        return openai

    def get_openai_client(self, **client_kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client talking to this model's OpenAI-compatible server on
        127.0.0.1 (calls are recorded in the history when ``enable_history`` is on).

        ``client_kwargs`` go to ``openai.OpenAI`` (``timeout``...). Retries are off by default
        (``max_retries=0``): a retried call that the server did answer would be recorded twice.
        """
        return self._openai_module("get_openai_client").OpenAI(**self._client_kwargs(client_kwargs))

    def get_openai_async_client(self, **client_kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for the same server (for ``run_async`` workflows);
        ``client_kwargs`` as for :meth:`get_openai_client`."""
        return self._openai_module("get_openai_async_client").AsyncOpenAI(
            **self._client_kwargs(client_kwargs)
        )

    def _client_kwargs(self, given: dict[str, Any]) -> dict[str, Any]:
        return {"base_url": self.openai_base_url, "api_key": self.api_key, "max_retries": 0, **given}


class ModelWrapper(WrapperBase):
    """What a workflow sees of one rollout engine.

    Args:
        engine: the :class:`~trinity.rollout.base.RolloutEngine` serving requests.
        enable_history: record every returned Experience (see :meth:`extract_experience_from_history`).
        name: shown in logs and as the model id of the OpenAI API.
        model_path: the served model's path (``model_path`` attribute, as in Trinity-RFT).
        api_key: key the OpenAI API requires as ``Authorization: Bearer <key>``
            (``"EMPTY"``: none, the server being reachable from this machine only).
        port: port of the OpenAI API (``None``: any free port).
        tool_call_parser: how the OpenAI API reads tool calls in replies (``hermes``,
            ``llama3_json``; ``None``: requests with tools are refused).
        reasoning_parser: how the OpenAI API splits ``<think>`` reasoning off replies
            (``qwen3``, ``deepseek_r1``; ``None``: replies are content only).
        enable_auto_tool_choice: let the OpenAI API serve ``tool_choice: "auto"`` (the default
            when a request has ``tools``), as vLLM's ``--enable-auto-tool-choice``.
        log_requests: log one line per OpenAI API request (logger ``trinity.serving.openai_api``).
        aliases: further model ids the OpenAI API answers to besides ``name`` and ``model_path``
            (``"*"``: any id); see :attr:`served_model_names`.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        enable_history: bool = False,
        name: str = "rollout",
        model_path: str | None = None,
        api_key: str = "EMPTY",
        port: int | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        enable_auto_tool_choice: bool = False,
        log_requests: bool = False,
        aliases: tuple[str, ...] | list[str] = (),
    ) -> None:
        if tool_call_parser is not None or reasoning_parser is not None:
            # Pure-Python modules: an unknown name fails here, not at the first request.
            from trinity.serving.openai_api.reasoning import get_reasoning_parser
            from trinity.serving.openai_api.tool_parsers import get_tool_call_parser

            if tool_call_parser is not None:
                get_tool_call_parser(tool_call_parser)
            if reasoning_parser is not None:
                get_reasoning_parser(reasoning_parser)
        self.engine = engine
        self.enable_history = enable_history
        self.name = name
        self.model_path = model_path
        self.api_key = api_key
        self.port = port
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.enable_auto_tool_choice = enable_auto_tool_choice
        self.log_requests = log_requests
        self.aliases = tuple(aliases)
        self._history: list[Experience] = []
        self._lock = threading.Lock()
        self._server: OpenAIServer | None = None
        self._seeds: Iterator[int] | None = None

    def _engine_seed(self) -> int:
        return getattr(self.engine, "seed", 0)

    def _engine_default_seed(self) -> int | None:
        return self.engine.default_args.seed

    @property
    def model_version(self) -> int:
        """Version of the weights the engine holds."""
        return self.engine.model_version

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def _limits(self) -> dict[str, Any]:
        engine = self.engine
        defaults = getattr(engine, "default_args", None)
        return {
            "max_model_len": getattr(engine, "max_model_len", None),
            "max_prompt_tokens": getattr(engine, "max_prompt_tokens", None),
            "max_response_tokens": getattr(defaults, "max_tokens", None),
            "enable_prompt_truncation": getattr(engine, "enable_prompt_truncation", True),
        }

    def _chat_template(self) -> str | None:
        return getattr(self.engine, "chat_template", None)

    # -- generation ------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Sample replies to ``messages`` (``n`` in ``rollout_args`` for several).

        ``tools`` (OpenAI function definitions) and ``chat_template_kwargs`` reach the chat
        template (see :meth:`RolloutEngine.apply_chat_template`).
        """
        template = _template_args(tools, chat_template_kwargs)
        return self._record(self.engine.chat(messages, **template, **self._with_seed(rollout_args)))

    def generate(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Sample continuations of raw prompts (no chat template), prompt-major."""
        return self._record(self.engine.generate(prompts, **self._with_seed(rollout_args)))

    async def chat_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Async twin of :meth:`chat`."""
        return self._record(
            await self._sample_chat_async(
                messages, tools=tools, chat_template_kwargs=chat_template_kwargs, **rollout_args
            )
        )

    async def generate_async(self, prompts: list[str], **rollout_args: Any) -> list[Experience]:
        """Async twin of :meth:`generate`."""
        return self._record(await self._sample_async(prompts, **rollout_args))

    # The OpenAI API samples through these (seeded like every call) and records the
    # Experiences itself once it has added what it parsed.

    # ``whole_context``: the OpenAI API's limits (only max_model_len bounds the prompt).

    async def _sample_chat_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        template = _template_args(tools, chat_template_kwargs, whole_context)
        return await self.engine.chat_async(messages, **template, **self._with_seed(rollout_args))

    async def _sample_async(
        self, prompts: list[str], *, whole_context: bool = False, **rollout_args: Any
    ) -> list[Experience]:
        extra = _template_args(None, None, whole_context)
        return await self.engine.generate_async(prompts, **extra, **self._with_seed(rollout_args))

    # Streaming twins (``stream: true``): token deltas, then the Experiences (see
    # RolloutEngine.generate_stream_async). The seed is drawn now, as for a call that does not stream.

    def _stream_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> AsyncIterator[StreamItem]:
        template = _template_args(tools, chat_template_kwargs, whole_context)
        args = self._with_seed(rollout_args)
        if not hasattr(self.engine, "chat_stream_async"):  # an engine double: whole samples
            from trinity.rollout.base import whole_sample_stream

            return whole_sample_stream(lambda: self.engine.chat_async(messages, **template, **args))
        return self.engine.chat_stream_async(messages, **template, **args)

    def _stream(
        self, prompts: list[str], *, whole_context: bool = False, **rollout_args: Any
    ) -> AsyncIterator[StreamItem]:
        args = {**_template_args(None, None, whole_context), **self._with_seed(rollout_args)}
        if not hasattr(self.engine, "generate_stream_async"):
            from trinity.rollout.base import whole_sample_stream

            return whole_sample_stream(lambda: self.engine.generate_async(prompts, **args))
        return self.engine.generate_stream_async(prompts, **args)

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Logprobs of ``tokens[1:]`` under the current weights, ``(len(tokens) - 1,)``."""
        return self.engine.logprobs(list(tokens), temperature)

    async def logprobs_async(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Async twin of :meth:`logprobs`."""
        return await self.engine.logprobs_async(list(tokens), temperature)

    # -- history ---------------------------------------------------------------------------

    def _record(self, experiences: list[Experience]) -> list[Experience]:
        if self.enable_history:
            with self._lock:
                self._history.extend(experiences)
        return experiences

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        """Experiences recorded since the last extraction (needs ``enable_history``)."""
        if not self.enable_history:
            raise RuntimeError(
                "extract_experience_from_history needs enable_history: set "
                "explorer.rollout_model.enable_history: true in the config"
            )
        with self._lock:
            out = list(self._history)
            if clear_history:
                self._history.clear()
        return out

    # -- OpenAI API ------------------------------------------------------------------------

    def start_openai_server(self) -> str:
        """Start the OpenAI-compatible server if it is not running; returns its base URL.

        The explorer calls this at startup when ``enable_openai_api`` is set; otherwise the
        server starts the first time a workflow asks for the URL or a client.
        """
        with self._lock:
            if self._server is None:
                from trinity.serving.openai_api.server import OpenAIServer

                self._server = OpenAIServer(self, port=self.port or 0)
                self._server.start()
            return self._server.base_url

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` of the OpenAI-compatible server (started on first use)."""
        return self.start_openai_server()

    def close(self) -> None:
        """Stop the OpenAI server if one was started."""
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None


def model_wrappers_for(
    config: InferenceModelConfig, engines: list[RolloutEngine], *, name: str
) -> list[ModelWrapper]:
    """One wrapper per item of ``engines`` (an engine may appear several times: one wrapper per
    workflow runner), configured from an ``explorer.rollout_model`` / ``auxiliary_models`` entry.

    With ``enable_openai_api`` each wrapper's OpenAI server starts now, wrapper ``i`` on
    ``base_port + i`` when ``base_port`` is set, so the URLs are fixed before any workflow runs.
    """
    wrappers: list[ModelWrapper] = []
    for i, engine in enumerate(engines):
        wrapper = ModelWrapper(
            engine,
            enable_history=config.enable_history,
            name=name,
            model_path=config.model_path,
            api_key=config.api_key,
            port=None if config.base_port is None else config.base_port + i,
            tool_call_parser=config.tool_call_parser,
            reasoning_parser=config.reasoning_parser,
            enable_auto_tool_choice=config.enable_auto_tool_choice,
            log_requests=config.enable_log_requests,
            aliases=config.model_aliases,
        )
        if config.enable_openai_api:
            try:
                wrapper.start_openai_server()
            except OSError as exc:
                for started in wrappers:
                    started.close()
                raise OSError(
                    f"cannot start the OpenAI API of model {name!r} on 127.0.0.1:{wrapper.port}: "
                    f"{exc.strerror or exc}; choose another base_port (or leave it unset for free ports)"
                ) from exc
        wrappers.append(wrapper)
    return wrappers


def _template_args(
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    whole_context: bool = False,
) -> dict[str, Any]:
    """Template and limit keywords for the engine, only those given (engine doubles may not
    take them)."""
    out: dict[str, Any] = {}
    if tools:
        out["tools"] = tools
    if chat_template_kwargs:
        out["chat_template_kwargs"] = chat_template_kwargs
    if whole_context:
        out["whole_context"] = True
    return out


def assistant_token_mask(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of the templated conversation and a 0/1 mask of the assistant tokens."""
    kwargs: dict[str, Any] = {"chat_template": chat_template}
    if tools:
        kwargs["tools"] = tools
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    ids = list(out["input_ids"])
    mask = [int(bool(m)) for m in out.get("assistant_masks", [])]
    if any(mask) or not any(m.get("role") == "assistant" for m in messages):
        return ids, mask or [0] * len(ids)
    # No {% generation %} markers in the template: an assistant turn spans from the end of
    # the conversation-before-it plus the generation prompt, to the end of the turn itself.
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = _template_length(tokenizer, messages[:i], add_generation_prompt=True, **kwargs)
        end = _template_length(tokenizer, messages[: i + 1], **kwargs)
        for j in range(start, min(end, len(ids))):
            mask[j] = 1
    return ids, mask


def _template_length(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> int:
    if not messages:
        return 0
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return len(out["input_ids"])
