"""Advantage functions (kind ``advantage_fn``)."""

from trinity_algos.advantage.distill import JSDAdvantageFn, OnPolicyDistillAdvantageFn
from trinity_algos.advantage.group import AsymREAdvantageFn, GRPOAdvantageFn, OPMDAdvantageFn, RLOOAdvantageFn
from trinity_algos.advantage.rec import RECAdvantageFn
from trinity_algos.advantage.returns import (
    PPOAdvantageFn,
    REINFORCEAdvantageFn,
    REINFORCEPlusPlusAdvantageFn,
    REMAXAdvantageFn,
)
from trinity_algos.advantage.step_wise import GiGPOAdvantageFn, StepWiseGRPOAdvantageFn
from trinity_algos.advantage.token_filter import ClipBAdvantageFn, ClipVAdvantageFn
from trinity_algos.advantage.verl import AsymREVerlAdvantageFn, GRPOVerlAdvantageFn, OPMDVerlAdvantageFn

__all__ = [
    "AsymREAdvantageFn",
    "AsymREVerlAdvantageFn",
    "ClipBAdvantageFn",
    "ClipVAdvantageFn",
    "GRPOAdvantageFn",
    "GRPOVerlAdvantageFn",
    "GiGPOAdvantageFn",
    "JSDAdvantageFn",
    "OPMDAdvantageFn",
    "OPMDVerlAdvantageFn",
    "OnPolicyDistillAdvantageFn",
    "PPOAdvantageFn",
    "RECAdvantageFn",
    "REINFORCEAdvantageFn",
    "REINFORCEPlusPlusAdvantageFn",
    "REMAXAdvantageFn",
    "RLOOAdvantageFn",
    "StepWiseGRPOAdvantageFn",
]
