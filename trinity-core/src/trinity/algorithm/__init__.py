"""Algorithm building blocks: base classes and masked/aggregate helpers.

The core ships no concrete algorithm; ``trinity-plugins-algos`` and third-party plugins register
subclasses of these bases through the ``trinity`` hooks.
"""

from trinity.algorithm.advantage import AdvantageFn
from trinity.algorithm.algorithm_type import AlgorithmType
from trinity.algorithm.entropy import EntropyLossFn
from trinity.algorithm.kl import KLFn
from trinity.algorithm.masked import (
    LOSS_AGG_MODES,
    aggregate_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from trinity.algorithm.policy_loss import PolicyLossFn
from trinity.algorithm.sample_strategy import SampleStrategy

__all__ = [
    "LOSS_AGG_MODES",
    "AdvantageFn",
    "AlgorithmType",
    "EntropyLossFn",
    "KLFn",
    "PolicyLossFn",
    "SampleStrategy",
    "aggregate_loss",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]
