"""The components: a policy loss and an algorithm type that trains with it.

Like every module a plugin's hooks import, it avoids importing torch at import time
(``trinity plugins`` loads it); torch comes with the tensors the trainer passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import AlgorithmType, PolicyLossFn, aggregate_loss

if TYPE_CHECKING:
    import torch


class VanillaPGLoss(PolicyLossFn):
    """REINFORCE-style loss ``agg(-A * logprob)`` over the action mask."""

    def __call__(
        self,
        logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = aggregate_loss(-advantages * logprob, action_mask, self.loss_agg_mode)
        return loss, {"pg_loss": float(loss.detach())}


class VanillaPGAlgorithm(AlgorithmType):
    """Group-normalised advantages with a plain policy-gradient loss."""

    use_critic = False
    use_reference = False
    use_advantage = True
    schema = "experience"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {
            "repeat_times": 4,
            "advantage_fn": "grpo",
            "policy_loss_fn": "vanilla_pg",
            "kl_loss_fn": "none",
            "kl_penalty_fn": "none",
            "entropy_loss_fn": "none",
            "sample_strategy": "default",
        }
