"""The ``transformers`` rollout engine: a local Hugging Face model, on CPU or GPU.

Generation is batched (all prompts x ``n`` samples in one batch, left padded). Each prompt's
prefill runs once for its ``n`` samples (:meth:`TransformersEngine._prompt_cache`), then the
engine's own loop (:func:`~trinity.explorer.engines.decoding.decode_rows`) samples and drops
rows from the batch as they finish; calls with stop strings, and models whose cache cannot drop
rows, go through ``model.generate`` with the same sampler and recorder, and sample the same
tokens. For Llama and Qwen2 models the loop's one-token steps skip transformers' forward and
run the same arithmetic on the model's parameters (:mod:`.lean_decoding`: a third less time a
step on the quickstart's model; the logits agree to float round-off, checked when the model
loads); ``lean_decoding=False`` (``enforce_eager: true`` in the config) turns it off. The logprob of each sampled token is taken from the logits of the very forward pass
that sampled it, divided by the sampling temperature, so it equals a separate forward pass over
the finished sequence up to float round-off.

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
string, as :func:`~trinity.explorer.engines.base.finish_point` decides; the padding of finished
rows is never streamed). A streamed call shares batches like any other and samples exactly what
the same call without streaming samples. Closing its stream early cancels it: a queued call is
dropped, a running one's rows stop after the current step (the loop checks
:meth:`StepRecorder.cancelled_rows` after each step; under ``generate`` a stopping criterion
does), and nothing is returned.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity._lazy import lazy_import
from trinity.explorer.engines.base import (
    RolloutEngine,
    SamplingArgs,
    StreamEnd,
    StreamItem,
    TokenDelta,
    finish_point,
)
from trinity.explorer.engines.decoding import RowsCannotBeDropped, decode_rows
from trinity.explorer.engines.lean_decoding import LeanDecoder, LogitsDiffer, NotCovered
from trinity.sync.broadcast import WeightReceiver, parse_metas
from trinity.sync.group import describe_device
from trinity.trainer.batch import position_ids_from_mask

if TYPE_CHECKING:
    import torch

    from trinity.sync.group import GroupSpec
else:
    torch = lazy_import("torch")

logger = logging.getLogger(__name__)

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}  # fmt: skip


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``"auto"`` is bfloat16 on GPU and float32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return getattr(torch, _DTYPES[dtype])


class RowSampler:
    """Logits processor that samples each row with its own ``torch.Generator``.

    ``generate`` then runs greedy search over the processor's output, which is 0 for the
    sampled token and -inf elsewhere, so the sample is the processor's. Temperature, top-k and
    top-p are applied here; ``generate``'s own processors (min-new-tokens) run before it.
    """

    def __init__(
        self, seeds: list[int], temperature: float, top_k: int, top_p: float, max_steps: int = 1
    ) -> None:
        # Every row's uniform draws for the whole generation, made up front: one generator call
        # per row instead of one per row and step.
        self.uniforms = torch.stack(
            [
                torch.rand(max_steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                for s in seeds
            ]
        )
        self.step = 0
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        picks = self.pick(scores, step=self.step)
        self.step += 1
        return torch.full_like(scores, float("-inf")).scatter_(-1, picks.unsqueeze(-1), 0.0)

    def pick(self, scores: torch.Tensor, rows: torch.Tensor | None = None, step: int = 0) -> torch.Tensor:
        """The sampled token ``(L,)`` of each row of ``scores`` ``(L, V)`` at decoding ``step``;
        ``rows`` ``(L,)``: which rows of the batch they are (default: all, in order)."""
        if step >= self.uniforms.shape[1]:
            raise RuntimeError(f"RowSampler was made for {self.uniforms.shape[1]} steps")
        if self.uniforms.device != scores.device:  # once: the draws live where the logits do
            self.uniforms = self.uniforms.to(scores.device)
        draws = self.uniforms[:, step : step + 1]
        if rows is not None:
            draws = draws[rows]
        logits = scores.float() / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = (sorted_probs.cumsum(-1) - sorted_probs) >= self.top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        # Invert each row's CDF at its draw (float64: exact enough for a 150k vocabulary).
        cdf = probs.double().cumsum_(-1)
        # right=True: a draw of exactly 0 lands on the first token with positive probability.
        picks = torch.searchsorted(cdf, draws * cdf[:, -1:], right=True).clamp_(max=cdf.shape[-1] - 1)
        return picks.squeeze(-1)


def _greedy(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


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


def row_seeds(seed: int, prompts: int, n: int) -> list[int]:
    """The seed of each of ``prompts x n`` rows of a call with ``seed`` (prompt-major)."""
    return [(seed * 1_000_003 + row) % (2**63) for row in range(prompts * n)]


class CallCancelled(Exception):
    """A streamed call whose stream was closed before it finished."""


#: ``sink(sample_index, token_ids, logprobs)``: new tokens of one sample of a streamed call.
Sink = Callable[[int, list[int], list[float]], None]


@dataclass(eq=False)
class _Call:
    """One queued ``generate_tokens`` call, answered by whichever thread runs its batch.

    A streamed call has a ``sink`` (called from the thread running the batch) and is
    ``cancelled`` when its stream is closed before the end.
    """

    prompts: list[list[int]]
    args: SamplingArgs
    sink: Sink | None = None
    cancelled: bool = False
    result: list[list[Any]] | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class StepRecorder:
    """The per-step side of one ``generate``: logprobs of every row, tokens to streamed calls.

    ``generate`` uses it three ways: as the first logits processor (it keeps the step's
    log-softmax of the raw logits at the logprob temperature, before any other processor), as
    the streamer (``put`` gets the step's sampled tokens, one per row: the logprob of each is
    gathered, and each live row of a streamed call hands its token to the call's sink), and,
    when a call of the batch streams, as a stopping criterion (:meth:`stop_cancelled`).

    Args:
        rows: per row of the batch, ``(call, sample index in the call)``.
        temperature: the logprob temperature.
        eos: EOS token ids; stop: stop strings; decode: ids -> text (for stop strings).
        on_step: called with the recorder after each step's tokens were handed out.
    """

    def __init__(
        self,
        rows: list[tuple[_Call, int]],
        temperature: float,
        eos: set[int],
        stop: list[str],
        decode: Callable[[list[int]], str],
        on_step: Callable[[StepRecorder], None] | None = None,
    ) -> None:
        self.rows = rows
        self.temperature = temperature
        self.eos, self.stop, self.decode, self.on_step = eos, stop, decode, on_step
        self._pending: collections.deque[torch.Tensor] = collections.deque()
        self._steps: list[torch.Tensor] = []
        self._prompt_seen = False
        # Streamed rows still producing tokens, with what they produced so far.
        self._live = {r: [] for r, (call, _) in enumerate(rows) if call.sink is not None}
        self.streams = bool(self._live)

    # logits processor
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._pending.append(torch.log_softmax(scores.float() / self.temperature, dim=-1))
        return scores

    # stopping criterion
    def stop_cancelled(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """True for the rows of cancelled calls: ``generate`` pads them from now on, and stops
        when no other row is left."""
        return self.cancelled_rows().to(input_ids.device)

    # streamer
    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompts
            self._prompt_seen = True
            return
        logprobs = self._pending.popleft()
        self.record(value.view(-1), logprobs.gather(-1, value.to(logprobs.device).view(-1, 1)).squeeze(-1))

    def record(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """One decoding step: each row's token ``(B,)`` and its log-probability ``(B,)``."""
        self._steps.append(logprobs)
        if self._live:
            self._hand_out(tokens.tolist(), logprobs.tolist())
        if self.on_step is not None:
            self.on_step(self)

    def cancelled_rows(self) -> torch.Tensor:
        """``(B,)`` bool: rows of cancelled calls."""
        return torch.tensor([call.cancelled for call, _ in self.rows], dtype=torch.bool)

    def end(self) -> None:
        pass

    @property
    def steps(self) -> int:
        """Decoding steps done."""
        return len(self._steps)

    def _hand_out(self, tokens: list[int], logprobs: list[float]) -> None:
        for row in list(self._live):
            call, index = self.rows[row]
            if call.cancelled:
                del self._live[row]
                continue
            ids = self._live[row]
            ids.append(tokens[row])
            # The row ends where finish_point ends it: the token completing a stop string, or EOS.
            if tokens[row] in self.eos or (self.stop and any(s in self.decode(ids) for s in self.stop)):
                del self._live[row]
            assert call.sink is not None
            call.sink(index, [tokens[row]], [logprobs[row]])

    def logprobs(self) -> torch.Tensor:
        """``(rows, steps)`` float32 on the CPU: the logprob of each sampled token."""
        if not self._steps:
            return torch.zeros((len(self.rows), 0), dtype=torch.float32)
        return torch.stack(self._steps, dim=1).cpu()


class TransformersEngine(RolloutEngine):
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
            :class:`~trinity.explorer.engines.lean_decoding.LeanDecoder` rather than
            transformers' forward.
        Other arguments: see :class:`RolloutEngine`.
    """

    streams_tokens = True

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
        from transformers import AutoModelForCausalLM, AutoTokenizer

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
            model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=self.dtype, trust_remote_code=trust_remote_code
            ).to(self.device)
            return model.eval()

        self.model = self._on_compute_thread(load)
        self.max_batch_size = max_batch_size
        #: Prefill each prompt once for its ``n`` samples (see :meth:`_prompt_cache`).
        self.share_prefill = True
        #: Sample with :func:`~trinity.explorer.engines.decoding.decode_rows` (drops finished
        #: rows) rather than ``generate``, except for stop strings.
        self.own_loop = True
        #: Runs the sampling loop's one-token steps without transformers' forward (Llama and
        #: Qwen2 models that pass its load-time check; see :mod:`.lean_decoding`), or ``None``.
        self.lean = self._on_compute_thread(self._lean_decoder) if lean_decoding else None
        self._lock = threading.Lock()  # held while the model generates
        self._queue_lock = threading.Lock()  # guards _queue
        self._queue: list[_Call] = []
        # Notified when a call is queued or a runner task ends (see _gather).
        self._arrival = threading.Condition(self._queue_lock)
        self._callers = 0  # runner tasks using the engine now (caller())
        self.batch_wait, self.batch_gap = batch_wait, batch_gap
        #: ``generate`` batches run and calls they answered (see :meth:`generate_tokens`).
        self.batches_run = 0
        self.calls_batched = 0
        #: streamed calls dropped or stopped because their stream was closed early.
        self.calls_cancelled = 0
        #: Seconds spent generating batches so far (the explorer reports it per step).
        self.generate_seconds = 0.0
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)
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

    # -- generation ------------------------------------------------------------------------

    @contextlib.contextmanager
    def caller(self) -> Any:
        """Marks one runner task using the engine while the block runs: ``generate`` waits a
        little for the calls of such tasks so that one batch serves them all."""
        with self._arrival:
            self._callers += 1
        try:
            yield
        finally:
            with self._arrival:
                self._callers -= 1
                self._arrival.notify_all()

    def _gather(self) -> None:
        """Under ``_lock``, before a batch is taken: wait for the other runner tasks' calls."""
        if self.batch_wait <= 0:
            return
        now = time.monotonic()
        deadline = now + self.batch_wait
        with self._arrival:
            seen, last = len(self._queue), now
            while len(self._queue) < self._callers:
                now = time.monotonic()
                wake = min(deadline, last + self.batch_gap)
                if now >= wake:
                    return
                self._arrival.wait(wake - now)
                if len(self._queue) != seen:
                    seen, last = len(self._queue), time.monotonic()

    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Any]]:
        return self._serve(_Call(self._checked(prompts), args))

    @staticmethod
    def _checked(prompts: list[list[int]]) -> list[list[int]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot generate from an empty prompt (0 tokens)")
        return prompts

    def _serve(self, call: _Call) -> list[list[Any]]:
        """Queue ``call`` and wait for its answer (running its batch if nobody took it)."""
        with self._arrival:
            self._queue.append(call)
            self._arrival.notify_all()
        with self._lock:
            if not call.done:  # nobody took it while we waited: run it, and whatever matches it
                self._run_batch(call)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    async def generate_tokens_stream(
        self, prompts: list[list[int]], args: SamplingArgs
    ) -> AsyncIterator[StreamItem]:
        """Each step's tokens of each sample as they are sampled, then the Experiences (see the
        module docstring). Closing the iterator early cancels the call."""
        self._checked(prompts)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[StreamItem | BaseException] = asyncio.Queue()

        def push(item: StreamItem | BaseException) -> None:  # from the thread running the batch
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
                loop.call_soon_threadsafe(items.put_nowait, item)

        call = _Call(prompts, args, sink=lambda i, ids, lps: push(TokenDelta(i, ids, lps)))

        def serve() -> None:
            try:
                push(StreamEnd([exp for group in self._serve(call) for exp in group]))
            except BaseException as exc:  # handed to the stream's reader
                push(exc)

        loop.run_in_executor(None, serve)
        finished = False
        try:
            while True:
                item = await items.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if isinstance(item, StreamEnd):
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:  # closed early (a client went away): stop sampling for it
                call.cancelled = True

    def _run_batch(self, leader: _Call) -> None:
        """Under ``_lock``: one ``generate`` for ``leader`` and the queued calls with its args."""
        self._gather()
        shape = dataclasses.replace(leader.args, seed=None)
        budget = max(self.max_batch_size, len(leader.prompts) * leader.args.n)
        with self._queue_lock:
            batch, rest, size = [], [], 0
            for call in self._queue:
                if call.cancelled:
                    self._cancel(call)
                    continue
                fits = size + len(call.prompts) * call.args.n <= budget
                if call is leader or (fits and dataclasses.replace(call.args, seed=None) == shape):
                    batch.append(call)
                    size += len(call.prompts) * call.args.n
                else:
                    rest.append(call)
            self._queue = rest
        if not batch:  # the leader was cancelled while it waited
            return
        try:
            seeds: list[int] = []
            owners: list[tuple[_Call, int]] = []
            for call in batch:
                seed = call.args.seed
                if seed is None:  # the engine's stream, in the order calls are served
                    seed = int(torch.randint(2**62, (1,), generator=self._generator))
                seeds.extend(row_seeds(seed, len(call.prompts), call.args.n))
                owners.extend((call, i) for i in range(len(call.prompts)))
            started = time.perf_counter()
            try:
                prompts = [p for call in batch for p in call.prompts]
                groups = self._on_compute_thread(self._generate, prompts, shape, seeds, owners)
            finally:
                self.generate_seconds += time.perf_counter() - started
        except BaseException as exc:  # every caller of the batch sees the failure
            for call in batch:
                call.error = exc
            return
        start = 0
        for call in batch:
            if call.cancelled:
                self._cancel(call)
            else:
                call.result = groups[start : start + len(call.prompts)]
            start += len(call.prompts)
        self.batches_run += 1
        self.calls_batched += len(batch)

    def _cancel(self, call: _Call) -> None:
        call.error = CallCancelled("the call was cancelled (its stream was closed)")
        self.calls_cancelled += 1

    def _generate(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        seeds: list[int],
        owners: list[tuple[_Call, int]],
    ) -> list[list[Any]]:
        """Under ``_lock``: ``args.n`` samples of each prompt, ``max_batch_size`` sequences a go;
        ``seeds`` has one seed per sampled row (prompt-major); ``owners`` names each prompt's
        call and its place in the call."""
        per_call = max(1, self.max_batch_size // args.n)
        groups: list[list[Any]] = []
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start : start + per_call]
            chunk_seeds = seeds[start * args.n : (start + len(chunk)) * args.n]
            chunk_owners = owners[start : start + len(chunk)]
            if all(call.cancelled for call, _ in chunk_owners):  # nobody wants these any more
                groups.extend([[] for _ in chunk])
                continue
            groups.extend(self._generate_chunk(chunk, args, chunk_seeds, chunk_owners))
        return groups

    @torch.no_grad()
    def _generate_chunk(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        seeds: list[int],
        owners: list[tuple[_Call, int]] | None = None,
    ) -> list[list[Any]]:
        from trinity.experience import Experience

        # One row per sample, prompt-major (row = prompt * n + k): one sequence per input row.
        rows = [ids for ids in prompts for _ in range(args.n)]
        width = max(len(p) for p in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, ids in enumerate(rows):  # left padding: every prompt ends at column width-1
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1

        if owners is None:  # a chunk nobody streams
            owners = [(_Call(prompts, args), i) for i in range(len(prompts))]
        eos = set(self.eos_token_ids)
        recorder = StepRecorder(
            [(call, i * args.n + k) for call, i in owners for k in range(args.n)],
            args.logprob_temperature,
            eos,
            args.stop,
            self._decode,
            self._on_step,
        )
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        cache = self._prompt_cache(input_ids, attention_mask, args.n)
        sampler = (
            RowSampler(seeds, args.temperature, args.top_k, args.top_p, args.max_tokens)
            if args.temperature != 0
            else None
        )
        responses = None
        if self.own_loop and not args.stop:
            try:
                responses = decode_rows(
                    self.model,
                    input_ids,
                    attention_mask,
                    max_new_tokens=args.max_tokens,
                    eos_token_ids=self.eos_token_ids,
                    choose=sampler.pick if sampler is not None else _greedy,
                    record=recorder.record,
                    logprob_temperature=args.logprob_temperature,
                    min_tokens=args.min_tokens,
                    cancelled=recorder.cancelled_rows if recorder.streams else None,
                    pad_token_id=self.pad_token_id,
                    cache=cache,
                    lean=self.lean,
                )
            except RowsCannotBeDropped as exc:
                self.own_loop = False
                logger.warning(
                    "%s: the engine's sampling loop cannot drop finished rows (%s); using "
                    "transformers' generate from now on",
                    type(self.model).__name__,
                    exc,
                )
                # decode_rows' first pass extended the prompt cache: build it again.
                cache = self._prompt_cache(input_ids, attention_mask, args.n)
        if responses is None:
            responses = self._hf_generate(input_ids, attention_mask, cache, args, recorder, sampler)
        responses = responses.cpu()
        logprobs = recorder.logprobs()
        if logprobs.shape != responses.shape:
            raise RuntimeError(
                f"generate returned {tuple(responses.shape)} tokens but {tuple(logprobs.shape)} logprobs"
            )

        groups: list[list[Any]] = []
        for row, prompt in enumerate(prompts):
            prompt_text = self.tokenizer.decode(prompt)
            group = []
            for k in range(args.n):
                seq = row * args.n + k
                ids = responses[seq].tolist()
                end, reason, text = finish_point(ids, eos, args.stop, self._decode)
                group.append(
                    Experience(
                        tokens=torch.tensor(prompt + ids[:end], dtype=torch.long),
                        prompt_length=len(prompt),
                        logprobs=logprobs[seq, :end].clone(),
                        prompt_text=prompt_text,
                        response_text=text,
                        info={"finish_reason": reason},
                        model_version=self.model_version,
                    )
                )
            groups.append(group)
        return groups

    def _hf_generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        args: SamplingArgs,
        recorder: StepRecorder,
        sampler: RowSampler | None,
    ) -> torch.Tensor:
        """The response columns ``(B, steps)`` from transformers' ``generate`` (stop strings, and
        models whose cache cannot drop rows)."""
        from transformers import (
            GenerationConfig,
            LogitsProcessorList,
            MinNewTokensLengthLogitsProcessor,
            StoppingCriteriaList,
        )

        # The recorder sees the raw logits first (logprobs are those of the model's distribution at
        # the sampling temperature, as before any filter); min-tokens runs here rather than inside
        # generate(), whose own processors would come first. Sampling happens in RowSampler (one
        # generator per row); generate() itself decodes greedily over its output. Explicit "off"
        # values: None would let the model's generation_config (top_k=50 by default) slip in.
        width = input_ids.shape[1]
        processors = LogitsProcessorList([recorder])
        if args.min_tokens:
            processors.append(
                MinNewTokensLengthLogitsProcessor(
                    width, args.min_tokens, self.eos_token_ids, device=self.device
                )
            )
        if sampler is not None:
            processors.append(sampler)
        config = GenerationConfig(
            do_sample=False,
            temperature=None,
            top_k=None,
            top_p=None,
            max_new_tokens=args.max_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            stop_strings=args.stop or None,
            return_dict_in_generate=True,
        )
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **({"past_key_values": cache} if cache is not None else {}),
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([recorder.stop_cancelled] if recorder.streams else []),
            streamer=recorder,
            tokenizer=self.tokenizer if args.stop else None,
        )
        return out.sequences[:, width:]

    def _prompt_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> Any:
        """The key/value cache of each prompt but its last token, computed once per prompt and
        repeated to its ``n`` rows (rows are prompt-major), or ``None`` (``n`` of 1, one-token
        prompts, or a model whose cache cannot be repeated). ``generate`` starts from it and runs
        only the last prompt column itself: the prompt's prefill costs 1/n of the tokens."""
        if n < 2 or input_ids.shape[1] < 2 or not self.share_prefill:
            return None
        ids, mask = input_ids[::n, :-1], attention_mask[::n, :-1]
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids_from_mask(mask),
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
        except Exception as exc:  # any failure means: this model prefills every row itself
            self.share_prefill = False
            logger.warning(
                "%s cannot share a prompt's prefill between its samples (%s: %s); every row "
                "runs its own from now on",
                type(self.model).__name__,
                type(exc).__name__,
                exc,
            )
            return None
        return cache

    def _lean_decoder(self) -> LeanDecoder | None:
        """The model's :class:`LeanDecoder`, or ``None`` (logged) when it is not covered."""
        try:
            lean = LeanDecoder.for_model(self.model)
        except LogitsDiffer as exc:
            logger.warning(
                "%s: decoding with transformers' forward: %s",
                type(self.model).__name__,
                exc,
            )
        except NotCovered as exc:
            logger.info("decoding with transformers' forward (no lean decoding step: %s)", exc)
        else:
            logger.info(
                "%s: decoding steps run on the lean decoding step (logits within %.2g of "
                "transformers' forward; enforce_eager: true turns it off)",
                type(self.model).__name__,
                lean.difference,
            )
            return lean
        return None

    def _on_step(self, recorder: StepRecorder) -> None:
        """Called in the generating thread after each decoding step's tokens were handed out
        (a hook for tests and instrumentation; nothing by default)."""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

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

    # -- weights ---------------------------------------------------------------------------

    def _named_targets(self) -> dict[str, torch.Tensor]:
        own = dict(self.model.named_parameters(remove_duplicate=False))  # tied weights keep both names
        own.update(dict(self.model.named_buffers(remove_duplicate=False)))
        return own

    @staticmethod
    def _check_names(own: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        """Why weights with these names and shapes cannot be loaded, or ``None``."""
        unknown = sorted(set(shapes) - set(own))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            return (
                f"{len(unknown)} name(s) not in the rollout model: {shown} "
                f"(expected names like {next(iter(own))!r})"
            )
        for name, shape in shapes.items():
            if tuple(own[name].shape) != tuple(shape):
                return f"{name} has shape {tuple(shape)}, the model expects {tuple(own[name].shape)}"
        return None

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        own = self._named_targets()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise KeyError(
                f"update_weights: {len(unknown)} name(s) not in the rollout model: {shown} "
                f"(expected names like {next(iter(own))!r})"
            )
        for name, value in state_dict.items():
            if own[name].shape != value.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(value.shape)}, the model expects {tuple(own[name].shape)}"
                )

        with self._lock:
            self._on_compute_thread(self._copy_weights, own, list(state_dict.items()))
            self._model_version = version

    # -- broadcast weight sync (sync_method nccl) -------------------------------------------

    def weight_sync_devices(self) -> list[str]:
        """One rank, on this engine's device."""
        return [describe_device(self.device)]

    def init_weight_group(self, spec: GroupSpec, rank_offset: int) -> None:
        self._weight_receiver.join(spec, rank_offset, self.device)

    @torch.no_grad()
    def receive_weights(self, metas: list[Any], version: int) -> None:
        """Receive a broadcast into the model's parameters (names as in its ``state_dict``)."""
        metas = parse_metas(metas)
        own = self._named_targets()
        problem = self._check_names(own, {name: m.shape for m in metas for name in m.names})

        def load(batch: list[tuple[str, torch.Tensor]]) -> None:
            self._on_compute_thread(self._copy_weights, own, batch)

        with self._lock:
            self._weight_receiver.receive(metas, version, load, problem=problem)
            self._model_version = version

    @staticmethod
    @torch.no_grad()
    def _copy_weights(own: Mapping[str, torch.Tensor], batch: list[tuple[str, torch.Tensor]]) -> None:
        """Copies each ``(name, value)`` of ``batch`` into the model's tensor of that name (on
        the compute thread: grad mode is per thread)."""
        for name, value in batch:
            target = own[name]
            target.copy_(value.to(device=target.device, dtype=target.dtype))

    def close_weight_group(self) -> None:
        self._weight_receiver.close()

    def load_checkpoint(self, path: str | Path, version: int) -> None:
        from transformers import AutoModelForCausalLM

        loaded = self._on_compute_thread(lambda: AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype))
        self.update_weights(loaded.state_dict(), version)
