"""Splitting a training batch into micro-batches, and weighting their losses so that gradient
accumulation over micro-batches gives the gradient of the whole batch.

A loss aggregated inside one micro-batch is a mean over *that* micro-batch's tokens (or
sequences); adding such means does not give the batch mean. Each micro-batch loss is therefore
scaled by its share of what the batch-level aggregation divides by: its valid tokens for
``token-mean``, its non-empty sequences for the sequence means, 1 for
``seq-mean-token-sum-norm`` (a plain sum over a fixed width). With these weights the summed
gradient equals the one-batch gradient exactly, whatever the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer.batch import TrainBatch, select_rows

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def split_by_rows(n_rows: int, micro_batch_size: int | None, pair_rows: bool = False) -> list[list[int]]:
    """Consecutive row indices, ``micro_batch_size`` rows each (all rows when unset).

    With ``pair_rows`` (DPO) a micro-batch never separates rows ``2k`` and ``2k + 1``.
    """
    if not micro_batch_size or micro_batch_size >= n_rows:
        return [list(range(n_rows))]
    if micro_batch_size < 1:
        raise ValueError(f"trainer.ppo_micro_batch_size_per_gpu must be >= 1, got {micro_batch_size}")
    step = micro_batch_size
    if pair_rows and step % 2:
        step += 1  # keep pairs whole; one row more is better than a broken pair
    return [list(range(i, min(i + step, n_rows))) for i in range(0, n_rows, step)]


def split_by_tokens(lengths: list[int], max_tokens: int, pair_rows: bool = False) -> list[list[int]]:
    """Greedy packing in row order: each micro-batch holds at most ``max_tokens`` real tokens.

    A unit (row, or pair with ``pair_rows``) longer than ``max_tokens`` gets a micro-batch of its
    own rather than failing: the budget bounds memory, it is not a correctness limit.
    """
    if max_tokens < 1:
        raise ValueError(f"trainer.max_token_len_per_gpu must be >= 1, got {max_tokens}")
    unit = 2 if pair_rows else 1
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for start in range(0, len(lengths), unit):
        rows = list(range(start, min(start + unit, len(lengths))))
        size = sum(lengths[r] for r in rows)
        if current and used + size > max_tokens:
            groups.append(current)
            current, used = [], 0
        current.extend(rows)
        used += size
    if current:
        groups.append(current)
    return groups


def loss_denominator(mask: torch.Tensor, loss_agg_mode: str) -> float:
    """What ``aggregate_loss`` divides a batch by, for weighting micro-batches (see module doc)."""
    if loss_agg_mode == "token-mean":
        return float(mask.sum())
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return 1.0
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return float((mask.sum(dim=-1) > 0).sum())
    if loss_agg_mode == "rows":  # losses averaged over rows (e.g. DPO pairs)
        return float(mask.shape[0])
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}")


def micro_batch_weights(mask: torch.Tensor, groups: list[list[int]], loss_agg_mode: str) -> list[float]:
    """One loss weight per micro-batch; they make accumulated gradients match the full batch."""
    total = loss_denominator(mask, loss_agg_mode)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return [1.0 for _ in groups]
    if total == 0:
        return [0.0 for _ in groups]
    return [
        loss_denominator(mask[torch.as_tensor(g, device=mask.device)], loss_agg_mode) / total for g in groups
    ]


def trim_prompt_padding(batch: TrainBatch) -> TrainBatch:
    """Drop the leading columns that are padding in every row of ``batch``.

    Prompts are left-padded to the batch's longest prompt; a micro-batch of shorter prompts
    does not need those columns. Response columns are kept, so ``(B, T)`` tensors keep their
    width (``seq-mean-token-sum-norm`` divides by it).
    """
    attention = batch["attention_mask"]
    real_cols = attention.any(dim=0).nonzero()
    first = int(real_cols[0]) if len(real_cols) else 0
    first = min(first, batch["prompt_length"])
    if first == 0:
        return batch
    return batch.with_(
        input_ids=batch.input_ids[:, first:],
        attention_mask=batch.attention_mask[:, first:],
        position_ids=batch.position_ids[:, first:],
        prompt_length=batch.prompt_length - first,
    )


def make_micro_batches(
    batch: Mapping[str, Any],
    *,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    use_dynamic_bsz: bool = False,
    pair_rows: bool = False,
) -> list[list[int]]:
    """Row groups of ``batch``: by token budget with ``use_dynamic_bsz``, else by row count."""
    n = batch["input_ids"].shape[0]
    if use_dynamic_bsz and max_token_len:
        lengths = batch["attention_mask"].sum(dim=-1).tolist()
        return split_by_tokens([int(x) for x in lengths], int(max_token_len), pair_rows)
    return split_by_rows(n, micro_batch_size, pair_rows)


def micro_batch(batch: TrainBatch, rows: list[int]) -> TrainBatch:
    """The rows of ``batch`` as a micro-batch, without the prompt padding they do not need."""
    return trim_prompt_padding(select_rows(batch, rows))


__all__ = [
    "loss_denominator",
    "make_micro_batches",
    "micro_batch",
    "micro_batch_weights",
    "split_by_rows",
    "split_by_tokens",
    "trim_prompt_padding",
]
