"""The ``transformers`` rollout engine: a local Hugging Face model, on CPU or GPU.

Generation is batched (all prompts x ``n`` samples in one batch, left padded). Each prompt's
prefill runs once for its ``n`` samples (:meth:`TransformersEngine._prompt_cache`), then the
engine's own loop (:func:`~trinity.rollout.decoding.decode_rows`) samples and drops
rows from the batch as they finish; calls with stop strings, and models whose cache cannot drop
rows, go through ``model.generate`` with the same sampler and recorder, and sample the same
tokens. For Llama and Qwen2 models the loop's one-token steps skip transformers' forward and
run the same arithmetic on the model's parameters (:mod:`.lean_decoding`: a third less time a
step on the quickstart's model; the logits agree to float round-off, checked when the model
loads); ``lean_decoding=False`` (``enforce_eager: true`` in the config) turns it off. The logprob of each sampled token is taken from the logits of the very forward pass
that sampled it, divided by the sampling temperature, so it equals a separate forward pass over
the finished sequence up to float round-off.

The engine is put together from its concerns: the batching scheduler
(:mod:`.transformers_batching`), decoding (:mod:`.transformers_generate`, with per-row sampling
and step recording in :mod:`.sampling`) and weight loading (:mod:`.transformers_weights`); this
module holds the model, its compute thread and scoring.

One batch ("a ``generate``" below) runs at a time (a lock): the model is not re-entrant. The
engine's torch work runs on one long-lived thread per device, whichever thread calls (see
:meth:`TransformersEngine._on_compute_thread`): one OpenMP team for the process. Concurrent calls are
batched together instead of queueing one by one: calls that arrive while a ``generate`` runs
wait in a queue, and the next ``generate`` takes every queued call with the same sampling
arguments but the seed (up to ``max_batch_size`` sequences). The workflow runners of one
explorer step (each asking for ``n`` samples of its own task) thus share a handful of
``generate`` calls, as they would share vLLM's continuous batching.

The runners say when they start and end a task on the engine (:meth:`TransformersEngine.caller`).
A ``generate`` about to start waits, at most ``batch_wait`` seconds, until each of those tasks
has a call queued, and stops waiting once no new call came for ``batch_gap`` seconds (a task
busy elsewhere, in its environment or its reward, does not hold the others up). Without this,
the first runner to call started alone and the fifteen others queued behind its ``generate``:
two ``generate`` calls per explorer step instead of one (measured in the quickstart: a batch of
8 rows, 0.08-0.1 s, then one of 120, 0.3 s). Calls from outside a runner (the OpenAI server,
tests) never wait for anyone.

Every sampled row draws from a random generator of its own, seeded from its call's ``seed``
and its place in the call (:class:`RowSampler`), as vLLM seeds each request: a call's samples
depend on its seed only, never on what else shared the batch. Calls without a seed take one
from the engine's seeded stream.

Streaming (:meth:`TransformersEngine.generate_tokens_stream`): every batch runs with a
:class:`StepRecorder`, which gets each step's sampled tokens and their logprobs for the whole
batch (:meth:`StepRecorder.record`; under ``generate`` it is also a logits processor that sees
each step's raw logits first, before min-tokens and sampling, and the streamer). It keeps each
row's logprobs step by step (the Experiences take theirs from it, streamed or not) and hands
each row of a streamed call its new token as it is sampled, until the row ends (EOS, a stop
string, as :func:`~trinity.rollout.base.finish_point` decides; the padding of finished
rows is never streamed). A streamed call shares batches like any other and samples exactly what
the same call without streaming samples. Closing its stream early cancels it: a queued call is
dropped, a running one's rows stop after the current step (the loop checks
:meth:`StepRecorder.cancelled_rows` after each step; under ``generate`` a stopping criterion
does), and nothing is returned.

Partial rollouts (:meth:`TransformersEngine.pause_generation`, a sync point of
``explorer.over_rollout.partial_rollout``): the rows of a running batch that nobody streams stop
after the current step, keeping their tokens and logprobs; each such sample waits until
:meth:`TransformersEngine.resume_generation` and then goes on from its prompt and those tokens
(:meth:`TransformersEngine.continue_sample`) with the weights loaded by then, for the tokens its
``max_tokens`` has left. The caller gets one Experience whose tokens keep the logprobs and the
model version they were sampled with (``Experience.token_versions``). Calls that arrive while
the engine is paused wait; streamed calls and calls with stop strings (transformers'
``generate`` path) run to their end.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.rollout.base import FINISH_INTERRUPTED, FINISH_STOP, RolloutEngine, SamplingArgs
from trinity.rollout.sampling import RowSampler, StepRecorder, row_seeds
from trinity.rollout.transformers_batching import BatchScheduler, CallCancelled, QueuedCall
from trinity.rollout.transformers_generate import Generation
from trinity.rollout.transformers_mm import MultiModalChat
from trinity.rollout.transformers_weights import WeightLoading
from trinity.sync.broadcast import WeightReceiver

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

__all__ = [
    "CallCancelled",
    "QueuedCall",
    "RowSampler",
    "StepRecorder",
    "TransformersEngine",
    "resolve_dtype",
    "row_seeds",
]

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}  # fmt: skip


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``"auto"`` is bfloat16 on GPU and float32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return getattr(torch, _DTYPES[dtype])


_COMPUTE_THREADS: dict[str, tuple[concurrent.futures.ThreadPoolExecutor, int]] = {}
_COMPUTE_THREADS_LOCK = threading.Lock()


def _compute_thread(device: str) -> tuple[concurrent.futures.ThreadPoolExecutor, int]:
    """The process's compute thread for ``device`` (its executor and thread id): engines on
    one device share it, as they would share the device."""
    with _COMPUTE_THREADS_LOCK:
        if device not in _COMPUTE_THREADS:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"trinity-engine-{device}")
            _COMPUTE_THREADS[device] = (pool, pool.submit(threading.get_ident).result())
        return _COMPUTE_THREADS[device]


class TransformersEngine(MultiModalChat, BatchScheduler, Generation, WeightLoading, RolloutEngine):
    """Rollouts with a local ``transformers`` model; streams tokens as they are sampled.

    Args:
        model_path: Hugging Face model folder (or hub id already in the local cache).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default: CUDA when available.
        seed: seeds calls that give no ``seed`` of their own (then sampling continues one
            random stream, so repeated calls differ).
        max_batch_size: most sequences (prompts x n) per ``generate`` call.
        batch_wait: most seconds a ``generate`` waits for the calls of the other runner tasks
            on this engine (0: never waits); ``batch_gap``: it stops waiting once no call came
            for this long.
        lean_decoding: run the decoding steps of covered models (Llama, Qwen2) with
            :class:`~trinity.rollout.lean_decoding.LeanDecoder` rather than
            transformers' forward.
        Other arguments: see :class:`RolloutEngine`.
    """

    streams_tokens = True
    supports_partial_rollout = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        device: str | None = None,
        seed: int = 42,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
        max_prompt_tokens: int | None = None,
        default_args: SamplingArgs | None = None,
        max_model_len: int | None = None,
        enable_prompt_truncation: bool = True,
        max_batch_size: int = 256,
        batch_wait: float = 0.05,
        batch_gap: float = 0.01,
        trust_remote_code: bool = False,
        lean_decoding: bool = True,
    ) -> None:
        from transformers import AutoTokenizer

        from trinity.multimodal import auto_model_class

        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        super().__init__(
            tokenizer,
            chat_template=chat_template,
            enable_thinking=enable_thinking,
            max_prompt_tokens=max_prompt_tokens,
            default_args=default_args,
            max_model_len=max_model_len,
            enable_prompt_truncation=enable_prompt_truncation,
        )
        self.model_path = model_path
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = resolve_dtype(dtype, self.device)
        # The engine's torch work (loading, generating, scoring, weight updates) runs on one
        # long-lived thread per device, whichever thread asks for it. The explorer's runner
        # tasks run in threads of their own, a new one per task: each thread that runs torch
        # operators gets an OpenMP thread team of its own, and once the process has more
        # such threads than cores, OpenMP's workers stop spinning between operators and every
        # operator waits for them to wake up. A decoding step of the quickstart's model took
        # 2.6 ms from a second thread against 1.3 ms when one thread runs them all.
        self._compute_thread, self._compute_ident = _compute_thread(self.device)

        def load() -> Any:
            # Vision-language checkpoints (Qwen2-VL) load with AutoModelForImageTextToText; chats
            # with images go through MultiModalChat (see trinity.rollout.transformers_mm).
            model_class = auto_model_class(model_path, trust_remote_code)
            model = model_class.from_pretrained(
                model_path, dtype=self.dtype, trust_remote_code=trust_remote_code
            ).to(self.device)
            return model.eval()

        self.model = self._on_compute_thread(load)
        self._init_scheduler(max_batch_size, batch_wait, batch_gap, seed)
        # Partial rollouts: set while paused (running rows stop); ``_resumed`` is clear then.
        self._interrupt = threading.Event()
        self._resumed = threading.Event()
        self._resumed.set()
        #: Samples stopped at a sync point and continued after it, so far.
        self.samples_resumed = 0
        #: Prefill each prompt once for its ``n`` samples (see :meth:`_prompt_cache`).
        self.share_prefill = True
        #: Sample with :func:`~trinity.rollout.decoding.decode_rows` (drops finished
        #: rows) rather than ``generate``, except for stop strings.
        self.own_loop = True
        #: Runs the sampling loop's one-token steps without transformers' forward (Llama and
        #: Qwen2 models that pass its load-time check; see :mod:`.lean_decoding`), or ``None``.
        self.lean = self._on_compute_thread(self._lean_decoder) if lean_decoding else None
        # Its rank of the trainer's weight-sync group (sync_method nccl).
        self._weight_receiver = WeightReceiver("receive_weights: this engine")

        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None:
            eos.append(tokenizer.eos_token_id)
        if not eos:
            raise ValueError(
                f"{model_path}: neither the generation config nor the tokenizer names an EOS token"
            )
        self.eos_token_ids = sorted(set(eos))
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        )

    # -- partial rollouts ------------------------------------------------------------------

    def pause_generation(self) -> None:
        self._resumed.clear()
        self._interrupt.set()

    def resume_generation(self) -> None:
        self._interrupt.clear()  # first: continuations must not be stopped again at once
        self._resumed.set()

    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Any]]:
        self._resumed.wait()  # nothing starts on weights that are about to be replaced
        groups = super().generate_tokens(prompts, args)
        for prompt, group in zip(prompts, groups):
            for k, exp in enumerate(group):
                while exp.info.get("finish_reason") == FINISH_INTERRUPTED:
                    exp = self.continue_sample(prompt, exp, args)
                group[k] = exp
        return groups

    def continue_sample(self, prompt: list[int], partial: Any, args: SamplingArgs) -> Any:
        """``partial`` (a sample of ``prompt`` stopped at a sync point) continued from its tokens
        once the engine is resumed, with the weights loaded then: one Experience with all its
        tokens, each with the logprob and the model version (``token_versions``) it was sampled
        with; it may itself be interrupted again (``finish_reason``)."""
        import torch

        from trinity.experience import Experience

        done = partial.response_length
        self._resumed.wait()
        rest = dataclasses.replace(
            args,
            n=1,
            max_tokens=args.max_tokens - done,
            min_tokens=max(0, args.min_tokens - done),
            # A seeded call stays reproducible: its continuation's seed follows from it.
            seed=None if args.seed is None else (args.seed * 1_000_003 + done) % 2**62,
        )
        prefix = partial.tokens.tolist()
        (tail,) = super().generate_tokens([prefix], rest)[0]
        versions = partial.token_versions
        if versions is None:
            versions = torch.full((done,), partial.model_version, dtype=torch.long)
        new = tail.response_length
        ids = tail.tokens[len(prompt) :].tolist()
        self.samples_resumed += 1
        return Experience(
            tokens=tail.tokens,
            prompt_length=len(prompt),
            logprobs=torch.cat([partial.logprobs, tail.logprobs]),
            prompt_text=partial.prompt_text,
            response_text=self._decode(ids[:-1] if tail.info.get("finish_reason") == FINISH_STOP else ids),
            info={**tail.info, "resumed": partial.info.get("resumed", 0) + 1},
            model_version=tail.model_version,
            token_versions=torch.cat([versions, torch.full((new,), tail.model_version, dtype=torch.long)]),
        )

    # -- scoring ---------------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        if len(tokens) < 2:
            return torch.zeros(0, dtype=torch.float32)
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(0)

        def score() -> torch.Tensor:
            logits = self.model(input_ids=ids).logits[0, :-1].float()
            return (
                torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
            )

        with self._lock:
            return self._on_compute_thread(score)

    def _on_compute_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run on the engine's compute thread (see ``__init__``); its result or
        its exception."""
        if threading.get_ident() == self._compute_ident:
            return fn(*args)
        return self._compute_thread.submit(fn, *args).result()
