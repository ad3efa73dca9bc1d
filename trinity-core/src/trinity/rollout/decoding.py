"""The transformers engine's own sampling loop: :func:`decode_rows`.

``generate`` keeps computing every row until the last one finishes, and wraps each step in
its general machinery (logits processors, stopping criteria, input and mask bookkeeping). On a
small model that machinery is a third of a decoding step, and at the end of a batch most rows
are finished (quickstart: responses of 37-56 tokens, the batch runs to 56). This loop runs only
the model, the engine's sampler and its recorder, and drops finished rows from the batch
(and from the key/value cache) as they finish. It samples the same tokens as the engine's
``generate`` path for the same seeds (tests compare the two); stop strings still take the
``generate`` path (its stopping criterion checks decoded text).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer.batch import position_ids_from_mask

if TYPE_CHECKING:
    import torch

    from trinity.rollout.lean_decoding import LeanDecoder
else:
    torch = lazy_import("torch")

#: ``choose(logits, rows, step)``: the next token of each live row; ``logits`` ``(L, V)`` are
#: the model's (float32, min-tokens already applied), ``rows`` ``(L,)`` the live rows' indices
#: in the batch.
Choose = Callable[["torch.Tensor", "torch.Tensor", int], "torch.Tensor"]


class RowsCannotBeDropped(RuntimeError):
    """The model's key/value cache cannot select rows (raised before the first step)."""


# inference_mode rather than no_grad: no view or version tracking on the ~40 operators of every
# decoding step (generation 2-6% faster on the quickstart model, same tokens).
@torch.inference_mode()
def decode_rows(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: list[int],
    choose: Choose,
    record: Callable[[torch.Tensor, torch.Tensor], None],
    logprob_temperature: float = 1.0,
    min_tokens: int = 0,
    cancelled: Callable[[], torch.Tensor] | None = None,
    pad_token_id: int = 0,
    cache: Any = None,
    lean: LeanDecoder | None = None,
) -> torch.Tensor:
    """Sample up to ``max_new_tokens`` tokens after each left-padded row of ``input_ids``.

    Args:
        cache: a key/value cache of every column but the last (see the engine's prompt
            cache), or ``None`` to run the whole prompt.
        record: called after each step with the step's token ``(B,)`` and its log-probability
            ``(B,)`` under ``softmax(logits / logprob_temperature)`` of every row of the batch
            (finished rows: ``pad_token_id`` and 0).
        cancelled: ``(B,)`` bool, rows nobody wants any more; they stop like finished rows.
        lean: runs the one-token steps (all of them when ``cache`` is given, all but the
            first otherwise) with this decoder rather than the model's forward.

    Returns the sampled tokens ``(B, steps)``, ``pad_token_id`` after a row's EOS. Raises
    :class:`RowsCannotBeDropped`, before recording anything, when the cache cannot select rows.
    """
    rows_total, width = input_ids.shape
    device = input_ids.device
    eos = torch.tensor(sorted(set(eos_token_ids)), device=device)
    # The position of the next token: the row's count of real tokens so far.
    position = attention_mask.sum(-1, keepdim=True)
    state = None
    if cache is None:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :]
        if lean is not None:
            state = lean.start(out.past_key_values, attention_mask, room=min(max_new_tokens, 256))
    elif lean is not None:
        state = lean.start(cache, attention_mask, room=min(max_new_tokens, 256) + 1)
        logits = lean.step(state, input_ids[:, -1], position - 1)
    else:
        out = model(
            input_ids=input_ids[:, -1:],
            attention_mask=attention_mask,
            position_ids=position - 1,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :]
    rows = torch.arange(rows_total, device=device)
    if state is None:  # transformers' forward: it needs the whole attention mask every step
        mask = torch.zeros((rows_total, width + max_new_tokens), dtype=attention_mask.dtype, device=device)
        mask[:, :width] = attention_mask
        cache = out.past_key_values
        try:  # before anything is recorded, so that the caller can still take another path
            cache.batch_select_indices(rows)
        except Exception as exc:  # any failure: this model's cache cannot drop rows
            raise RowsCannotBeDropped(f"{type(cache).__name__}: {type(exc).__name__}: {exc}") from exc
    tokens = torch.full((rows_total, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    steps = 0
    for step in range(max_new_tokens):
        logits = logits.float()
        logprobs = torch.log_softmax(logits / logprob_temperature, dim=-1)
        if step < min_tokens:
            logits[:, eos] = float("-inf")
        picked = choose(logits, rows, step)
        tokens[rows, step] = picked
        step_tokens = torch.full((rows_total,), pad_token_id, dtype=torch.long, device=device)
        step_tokens[rows] = picked
        step_logprobs = torch.zeros(rows_total, dtype=torch.float32, device=device)
        step_logprobs[rows] = logprobs.gather(-1, picked.unsqueeze(-1)).squeeze(-1)
        record(step_tokens, step_logprobs)
        steps = step + 1
        done = torch.isin(picked, eos)
        if cancelled is not None:
            done |= cancelled().to(device)[rows]
        if bool(done.all()) or steps == max_new_tokens:
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(-1)
            if state is not None:
                state.select(keep)
            else:
                cache.batch_select_indices(keep)
                mask = mask[keep]
            rows, picked, position = rows[keep], picked[keep], position[keep]
        if state is not None:
            logits = lean.step(state, picked, position)
        else:
            mask[:, width + step] = 1
            logits = model(
                input_ids=picked.unsqueeze(-1),
                attention_mask=mask[:, : width + step + 1],
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
        position = position + 1
    return tokens[:, :steps]


__all__ = ["Choose", "RowsCannotBeDropped", "decode_rows"]
