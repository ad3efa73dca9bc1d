"""Algorithm building blocks: base classes and masked/aggregate helpers.

The core ships no concrete algorithm; ``trinity-plugins-algos`` and third-party plugins register
subclasses of these bases through the ``trinity`` hooks. The only concrete classes here are the
null components :class:`NoKLFn` and :class:`NoEntropyLossFn`: what ``none`` means for a KL or
entropy term (``trinity-plugins-algos`` registers them under that name; without it the trainer
falls back to them, see :data:`NULL_COMPONENTS`).
"""

from trinity.algorithm.advantage import AdvantageFn
from trinity.algorithm.algorithm_type import AlgorithmType
from trinity.algorithm.entropy import EntropyLossFn, NoEntropyLossFn
from trinity.algorithm.kl import KLFn, NoKLFn
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

# What the name ``none`` means for a kind when no plugin registers it (the null components).
NULL_COMPONENTS: dict[str, type] = {"kl_fn": NoKLFn, "entropy_loss_fn": NoEntropyLossFn}

__all__ = [
    "LOSS_AGG_MODES",
    "NULL_COMPONENTS",
    "AdvantageFn",
    "AlgorithmType",
    "EntropyLossFn",
    "KLFn",
    "NoEntropyLossFn",
    "NoKLFn",
    "PolicyLossFn",
    "SampleStrategy",
    "aggregate_loss",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]
