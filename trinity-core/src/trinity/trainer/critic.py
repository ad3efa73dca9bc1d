"""The critic of PPO-style algorithms: a causal LM backbone with a one-output value head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import aggregate_loss, masked_mean
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def load_critic(path: str, *, trust_remote_code: bool = False) -> Any:
    """``AutoModelForTokenClassification`` with ``num_labels=1`` (as veRL builds its critic).

    Loaded from a language model, the value head is newly initialised; loaded from a critic
    checkpoint it is restored.
    """
    import transformers

    transformers.logging.set_verbosity_error()  # "newly initialized score weights" is expected here
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        path, num_labels=1, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    model.config.use_cache = False
    return model


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old ± c) - R)^2)``."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss = 0.5 * aggregate_loss(torch.maximum(loss_unclipped, loss_clipped), action_mask, loss_agg_mode)
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), action_mask)
    return loss, {"vf_loss": float(loss.detach()), "vf_clipfrac": float(clipfrac)}


__all__ = ["load_critic", "value_loss"]
