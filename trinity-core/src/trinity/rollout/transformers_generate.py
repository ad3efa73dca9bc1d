"""Decoding of the ``transformers`` engine (see :mod:`.transformers_engine`): one batch of
prompts x ``n`` samples, left padded, each prompt prefilled once for its samples
(:meth:`Generation._prompt_cache`); the engine's own loop
(:func:`~trinity.rollout.decoding.decode_rows`, on :mod:`.lean_decoding` steps where the model is
covered) or transformers' ``generate`` (stop strings, caches that cannot drop rows) samples
with the same :class:`~trinity.rollout.sampling.RowSampler` and
:class:`~trinity.rollout.sampling.StepRecorder`, so both sample the same tokens.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.rollout.base import FINISH_INTERRUPTED, FINISH_LENGTH, SamplingArgs, finish_point
from trinity.rollout.decoding import RowsCannotBeDropped, decode_rows
from trinity.rollout.lean_decoding import LeanDecoder, LogitsDiffer, NotCovered
from trinity.rollout.sampling import RowSampler, StepRecorder, greedy
from trinity.rollout.transformers_batching import QueuedCall
from trinity.trainer.batch import position_ids_from_mask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

logger = logging.getLogger(__name__)


class Generation:
    """The decoding side of :class:`~.transformers_engine.TransformersEngine`: it runs on the
    engine's compute thread under its lock, with the engine's ``model``, ``tokenizer``,
    ``device``, ``eos_token_ids``, ``pad_token_id``, ``max_batch_size`` and the switches
    ``share_prefill``, ``own_loop`` and ``lean``."""

    model: Any
    tokenizer: Any
    device: str
    eos_token_ids: list[int]
    pad_token_id: int
    max_batch_size: int
    share_prefill: bool
    own_loop: bool
    lean: LeanDecoder | None
    _interrupt: Any  # threading.Event, set while generation is paused (partial rollouts)

    def _generate(
        self,
        prompts: list[list[int]],
        args: SamplingArgs,
        seeds: list[int],
        owners: list[tuple[QueuedCall, int]],
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
        owners: list[tuple[QueuedCall, int]] | None = None,
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
            owners = [(QueuedCall(prompts, args), i) for i in range(len(prompts))]
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
        # Partial rollouts: once the engine is paused, the rows of calls nobody streams stop
        # after the current step; ``interrupted_at`` is how many tokens each of them then has.
        plain_rows = torch.tensor([call.sink is None for call, _ in owners for _ in range(args.n)])
        interrupted_at: list[int] = []
        none_stopped = torch.zeros_like(plain_rows)

        def stopped() -> torch.Tensor:
            rows = recorder.cancelled_rows() if recorder.streams else none_stopped
            if self._interrupt.is_set():
                if not interrupted_at:
                    interrupted_at.append(recorder.steps)
                rows = rows | plain_rows
            return rows

        responses = None
        if self.own_loop and not args.stop:
            try:
                responses = decode_rows(
                    self.model,
                    input_ids,
                    attention_mask,
                    max_new_tokens=args.max_tokens,
                    eos_token_ids=self.eos_token_ids,
                    choose=sampler.pick if sampler is not None else greedy,
                    record=recorder.record,
                    logprob_temperature=args.logprob_temperature,
                    min_tokens=args.min_tokens,
                    cancelled=stopped,
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
        # The full softmax at the temperature (top-k / top-p only choose what is sampled).
        applied = args.applied(logprobs_renormalised=False)
        for row, prompt in enumerate(prompts):
            prompt_text = self.tokenizer.decode(prompt)
            group = []
            for k in range(args.n):
                seq = row * args.n + k
                ids = responses[seq].tolist()
                if interrupted_at and plain_rows[seq]:
                    ids = ids[: interrupted_at[0]]  # what follows is padding, not samples
                end, reason, text = finish_point(ids, eos, args.stop, self._decode)
                if interrupted_at and plain_rows[seq] and reason == FINISH_LENGTH and end < args.max_tokens:
                    reason = FINISH_INTERRUPTED
                group.append(
                    Experience(
                        tokens=torch.tensor(prompt + ids[:end], dtype=torch.long),
                        prompt_length=len(prompt),
                        logprobs=logprobs[seq, :end].clone(),
                        prompt_text=prompt_text,
                        response_text=text,
                        info={"finish_reason": reason, "rollout_args": dict(applied)},
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
