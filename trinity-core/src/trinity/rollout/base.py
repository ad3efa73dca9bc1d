"""The rollout engine interface: what the explorer needs from an inference backend.

An engine turns prompts into :class:`~trinity.experience.Experience` objects carrying the
prompt + response token ids, the log-probabilities of the sampled tokens (at the sampling
temperature, from the forward pass that sampled them), the decoded texts and the finish
reason (``info["finish_reason"]``: ``"stop"`` for EOS or a stop string, ``"length"`` when
``max_tokens`` ran out). It also scores given token sequences (:meth:`RolloutEngine.logprobs`)
and takes new weights in place (:meth:`update_weights`, :meth:`load_checkpoint`, or a
broadcast from the trainer through :meth:`init_weight_group` / :meth:`receive_weights`).

Streaming (:meth:`RolloutEngine.generate_stream_async`, :meth:`RolloutEngine.chat_stream_async`):
an async iterator of :class:`TokenDelta` (new tokens of one sample, with their logprobs) ending
with one :class:`StreamEnd` holding the Experiences, exactly those the non-streaming call with the
same arguments returns. An engine that samples token by token (``streams_tokens``: the
transformers engine) yields each decoding step's tokens as they are sampled; the default yields
each whole sample once it is finished. Closing the iterator early abandons the call.

Engines: ``transformers`` (:mod:`.transformers_engine`, CPU or GPU) and ``vllm``
(:mod:`.vllm_engine`, GPU). Prompt building (chat template, tokenisation) and the token limits
are shared here, so both engines see the same token ids for the same messages and hold the same
limits (Trinity-RFT's rules, derived in :func:`trinity.config.limits.derive_token_limits`):

- no sequence runs past ``max_model_len``: each response's ``max_tokens`` is capped at what the
  prompt leaves, and a prompt that leaves no token raises :class:`PromptTooLong` (vLLM's words;
  the OpenAI API answers it with a 400);
- a workflow's prompt over ``max_prompt_tokens`` with ``enable_prompt_truncation`` (the default)
  is not sampled: its ``n`` Experiences are placeholders masked out of training
  (``info["truncate_status"] == "prompt_truncated"``, an all-zero ``action_mask``), as in
  Trinity-RFT. The OpenAI API passes ``whole_context=True``: only ``max_model_len`` counts there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from trinity.experience import Experience
    from trinity.sync.group import GroupSpec

logger = logging.getLogger(__name__)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
#: ``info["finish_reason"]`` of a sample stopped at a sync point (``pause_generation``); the
#: engine continues it from its tokens once resumed, so callers never see it in the end.
FINISH_INTERRUPTED = "interrupted"
#: ``info["truncate_status"]`` of the placeholder Experiences of a prompt over ``max_prompt_tokens``.
PROMPT_TRUNCATED = "prompt_truncated"


# Characters of prompt text past which the async calls tokenise on a worker thread (1 MB takes
# about a second, time in which the event loop would answer nobody else).
_LONG_TEXT = 100_000


def refuses_max_tokens(whole_context: bool, rollout_args: Mapping[str, Any]) -> bool:
    """Whether a call refuses a ``max_tokens`` its prompt leaves no room for, rather than
    capping it: under the OpenAI API's rules (``whole_context``), when the caller gave one."""
    return whole_context and rollout_args.get("max_tokens") is not None


class PromptTooLong(ValueError):
    """A prompt that leaves no token for a reply within ``max_model_len``, or (``max_tokens``
    given) fewer tokens than a request asked for explicitly. The messages are vLLM's; the OpenAI
    API answers with a 400 (``context_length_exceeded``)."""

    def __init__(self, prompt_tokens: int, max_model_len: int, max_tokens: int | None = None) -> None:
        self.prompt_tokens, self.max_model_len, self.max_tokens = prompt_tokens, max_model_len, max_tokens
        if max_tokens is None:
            message = (
                f"This model's maximum context length is {max_model_len} tokens. However, your request "
                f"has {prompt_tokens} input tokens. Please reduce the length of the input messages."
            )
        else:
            message = (
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {max_model_len} tokens and your request has {prompt_tokens} input "
                f"tokens ({max_tokens} > {max_model_len} - {prompt_tokens})."
            )
        super().__init__(message)


@dataclass
class SamplingArgs:
    """Rollout arguments, named as in vLLM's ``SamplingParams`` and Trinity-RFT's ``rollout_args``.

    ``temperature == 0`` means greedy decoding (logprobs are then reported at temperature 1).
    ``top_k <= 0`` and ``top_p == 1`` disable those filters. ``logprobs`` is accepted for
    config compatibility; engines always return the sampled token's logprob only.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: int = 0

    def applied(self, logprobs_renormalised: bool) -> dict[str, Any]:
        """What shaped the distribution an engine sampled from, as it records it per experience
        (``Experience.info["rollout_args"]``, read by the trainer's log-prob guard):
        temperature, top-p, top-k, and whether the logprobs it reports are renormalised over the
        tokens top-k / top-p keep (vLLM's ``processed_logprobs``) or over the whole vocabulary."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "logprobs_renormalised": logprobs_renormalised,
        }

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if self.n < 1:
            raise ValueError(f"rollout argument n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"rollout argument max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"rollout argument temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout argument top_p must be in (0, 1], got {self.top_p}")

    @property
    def logprob_temperature(self) -> float:
        """Temperature the logprobs are computed at (1 for greedy decoding)."""
        return self.temperature if self.temperature > 0 else 1.0

    def updated(self, args: Mapping[str, Any] | Any = None, /, **overrides: Any) -> SamplingArgs:
        """A copy with ``args`` (a mapping or pydantic model) and ``overrides`` applied.

        ``None`` values are skipped (unset taskset fields keep the defaults); unknown names are
        an error listing the valid ones, so a typo in ``rollout_args`` does not pass silently.
        """
        merged: dict[str, Any] = {}
        if args is not None:
            merged.update(args.model_dump() if hasattr(args, "model_dump") else dict(args))
        merged.update(overrides)
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(merged) - valid)
        if unknown:
            raise TypeError(f"unknown rollout argument(s) {unknown}; valid: {sorted(valid)}")
        values = {k: v for k, v in merged.items() if v is not None}
        return dataclasses.replace(self, **values)


@dataclass
class TokenDelta:
    """New tokens of one sample of a streamed call: ``index`` is the sample's place in the call's
    Experiences (prompt-major: prompt ``index // n``, sample ``index % n``)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class StreamEnd:
    """The last item of a stream: the call's Experiences, prompt-major. Each one's response
    tokens are exactly the concatenated :class:`TokenDelta` tokens of its index."""

    experiences: list[Experience]


StreamItem = TokenDelta | StreamEnd


async def whole_sample_stream(
    sample: Callable[[], Awaitable[list[Experience]]],
) -> AsyncIterator[StreamItem]:
    """A stream of finished samples (``await sample()``): one :class:`TokenDelta` per
    Experience, then :class:`StreamEnd`."""
    done = await sample()
    for i, exp in enumerate(done):
        lps = exp.logprobs.tolist() if exp.logprobs is not None else []
        yield TokenDelta(i, exp.tokens[exp.prompt_length :].tolist(), lps)
    yield StreamEnd(done)


class RolloutEngine(ABC):
    """An inference backend. Subclasses implement :meth:`generate_tokens`, :meth:`logprobs`,
    :meth:`update_weights` and :meth:`load_checkpoint`; async twins default to a worker thread.
    """

    #: Whether :meth:`generate_tokens_stream` yields tokens as they are sampled (``False``: each
    #: sample whole, once finished).
    streams_tokens: bool = False
    #: Whether :meth:`pause_generation` / :meth:`resume_generation` interrupt and resume samples
    #: (partial rollouts, ``explorer.over_rollout.partial_rollout``).
    supports_partial_rollout: bool = False

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
        max_prompt_tokens: int | None = None,
        default_args: SamplingArgs | None = None,
        max_model_len: int | None = None,
        enable_prompt_truncation: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.enable_thinking = enable_thinking
        #: The token limits (see the module docstring); ``None``: no limit.
        self.max_prompt_tokens = max_prompt_tokens
        self.max_model_len = max_model_len
        self.enable_prompt_truncation = enable_prompt_truncation
        self.default_args = default_args or SamplingArgs()
        self._model_version = 0
        #: Prompts answered with masked placeholders (over ``max_prompt_tokens``) so far.
        self.prompts_masked = 0

    @property
    def model_version(self) -> int:
        """Version of the loaded weights (set by :meth:`update_weights` / :meth:`load_checkpoint`)."""
        return self._model_version

    # -- prompt building (shared) ----------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``: a generation prompt after a user turn, or a
        continuation of the final message when it is the assistant's.

        ``tools`` (OpenAI function definitions) are rendered by the template (templates with
        tool support, e.g. Qwen's, put them in the system prompt); ``chat_template_kwargs`` are
        further template variables, overriding ``enable_thinking`` for this call.
        """
        from trinity.multimodal import has_multi_modal_content

        if has_multi_modal_content(messages):
            # Engines that take images (the transformers engine) handle such chats before this.
            raise ValueError(
                f"{type(self).__name__} does not take images (vLLM's CPU build cannot serve Qwen2-VL "
                "here); use explorer.rollout_model.engine_type: transformers for chats with images"
            )
        kwargs: dict[str, Any] = {"tokenize": False, "chat_template": self.chat_template}
        if messages and messages[-1].get("role") == "assistant":
            kwargs["continue_final_message"] = True
        else:
            kwargs["add_generation_prompt"] = True
        if self.enable_thinking is not None:
            kwargs["enable_thinking"] = self.enable_thinking
        if tools:
            kwargs["tools"] = tools
        if chat_template_kwargs:
            kwargs.update(chat_template_kwargs)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def encode(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` (special tokens in the text are kept as such); the limits are
        applied by the calls that sample (see the module docstring)."""
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def sampling_args(self, **rollout_args: Any) -> SamplingArgs:
        """The engine defaults updated with ``rollout_args``."""
        return self.default_args.updated(rollout_args)

    def plan(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        *,
        whole_context: bool = False,
        strict_max_tokens: bool = False,
    ) -> tuple[dict[int, list[int]], list[int]]:
        """How the limits apply to one call: ``({max_tokens: prompt indices}, masked indices)``.

        Each prompt's ``max_tokens`` is ``args.max_tokens`` capped at what the prompt leaves of
        ``max_model_len``; prompts over ``max_prompt_tokens`` are masked (unless
        ``whole_context`` or ``enable_prompt_truncation`` is off). Raises :class:`PromptTooLong`
        for a prompt that leaves no token, and (``strict_max_tokens``: the OpenAI API, whose
        client asked for ``max_tokens``) for one that leaves fewer than ``args.max_tokens``.
        """
        runs: dict[int, list[int]] = {}
        masked: list[int] = []
        mask_over = not whole_context and self.enable_prompt_truncation and self.max_prompt_tokens is not None
        for i, ids in enumerate(prompts):
            if mask_over and len(ids) > self.max_prompt_tokens:  # type: ignore[operator]
                masked.append(i)
                continue
            cap = args.max_tokens
            if self.max_model_len is not None:
                room = self.max_model_len - len(ids)
                if room < 1:
                    raise PromptTooLong(len(ids), self.max_model_len)
                if strict_max_tokens and cap > room:
                    raise PromptTooLong(len(ids), self.max_model_len, cap)
                cap = min(cap, room)
            runs.setdefault(cap, []).append(i)
        return runs, masked

    @staticmethod
    def _capped(args: SamplingArgs, cap: int) -> SamplingArgs:
        if cap == args.max_tokens:
            return args
        return dataclasses.replace(args, max_tokens=cap, min_tokens=min(args.min_tokens, cap))

    def masked_experiences(self, ids: list[int], n: int) -> list[Experience]:
        """The ``n`` placeholders of a prompt over ``max_prompt_tokens``: its first
        ``max_prompt_tokens`` tokens as the prompt, the next one as a one-token response that
        no loss reads (all-zero ``action_mask``), as Trinity-RFT builds them."""
        import torch

        from trinity.experience import Experience

        keep = self.max_prompt_tokens or 0
        if self.prompts_masked == 0:
            logger.warning(
                "a prompt of %d tokens is over max_prompt_tokens (%d): its experiences are masked out "
                "of training (enable_prompt_truncation); later ones are counted, not logged",
                len(ids),
                keep,
            )
        self.prompts_masked += 1
        prompt_text = self.tokenizer.decode(ids[:keep])
        return [
            Experience(
                tokens=torch.tensor(ids[: keep + 1], dtype=torch.long),
                prompt_length=keep,
                logprobs=torch.zeros(1, dtype=torch.float32),
                action_mask=torch.zeros(1, dtype=torch.bool),
                prompt_text=prompt_text,
                response_text="",
                info={
                    "finish_reason": FINISH_LENGTH,
                    "truncate_status": PROMPT_TRUNCATED,
                    "prompt_tokens": len(ids),
                },
                model_version=self.model_version,
            )
            for _ in range(n)
        ]

    def _assemble(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        runs: dict[int, list[int]],
        results: list[list[list[Experience]]],
        masked: list[int],
    ) -> list[Experience]:
        groups: list[list[Experience]] = [[] for _ in prompts]
        for idxs, out in zip(runs.values(), results):
            for i, group in zip(idxs, out):
                groups[i] = group
        for i in masked:
            groups[i] = self.masked_experiences(prompts[i], args.n)
        return [exp for group in groups for exp in group]

    def generate_ids(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        *,
        whole_context: bool = False,
        strict_max_tokens: bool = False,
    ) -> list[Experience]:
        """Sample ``args.n`` continuations of each token-id prompt within the limits (see
        :meth:`plan`); Experiences are prompt-major."""
        runs, masked = self.plan(
            prompts, args, whole_context=whole_context, strict_max_tokens=strict_max_tokens
        )
        results = [
            self.generate_tokens([prompts[i] for i in idxs], self._capped(args, cap))
            for cap, idxs in runs.items()
        ]
        return self._assemble(prompts, args, runs, results, masked)

    async def generate_ids_async(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        *,
        whole_context: bool = False,
        strict_max_tokens: bool = False,
    ) -> list[Experience]:
        """Async twin of :meth:`generate_ids`."""
        runs, masked = self.plan(
            prompts, args, whole_context=whole_context, strict_max_tokens=strict_max_tokens
        )
        results = await asyncio.gather(
            *(
                self.generate_tokens_async([prompts[i] for i in idxs], self._capped(args, cap))
                for cap, idxs in runs.items()
            )
        )
        return self._assemble(prompts, args, runs, list(results), masked)

    def generate(
        self, prompts: list[str], *, whole_context: bool = False, **rollout_args: Any
    ) -> list[Experience]:
        """Sample ``n`` continuations of each raw prompt; Experiences are prompt-major.

        ``whole_context``: the OpenAI API's rules, as vLLM's server applies them: only
        ``max_model_len`` limits the prompt, and a ``max_tokens`` given here that the prompt
        leaves no room for is refused (:class:`PromptTooLong`) rather than capped.
        """
        args = self.sampling_args(**rollout_args)
        return self.generate_ids(
            [self.encode(p) for p in prompts],
            args,
            whole_context=whole_context,
            strict_max_tokens=refuses_max_tokens(whole_context, rollout_args),
        )

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Sample ``n`` replies to a chat (the chat template is applied first, see
        :meth:`apply_chat_template`)."""
        prompt = self.apply_chat_template(messages, tools, chat_template_kwargs)
        return self.generate([prompt], whole_context=whole_context, **rollout_args)

    async def generate_async(
        self, prompts: list[str], *, whole_context: bool = False, **rollout_args: Any
    ) -> list[Experience]:
        """Async twin of :meth:`generate`."""
        args = self.sampling_args(**rollout_args)
        if sum(map(len, prompts)) > _LONG_TEXT:  # keep the event loop free for other calls
            ids = await asyncio.to_thread(lambda: [self.encode(p) for p in prompts])
        else:
            ids = [self.encode(p) for p in prompts]
        return await self.generate_ids_async(
            ids,
            args,
            whole_context=whole_context,
            strict_max_tokens=refuses_max_tokens(whole_context, rollout_args),
        )

    async def chat_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Async twin of :meth:`chat`."""
        prompt = self.apply_chat_template(messages, tools, chat_template_kwargs)
        return await self.generate_async([prompt], whole_context=whole_context, **rollout_args)

    def generate_stream_async(
        self, prompts: list[str], *, whole_context: bool = False, **rollout_args: Any
    ) -> AsyncIterator[StreamItem]:
        """Streaming twin of :meth:`generate_async` (see the module docstring). The arguments are
        checked, the prompts encoded and the limits applied now (:class:`PromptTooLong` is raised
        here); the sampling starts with the first ``__anext__``. A call whose prompts get
        different ``max_tokens`` caps, or that masks a prompt, streams each sample whole."""
        args = self.sampling_args(**rollout_args)
        ids = [self.encode(p) for p in prompts]
        strict = refuses_max_tokens(whole_context, rollout_args)
        runs, masked = self.plan(ids, args, whole_context=whole_context, strict_max_tokens=strict)
        if len(runs) == 1 and not masked:
            (cap,) = runs
            return self.generate_tokens_stream(ids, self._capped(args, cap))
        return whole_sample_stream(
            lambda: self.generate_ids_async(ids, args, whole_context=whole_context, strict_max_tokens=strict)
        )

    def chat_stream_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> AsyncIterator[StreamItem]:
        """Streaming twin of :meth:`chat_async` (the template is applied now)."""
        prompt = self.apply_chat_template(messages, tools, chat_template_kwargs)
        return self.generate_stream_async([prompt], whole_context=whole_context, **rollout_args)

    # -- backend ---------------------------------------------------------------------------

    @abstractmethod
    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Experience]]:
        """For each prompt (token ids), ``args.n`` Experiences."""

    async def generate_tokens_async(
        self, prompts: list[list[int]], args: SamplingArgs
    ) -> list[list[Experience]]:
        """Async twin of :meth:`generate_tokens` (default: a worker thread)."""
        return await asyncio.to_thread(self.generate_tokens, prompts, args)

    def generate_tokens_stream(
        self, prompts: list[list[int]], args: SamplingArgs
    ) -> AsyncIterator[StreamItem]:
        """Streaming twin of :meth:`generate_tokens_async`: :class:`TokenDelta` items, then one
        :class:`StreamEnd`. Default: each sample whole once the call is done (engines that
        sample token by token override it and set ``streams_tokens``)."""

        async def sample() -> list[Experience]:
            groups = await self.generate_tokens_async(prompts, args)
            return [exp for group in groups for exp in group]

        return whole_sample_stream(sample)

    @abstractmethod
    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Float32 tensor ``(len(tokens) - 1,)``: logprob of ``tokens[i]`` given ``tokens[:i]``
        for ``i >= 1``, at ``temperature``."""

    async def logprobs_async(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Async twin of :meth:`logprobs`."""
        return await asyncio.to_thread(self.logprobs, tokens, temperature)

    @abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights in place (names as in the model's ``state_dict``) and set the version."""

    @abstractmethod
    def load_checkpoint(self, path: str, version: int) -> None:
        """Load weights from a Hugging Face checkpoint folder and set the version."""

    # -- broadcast weight sync (``synchronizer.sync_method: nccl``) ---------------------------

    def weight_sync_devices(self) -> list[str]:
        """One entry per rank this engine puts into the weight-sync group: ``"cpu"`` or
        ``"cuda:<uuid>"`` (see :func:`trinity.sync.group.describe_device`)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot join a weight-sync group (synchronizer.sync_method 'nccl'); "
            "use sync_method 'memory' or 'checkpoint'"
        )

    def init_weight_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Join the group ``spec`` describes as ranks ``rank_offset ..`` (blocks until every
        rank has joined); each rank holds a :class:`trinity.sync.broadcast.WeightReceiver`."""
        raise NotImplementedError(f"{type(self).__name__} cannot join a weight-sync group")

    def receive_weights(self, metas: list[Any], version: int) -> None:
        """Receive one broadcast of the trainer's weights (``metas`` in wire form), load them in
        place and set the version."""
        raise NotImplementedError(f"{type(self).__name__} cannot join a weight-sync group")

    def pause_generation(self) -> None:
        """A sync point (partial rollouts): samples being generated stop after their current
        token and wait, keeping their tokens, until :meth:`resume_generation`; they then go on
        from those tokens with the weights loaded by then. Engines with
        ``supports_partial_rollout`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot pause and resume its samples")

    def resume_generation(self) -> None:  # noqa: B027 - nothing paused by default
        """Let the samples :meth:`pause_generation` stopped go on (with the current weights)."""

    def close_weight_group(self) -> None:  # noqa: B027 - nothing to close by default
        """Leave the weight-sync group (a later stage builds a new one)."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the engine's resources."""


def finish_point(
    token_ids: list[int], eos_ids: set[int], stop: list[str], decode: Any
) -> tuple[int, str, str]:
    """Where a sampled response ends: ``(n_tokens, finish_reason, text)``.

    The response ends after the first EOS token (kept in the tokens, dropped from the text), or
    after the token that completes the first stop string (the text is cut before the stop
    string, as vLLM does); otherwise it runs to the end with reason ``"length"``.
    """
    end, reason = len(token_ids), FINISH_LENGTH
    for i, tok in enumerate(token_ids):
        if tok in eos_ids:
            end, reason = i + 1, FINISH_STOP
            break
    if stop:
        # Decode growing prefixes: a stop string may span several tokens.
        for i in range(1, end + 1):
            text = decode(token_ids[:i])
            hits = [text.find(s) for s in stop if s in text]
            if hits:
                return i, FINISH_STOP, text[: min(hits)]
    text = decode(token_ids[: end - 1] if reason == FINISH_STOP else token_ids[:end])
    return end, reason, text
