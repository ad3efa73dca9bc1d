"""Forward passes of the native trainer: per-token log-probabilities, entropy and values.

Only the response positions matter: the logits at column ``P - 1 + j`` predict response token
``j``. Because responses are right-padded, those are the last ``T + 1`` columns minus the very
last one, so the language-model head runs on ``T + 1`` positions only (``logits_to_keep``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer.shared_prompt import full_logits, shared_prompt_logits

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def response_logits(
    model: Any, batch: Mapping[str, Any], temperature: float = 1.0, *, share_prompt: bool = False
) -> torch.Tensor:
    """Logits ``(B, T, V)`` (float32) predicting each response token.

    ``share_prompt``: run each distinct prompt once and the responses on its cache
    (:mod:`trinity.trainer.shared_prompt`; the same logits up to rounding) when rows share prompts.
    """
    logits = shared_prompt_logits(model, batch) if share_prompt else None
    if logits is None:
        logits = full_logits(model, batch)
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        # The explorer sampled from softmax(logits / temperature); score the same distribution.
        # Temperature 0 is greedy decoding, which has no distribution to match: the model's own
        # is scored (as the engines report greedy tokens' logprobs), never a division by zero.
        logits = logits / temperature
    return logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log p(label)`` per position; cross-entropy's fused kernel avoids a (B, T, V) log-softmax."""
    flat = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
    )
    return -flat.view(labels.shape)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: ``logsumexp(l) - sum(p * l)``."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def nec_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``N = H * sum_v p_v^2 + sum_v p_v^2 log p_v`` per position: the expectation under the
    policy of ``p (H + log p)`` (the token signal Clip-V centres), which needs the whole
    distribution, so only a forward pass can give it."""
    logp = torch.log_softmax(logits, dim=-1)
    p2 = torch.exp(2 * logp)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return entropy * p2.sum(dim=-1) + (p2 * logp).sum(dim=-1)


def policy_stats(
    model: Any,
    batch: Mapping[str, Any],
    names: tuple[str, ...],
    *,
    temperature: float = 1.0,
    share_prompt: bool = False,
) -> dict[str, torch.Tensor]:
    """No-grad ``old_logprob`` / ``old_entropy`` / ``old_nec`` ``(B, T)`` (those in ``names``)
    of the response tokens, from one forward pass."""
    with torch.no_grad():
        logits = response_logits(model, batch, temperature, share_prompt=share_prompt)
        out: dict[str, torch.Tensor] = {}
        if "old_logprob" in names:
            p = batch["prompt_length"]
            out["old_logprob"] = logprobs_from_logits(logits, batch["input_ids"][:, p:])
        if "old_entropy" in names:
            out["old_entropy"] = entropy_from_logits(logits)
        if "old_nec" in names:
            out["old_nec"] = nec_from_logits(logits)
    return out


def forward_logprobs(
    model: Any,
    batch: Mapping[str, Any],
    *,
    temperature: float = 1.0,
    entropy: str = "none",
    share_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprob (B, T), entropy (B, T) or None)`` of the response tokens.

    ``entropy``: ``"none"``, ``"detached"`` (for metrics only) or ``"grad"`` (for an entropy loss).
    ``share_prompt``: see :func:`response_logits`. Padding positions hold values too; callers
    mask them.
    """
    logits = response_logits(model, batch, temperature, share_prompt=share_prompt)
    p = batch["prompt_length"]
    labels = batch["input_ids"][:, p:]
    logprob = logprobs_from_logits(logits, labels)
    ent = None
    if entropy == "grad":
        ent = entropy_from_logits(logits)
    elif entropy == "detached":
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach())
    return logprob, ent


def forward_values(critic: Any, batch: Mapping[str, Any]) -> torch.Tensor:
    """Critic values ``(B, T)``: the value of the state *before* each response token (veRL)."""
    width = batch["response_mask"].shape[-1]
    out = critic(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    return out.logits[:, -width - 1 : -1, 0].float()


__all__ = [
    "entropy_from_logits",
    "forward_logprobs",
    "forward_values",
    "logprobs_from_logits",
    "response_logits",
]
