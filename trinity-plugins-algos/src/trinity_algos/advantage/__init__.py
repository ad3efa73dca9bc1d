"""Advantage functions (kind ``advantage_fn``)."""

from trinity_algos.advantage.group import AsymREAdvantageFn, GRPOAdvantageFn, OPMDAdvantageFn, RLOOAdvantageFn
from trinity_algos.advantage.returns import (
    PPOAdvantageFn,
    REINFORCEAdvantageFn,
    REINFORCEPlusPlusAdvantageFn,
    REMAXAdvantageFn,
)

__all__ = [
    "AsymREAdvantageFn",
    "GRPOAdvantageFn",
    "OPMDAdvantageFn",
    "PPOAdvantageFn",
    "REINFORCEAdvantageFn",
    "REINFORCEPlusPlusAdvantageFn",
    "REMAXAdvantageFn",
    "RLOOAdvantageFn",
]
