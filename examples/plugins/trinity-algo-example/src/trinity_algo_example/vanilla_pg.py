"""Hook implementations: what this plugin adds to Trinity.

Like every plugin module, it avoids importing torch at import time (``trinity plugins`` loads
it); the loss imports torch helpers only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity import hookimpl
from trinity.algorithm import AlgorithmType, PolicyLossFn, aggregate_loss

if TYPE_CHECKING:
    import torch


class VanillaPGLoss(PolicyLossFn):
    """REINFORCE-style loss ``agg(-A * logprob)`` over the action mask."""

    def __call__(  # type: ignore[override]
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


@hookimpl
def register_policy_loss_fns(register):
    register("vanilla_pg", VanillaPGLoss)


@hookimpl
def register_algorithm_types(register):
    register("vanilla_pg", VanillaPGAlgorithm)
