"""Base class of policy losses."""

from __future__ import annotations

import inspect
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from trinity.algorithm.component import Component

if TYPE_CHECKING:
    import torch


class PolicyLossFn(Component):
    """A policy loss: ``__call__(logprob, **tensors) -> (loss, metrics)``.

    The trainer passes every tensor it has by keyword (``old_logprob``, ``ref_logprob``,
    ``action_mask``, ``advantages``, ``entropy``, ``expert_mask``, ...). A loss names the ones it
    needs in its ``__call__`` signature and accepts ``**kwargs`` for the rest; the trainer reads
    :meth:`required_tensors` to know what it must compute.

    ``loss`` is a scalar tensor that carries gradients; ``metrics`` maps names to floats.
    """

    def __init__(self, loss_agg_mode: str = "token-mean") -> None:
        self.loss_agg_mode = loss_agg_mode

    # ``*args: Any, **kwargs: Any`` makes the signature after ``logprob`` open to type checkers
    # (the typing spec reads it as ``...``), so a subclass may declare the tensors it needs by
    # name without ``# type: ignore[override]``. The trainer passes tensors by keyword only.
    @abstractmethod
    def __call__(
        self, logprob: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Compute the loss from current ``logprob`` ``(B, T)`` and the named tensors."""

    @classmethod
    def required_tensors(cls) -> list[str]:
        """Names of the tensors (besides ``logprob``) this loss declares in ``__call__``."""
        params = inspect.signature(cls.__call__).parameters
        return [
            n
            for n, p in params.items()
            if n not in ("self", "logprob") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
