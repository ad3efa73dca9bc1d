"""Direct preference optimisation (Rafailov et al., arXiv:2305.18290), sigmoid loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn, masked_sum
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class DPOLossFn(PolicyLossFn):
    """DPO over interleaved pairs: row ``2k`` is the chosen response, row ``2k + 1`` the rejected
    one (Trinity-RFT's layout).

    Per pair, ``z = (sum logπ_c - sum logπref_c) - (sum logπ_r - sum logπref_r)`` over valid
    tokens and the loss is ``-(1 - ls) logσ(βz) - ls logσ(-βz)``, averaged over pairs.
    Metrics: ``chosen_reward`` / ``rejected_reward`` (β times the policy-to-reference log-ratio,
    pair mean), ``accuracy`` (share of pairs with chosen reward above rejected), ``margin``.
    """

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0) -> None:
        super().__init__(loss_agg_mode="token-mean")
        self.beta = beta
        self.label_smoothing = label_smoothing

    def __call__(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean DPO loss over the pairs of the batch."""
        if logprob.shape[0] % 2:
            raise ValueError(
                f"policy_loss_fn 'dpo' needs chosen/rejected pairs (rows 2k, 2k+1); got {logprob.shape[0]} rows"
            )
        if ref_logprob is None:
            raise ValueError("policy_loss_fn 'dpo' needs ref_logprob: enable the reference model")
        policy = masked_sum(logprob, action_mask, axis=-1)
        reference = masked_sum(ref_logprob.detach(), action_mask, axis=-1)
        chosen_ratio = policy[0::2] - reference[0::2]
        rejected_ratio = policy[1::2] - reference[1::2]
        logits = self.beta * (chosen_ratio - rejected_ratio)
        logsigmoid = torch.nn.functional.logsigmoid
        ls = self.label_smoothing
        loss = (-(1.0 - ls) * logsigmoid(logits) - ls * logsigmoid(-logits)).mean()
        with torch.no_grad():
            chosen_reward = self.beta * chosen_ratio.detach()
            rejected_reward = self.beta * rejected_ratio.detach()
            accuracy = (chosen_reward > rejected_reward).to(logprob.dtype).mean()
            margin = (chosen_reward - rejected_reward).mean()
        return loss, {
            "dpo_loss": float(loss.detach()),
            "chosen_reward": float(chosen_reward.mean()),
            "rejected_reward": float(rejected_reward.mean()),
            "accuracy": float(accuracy),
            "margin": float(margin),
        }


__all__ = ["DPOLossFn"]
