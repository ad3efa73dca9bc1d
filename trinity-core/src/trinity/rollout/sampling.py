"""Per-row sampling and step recording of the ``transformers`` engine.

:class:`RowSampler` samples every row of a batch from a random generator of its own (seeded by
:func:`row_seeds` from its call's seed and its place in the call), so a call's samples never
depend on what else shared its batch. :class:`StepRecorder` is the per-step side of one batch:
it keeps each row's logprobs and hands streamed calls their tokens as they are sampled.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from trinity.rollout.transformers_batching import QueuedCall
else:
    torch = lazy_import("torch")


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


def greedy(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
    """The chooser of temperature-0 calls: each row's most likely token."""
    return logits.argmax(dim=-1)


def row_seeds(seed: int, prompts: int, n: int) -> list[int]:
    """The seed of each of ``prompts x n`` rows of a call with ``seed`` (prompt-major)."""
    return [(seed * 1_000_003 + row) % (2**63) for row in range(prompts * n)]


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
        rows: list[tuple[QueuedCall, int]],
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
