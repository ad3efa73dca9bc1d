"""Hook implementations of trinity-plugins-algos (entry point `trinity` → `trinity_algos.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
Every component module binds torch through ``trinity.lazy.lazy_import``.
"""

from __future__ import annotations

from trinity import hookimpl
from trinity.hookspecs import Register
from trinity_algos import advantage, entropy, kl, policy_loss, sample_strategy
from trinity_algos.algorithm_types import ALGORITHM_TYPES

ADVANTAGE_FNS = {
    "ppo": advantage.PPOAdvantageFn,
    "grpo": advantage.GRPOAdvantageFn,
    "opmd": advantage.OPMDAdvantageFn,
    "rloo": advantage.RLOOAdvantageFn,
    "reinforceplusplus": advantage.REINFORCEPlusPlusAdvantageFn,
    "reinforce": advantage.REINFORCEAdvantageFn,
    "asymre": advantage.AsymREAdvantageFn,
    "remax": advantage.REMAXAdvantageFn,
}

POLICY_LOSS_FNS = {
    "ppo": policy_loss.PPOPolicyLossFn,
    "opmd": policy_loss.OPMDPolicyLossFn,
    "sft": policy_loss.SFTLossFn,
    "dpo": policy_loss.DPOLossFn,
    "gspo": policy_loss.GSPOPolicyLossFn,
    "cispo": policy_loss.CISPOPolicyLossFn,
    "mix": policy_loss.MIXPolicyLossFn,
}

KL_FNS = {
    "none": kl.NoKLFn,
    "k1": kl.K1KLFn,
    "k2": kl.K2KLFn,
    "k3": kl.K3KLFn,
    "low_var_kl": kl.LowVarKLFn,
    "abs": kl.AbsKLFn,
}

ENTROPY_LOSS_FNS = {
    "default": entropy.DefaultEntropyLossFn,
    "none": entropy.NoEntropyLossFn,
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
    """ppo (GAE), grpo, opmd, rloo, reinforceplusplus, reinforce, asymre, remax."""
    _register_all(register, ADVANTAGE_FNS)


@hookimpl
def register_policy_loss_fns(register: Register) -> None:
    """ppo, opmd, sft, dpo, gspo, cispo, mix."""
    _register_all(register, POLICY_LOSS_FNS)


@hookimpl
def register_kl_fns(register: Register) -> None:
    """none, k1, k2, k3, low_var_kl, abs."""
    _register_all(register, KL_FNS)


@hookimpl
def register_entropy_loss_fns(register: Register) -> None:
    """default, none."""
    _register_all(register, ENTROPY_LOSS_FNS)


@hookimpl
def register_sample_strategies(register: Register) -> None:
    """default, warmup, mix, staleness_control."""
    _register_all(register, SAMPLE_STRATEGIES)


@hookimpl
def register_algorithm_types(register: Register) -> None:
    """ppo, grpo, dapo, opmd, asymre, rloo, reinforceplusplus, gspo, cispo, dpo, sft, mix."""
    _register_all(register, ALGORITHM_TYPES)
