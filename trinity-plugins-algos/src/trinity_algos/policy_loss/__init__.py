"""Policy losses (kind ``policy_loss_fn``)."""

from trinity_algos.policy_loss.dpo import DPOLossFn
from trinity_algos.policy_loss.importance import CISPOPolicyLossFn, GSPOPolicyLossFn
from trinity_algos.policy_loss.mix import MIXPolicyLossFn
from trinity_algos.policy_loss.ppo import PPOPolicyLossFn
from trinity_algos.policy_loss.sft import OPMDPolicyLossFn, SFTLossFn

__all__ = [
    "CISPOPolicyLossFn",
    "DPOLossFn",
    "GSPOPolicyLossFn",
    "MIXPolicyLossFn",
    "OPMDPolicyLossFn",
    "PPOPolicyLossFn",
    "SFTLossFn",
]
