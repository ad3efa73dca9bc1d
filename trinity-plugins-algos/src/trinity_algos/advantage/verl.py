"""The veRL-batch forms of the group advantages: ``grpo_verl``, ``opmd_verl``, ``asymre_verl``.

Upstream Trinity-RFT keeps two versions of each: a grouped one, run by the explorer on
Experiences, and one run by the trainer on veRL's ``DataProto``. Here both run in the trainer on
the same batch; what tells them apart:

- the score: the veRL forms sum ``token_level_rewards`` over the row (where a KL penalty on the
  reward lives, or an experience's own token-level rewards), falling back to the scalar
  ``rewards``; the grouped forms read the scalar ``rewards`` only;
- the arguments: ``grpo_verl`` has ``epsilon`` only (no ``std_threshold``, batch-level std,
  duplication or rank penalty); ``opmd_verl`` / ``asymre_verl`` take the same arguments as
  their grouped twins.

Everything else is shared: a group of one gets mean 0 / std 1 (GRPO) or baseline 0 (OPMD,
AsymRE), as veRL's ``compute_grpo_outcome_advantage`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from trinity.algorithm.advantage import Batch
from trinity.lazy import lazy_import
from trinity_algos.advantage._common import outcome_scores
from trinity_algos.advantage.group import AsymREAdvantageFn, GRPOAdvantageFn, OPMDAdvantageFn

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class GRPOVerlAdvantageFn(GRPOAdvantageFn):
    """GRPO, veRL form (Shao et al., arXiv:2402.03300; veRL ``compute_grpo_outcome_advantage``):
    ``A = (s - mean_group) / (std_group + epsilon)`` with ``s`` the row's summed
    ``token_level_rewards`` (else ``rewards``), std unbiased; a group of one gets mean 0, std 1."""

    reads_token_level_rewards = True  # veRL's form: the summed token-level rewards

    _name: ClassVar[str] = "grpo_verl"

    def __init__(self, epsilon: float = 1e-6) -> None:
        super().__init__(epsilon=epsilon)

    def _scores(self, batch: Batch) -> torch.Tensor:
        return outcome_scores(batch, self._name)


class OPMDVerlAdvantageFn(OPMDAdvantageFn):
    """OPMD, veRL form (Trinity-RFT, arXiv:2505.17826; arXiv:2509.24203): ``A = s - b`` per group
    with ``s`` the row's summed ``token_level_rewards`` (else ``rewards``), ``b`` the group mean
    or ``tau * (logsumexp(s / tau) - log n)``; a group of one gets ``b = 0``."""

    reads_token_level_rewards = True  # veRL's form: the summed token-level rewards

    _name: ClassVar[str] = "opmd_verl"

    def _scores(self, batch: Batch) -> torch.Tensor:
        return outcome_scores(batch, self._name)


class AsymREVerlAdvantageFn(AsymREAdvantageFn):
    """AsymRE, veRL form (arXiv:2506.20520): ``A = s - (mean_group + baseline_shift)`` with ``s``
    the row's summed ``token_level_rewards`` (else ``rewards``); a group of one gets baseline 0."""

    reads_token_level_rewards = True  # veRL's form: the summed token-level rewards

    _name: ClassVar[str] = "asymre_verl"

    def _scores(self, batch: Batch) -> torch.Tensor:
        return outcome_scores(batch, self._name)


__all__ = ["AsymREVerlAdvantageFn", "GRPOVerlAdvantageFn", "OPMDVerlAdvantageFn"]
