"""One forward pass per distinct prompt: the trainer's prompt-sharing forward.

A GRPO batch holds ``repeat_times`` responses to each prompt, and the prompt's columns are the
same in all of them. In a causal language model the prompt's hidden states (its keys and values)
do not depend on what follows, so :func:`shared_prompt_logits` runs each distinct prompt once,
repeats its key/value cache to the rows that share it, and runs the responses on that cache.
The quickstart's batch (16 prompts x 8, 24 prompt tokens, 56 response tokens) computes 74% of
the tokens of the full pass. The gradient is the full pass's: indexing the cache is
differentiable, so each prompt's keys and values collect the gradient of all their rows.
Equal up to rounding (float32 log-probs within ~1e-5) is not bit-equal: over hundreds of steps
a run's trajectory drifts from the full pass's as it would from any rounding change (Adam turns
rounding noise in near-zero gradients into lr-sized steps).

What could break the equivalence is checked rather than assumed: the first time a model is used
this way, :func:`shared_prompt_logits` compares its result with the full pass on that micro-batch
(dropout in training mode, a bidirectional prefix, a cache that cannot be re-indexed all show up
as a mismatch or an error); on a mismatch the model gets full passes from then on, with one
warning. ``trainer.share_prompt_forward: false`` turns the whole thing off.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

logger = logging.getLogger(__name__)

#: Mean absolute log-probability difference (over real response tokens) above which the shared
#: pass is taken to compute something else than the full pass, for float32 logits and for
#: half-precision ones. Rounding differs by ~1e-6 in float32 and ~1e-2 in bfloat16; a broken
#: prefix is off by whole nats.
TOLERANCE = {"float32": 1e-3, "half": 0.05}

# model -> whether its shared pass matched the full pass (absent: not checked yet).
_verdicts: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def prompt_index(batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)`` when rows share prompts: ``first`` (U,) is one row per distinct
    prompt, ``inverse`` (B,) the distinct prompt of each row. ``None`` when there are fewer than
    two rows per distinct prompt on average, or the batch's layout is not the plain one (2-D
    positions, at least one prompt column and two response columns)."""
    p = int(batch.get("prompt_length", 0))
    if batch.get("multi_modal_inputs") is not None:  # the image rows' pixels differ per row
        return None
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    width = batch["response_mask"].shape[-1]
    if p < 1 or width < 2 or pos.dim() != 2 or ids.shape[1] != p + width:
        return None
    key = torch.cat([ids[:, :p], mask[:, :p].to(ids.dtype), pos[:, :p].to(ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    distinct = int(inverse.max()) + 1
    if 2 * distinct > key.shape[0]:
        # Fewer than two rows per prompt on average (an SFT batch that happens to hold a row
        # twice): a second forward call would save too little to be worth it.
        return None
    rows = torch.arange(key.shape[0], device=key.device)
    first = torch.full((distinct,), key.shape[0], dtype=torch.long, device=key.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    # Number the distinct prompts by their first row, so `first` keeps the batch's order.
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(distinct, device=key.device)
    return first[order], rank[inverse]


def full_logits(model: Any, batch: Mapping[str, Any]) -> torch.Tensor:
    """Logits ``(B, T, V)`` predicting each response token, from one pass over whole rows.

    Rows with images (``multi_modal_inputs``) pass their pixel inputs, and the model computes its
    own (multimodal rotary) positions from the tokens and the attention mask.
    """
    width = batch["response_mask"].shape[-1]
    extra: dict[str, Any] = {"position_ids": batch["position_ids"]}
    if batch.get("multi_modal_inputs") is not None:
        from trinity.multimodal import concat_mm_inputs, mm_token_type_ids

        config = getattr(model, "config", None)
        extra = dict(concat_mm_inputs(batch["multi_modal_inputs"]))
        extra = {k: v.to(batch["input_ids"].device) for k, v in extra.items()}
        extra["mm_token_type_ids"] = mm_token_type_ids(batch["input_ids"], config)
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        use_cache=False,
        logits_to_keep=width + 1,
        **extra,
    )
    return out.logits[:, :-1, :]


def _shared(model: Any, batch: Mapping[str, Any], first: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    p = int(batch["prompt_length"])
    width = batch["response_mask"].shape[-1]
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    prompt = model(
        input_ids=ids[first, :p],
        attention_mask=mask[first, :p],
        position_ids=pos[first, :p],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = prompt.past_key_values
    cache.batch_select_indices(inverse)
    # Column P - 1 (the prompt's last) predicts response token 0; response column j predicts j + 1.
    rest = model(
        input_ids=ids[:, p : p + width - 1],
        attention_mask=mask[:, : p + width - 1],
        position_ids=pos[:, p : p + width - 1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([prompt.logits[inverse], rest.logits], dim=1)


def _checkpointing(model: Any) -> bool:
    # transformers 5 renamed the property and warns on the old name; 4.x has only the old one.
    # A PEFT (LoRA) model forwards attributes to the model it wraps: ask that one.
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _mean_gap(a: torch.Tensor, b: torch.Tensor, batch: Mapping[str, Any]) -> float:
    """Mean |log p(token)| difference of two logit tensors over the real response tokens."""
    p = int(batch["prompt_length"])
    labels = batch["input_ids"][:, p:]
    mask = batch["response_mask"].to(torch.float32)

    def logprob(logits: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(logits.float(), dim=-1)
        return lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)

    gap = (logprob(a) - logprob(b)).abs() * mask
    return float(gap.sum() / mask.sum().clamp(min=1.0))


def shared_prompt_logits(model: Any, batch: Mapping[str, Any]) -> torch.Tensor | None:
    """Logits ``(B, T, V)`` predicting each response token, running each distinct prompt once;
    ``None`` when the batch shares no prompt or ``model`` failed its check (then the caller runs
    :func:`full_logits`)."""
    if _verdicts.get(model) is False or _checkpointing(model):
        return None  # checkpointing recomputes with use_cache off: nothing would be cached
    index = prompt_index(batch)
    if index is None:
        return None
    first, inverse = index
    if model in _verdicts:
        return _shared(model, batch, first, inverse)
    name = type(model).__name__
    try:
        shared = _shared(model, batch, first, inverse)
    except Exception as exc:  # any failure means: this model needs full passes
        _verdicts[model] = False
        logger.warning(
            "%s cannot run shared prompts (%s: %s); running every row's prompt instead "
            "(trainer.share_prompt_forward)",
            name,
            type(exc).__name__,
            exc,
        )
        return None
    with torch.no_grad():
        reference = full_logits(model, batch)
        gap = _mean_gap(shared.detach(), reference, batch)
    tolerance = TOLERANCE["float32" if shared.dtype == torch.float32 else "half"]
    _verdicts[model] = ok = gap <= tolerance
    if ok:
        logger.debug("%s: shared-prompt pass matches the full pass (mean |dlogprob| %.2e)", name, gap)
        return shared
    logger.warning(
        "%s: the shared-prompt pass differs from the full pass (mean |dlogprob| %.3g > %g; "
        "dropout in training mode?); running every row's prompt instead (trainer.share_prompt_forward)",
        name,
        gap,
        tolerance,
    )
    return reference if not torch.is_grad_enabled() else None


__all__ = ["TOLERANCE", "full_logits", "prompt_index", "shared_prompt_logits"]
