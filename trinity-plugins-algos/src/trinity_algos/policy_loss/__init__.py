"""Policy losses (kind ``policy_loss_fn``)."""

from trinity_algos.policy_loss.chord import MIXCHORDPolicyLossFn, SFTISLossFn, SFTPhiLossFn
from trinity_algos.policy_loss.dpo import DPOLossFn
from trinity_algos.policy_loss.importance import (
    CISPOPolicyLossFn,
    GSPOPolicyLossFn,
    ImportanceSamplingPolicyLossFn,
)
from trinity_algos.policy_loss.m2po import M2POPolicyLossFn
from trinity_algos.policy_loss.mix import MIXPolicyLossFn
from trinity_algos.policy_loss.ppo import PPOPolicyLossFn
from trinity_algos.policy_loss.rec import RECPolicyLossFn
from trinity_algos.policy_loss.sapo import SAPOPolicyLossFn
from trinity_algos.policy_loss.sft import OPMDPolicyLossFn, SFTLossFn
from trinity_algos.policy_loss.sppo import SPPOPolicyLossFn
from trinity_algos.policy_loss.topr import TOPRPolicyLossFn

__all__ = [
    "CISPOPolicyLossFn",
    "DPOLossFn",
    "GSPOPolicyLossFn",
    "ImportanceSamplingPolicyLossFn",
    "M2POPolicyLossFn",
    "MIXCHORDPolicyLossFn",
    "MIXPolicyLossFn",
    "OPMDPolicyLossFn",
    "PPOPolicyLossFn",
    "RECPolicyLossFn",
    "SAPOPolicyLossFn",
    "SFTISLossFn",
    "SFTLossFn",
    "SFTPhiLossFn",
    "SPPOPolicyLossFn",
    "TOPRPolicyLossFn",
]
