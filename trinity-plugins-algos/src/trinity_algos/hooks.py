"""Hook implementations of trinity-plugins-algos (entry point `trinity` → `trinity_algos.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
Every component module binds torch through ``trinity.lazy.lazy_import``.
"""

from __future__ import annotations

from trinity import hookimpl
from trinity.hookspecs import Register
from trinity_algos import advantage, entropy, kl, policy_loss, sample_strategy
from trinity_algos.algorithm_types import ALGORITHM_TYPES
from trinity_algos.raft import RAFTFilterFn
from trinity_algos.selector import SELECTORS

ADVANTAGE_FNS = {
    "ppo": advantage.PPOAdvantageFn,
    "grpo": advantage.GRPOAdvantageFn,
    "opmd": advantage.OPMDAdvantageFn,
    "rloo": advantage.RLOOAdvantageFn,
    "reinforceplusplus": advantage.REINFORCEPlusPlusAdvantageFn,
    "reinforce": advantage.REINFORCEAdvantageFn,
    "asymre": advantage.AsymREAdvantageFn,
    "remax": advantage.REMAXAdvantageFn,
    "raft": RAFTFilterFn,
    "grpo_verl": advantage.GRPOVerlAdvantageFn,
    "opmd_verl": advantage.OPMDVerlAdvantageFn,
    "asymre_verl": advantage.AsymREVerlAdvantageFn,
    "step_wise_grpo": advantage.StepWiseGRPOAdvantageFn,
    "gigpo": advantage.GiGPOAdvantageFn,
    "rec": advantage.RECAdvantageFn,
    "on_policy_distill": advantage.OnPolicyDistillAdvantageFn,
    "jsd": advantage.JSDAdvantageFn,
    "clipb": advantage.ClipBAdvantageFn,
    "clipv": advantage.ClipVAdvantageFn,
}

POLICY_LOSS_FNS = {
    "ppo": policy_loss.PPOPolicyLossFn,
    "opmd": policy_loss.OPMDPolicyLossFn,
    "sft": policy_loss.SFTLossFn,
    "dpo": policy_loss.DPOLossFn,
    "gspo": policy_loss.GSPOPolicyLossFn,
    "cispo": policy_loss.CISPOPolicyLossFn,
    "mix": policy_loss.MIXPolicyLossFn,
    "topr": policy_loss.TOPRPolicyLossFn,
    "sft_is": policy_loss.SFTISLossFn,
    "sft_phi": policy_loss.SFTPhiLossFn,
    "mix_chord": policy_loss.MIXCHORDPolicyLossFn,
    "sppo": policy_loss.SPPOPolicyLossFn,
    "rec": policy_loss.RECPolicyLossFn,
    "sapo": policy_loss.SAPOPolicyLossFn,
    "importance_sampling": policy_loss.ImportanceSamplingPolicyLossFn,
    "m2po": policy_loss.M2POPolicyLossFn,
}

KL_FNS = {
    "none": kl.NoKLFn,
    "k1": kl.K1KLFn,
    "k2": kl.K2KLFn,
    "k3": kl.K3KLFn,
    "low_var_kl": kl.LowVarKLFn,
    "abs": kl.AbsKLFn,
    "corrected_k3": kl.CorrectedK3KLFn,
}

ENTROPY_LOSS_FNS = {
    "default": entropy.DefaultEntropyLossFn,
    "none": entropy.NoEntropyLossFn,
    "mix": entropy.MixEntropyLossFn,
}

SAMPLE_STRATEGIES = {
    "default": sample_strategy.DefaultSampleStrategy,
    "warmup": sample_strategy.WarmupSampleStrategy,
    "mix": sample_strategy.MixSampleStrategy,
    "staleness_control": sample_strategy.StalenessControlSampleStrategy,
}


def _register_all(register: Register, components: dict[str, type]) -> None:
    for name, component in components.items():
        register(name, component)


@hookimpl
def register_advantage_fns(register: Register) -> None:
    """Every name in :data:`ADVANTAGE_FNS` (Trinity-RFT 0.6's advantage functions, plus ``raft``)."""
    _register_all(register, ADVANTAGE_FNS)


@hookimpl
def register_policy_loss_fns(register: Register) -> None:
    """Every name in :data:`POLICY_LOSS_FNS`."""
    _register_all(register, POLICY_LOSS_FNS)


@hookimpl
def register_kl_fns(register: Register) -> None:
    """Every name in :data:`KL_FNS`."""
    _register_all(register, KL_FNS)


@hookimpl
def register_entropy_loss_fns(register: Register) -> None:
    """Every name in :data:`ENTROPY_LOSS_FNS`."""
    _register_all(register, ENTROPY_LOSS_FNS)


@hookimpl
def register_sample_strategies(register: Register) -> None:
    """Every name in :data:`SAMPLE_STRATEGIES`."""
    _register_all(register, SAMPLE_STRATEGIES)


@hookimpl
def register_algorithm_types(register: Register) -> None:
    """Every name in :data:`ALGORITHM_TYPES`."""
    _register_all(register, ALGORITHM_TYPES)


@hookimpl
def register_selectors(register: Register) -> None:
    """Every name in :data:`trinity_algos.selector.SELECTORS` (offline_easy2hard, difficulty_based)."""
    _register_all(register, SELECTORS)
