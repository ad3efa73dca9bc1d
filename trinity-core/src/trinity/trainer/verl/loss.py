"""Our algorithm's actor loss as the loss function veRL's workers call.

veRL's training workers take their loss as a value: ``worker_group.set_loss_fn(fn)`` sends ``fn``
to every worker (pickled through Ray), and the FSDP engine calls
``fn(model_output=..., data=<micro-batch TensorDict>, dp_group=...)`` for each micro-batch and
back-propagates what it returns. :class:`ActorLoss` is that function for Trinity: it carries only
the *names and arguments* of the algorithm's loss components
(:func:`~trinity.trainer.components.algorithm_spec`), and builds the same
:class:`~trinity.trainer.components.AlgorithmComponents` as the native trainer inside the worker
on first use, after the worker process has loaded the same plugins as the driver
(``--plugin-dir`` folders travel in ``TRINITY_PLUGIN_DIRS``). Its loss is
:meth:`AlgorithmComponents.actor_loss <trinity.trainer.components.AlgorithmComponents.actor_loss>`,
the native trainer's: ``loss = policy_loss + kl_loss - entropy_bonus``.

veRL sums micro-batch losses and averages gradients over data-parallel ranks, so each
micro-batch's loss must already be scaled to its share of the global mini-batch
(:func:`global_loss_scale`); our components return micro-batch means.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer.components import LOSS_KEYS, AlgorithmComponents, algorithm_spec
from trinity.trainer.verl.dataproto import ROW_KEYS, VERL_TO_TRINITY

if TYPE_CHECKING:
    import torch

    from trinity.config import Config
else:
    torch = lazy_import("torch")


def global_loss_scale(
    mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    batch_num_tokens: float | None,
    global_batch_size: int | None,
    dp_size: int = 1,
) -> float:
    """Factor turning a micro-batch mean into its share of the global mini-batch loss.

    veRL sums the micro-batch losses of a rank and averages gradients over ``dp_size`` ranks;
    ``batch_num_tokens`` is the mini-batch's loss-mask sum over all ranks, ``global_batch_size``
    its row count over all ranks. Token-mean: micro tokens / global tokens; sequence means:
    micro sequences / global rows; ``seq-mean-token-sum-norm`` divides by a constant already.
    """
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return float(dp_size)
    if loss_agg_mode == "rows":
        # The loss already is its rows' share of the mini-batch's (``mix`` with batch sizes):
        # weight by rows, as the native trainer does.
        if not global_batch_size:
            return 1.0
        return float(mask.shape[0]) / float(global_batch_size) * dp_size
    if loss_agg_mode == "token-mean":
        if not batch_num_tokens:
            return 1.0
        return float(mask.sum()) / float(batch_num_tokens) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        if not global_batch_size:
            return 1.0
        return float((mask.sum(dim=-1) > 0).sum()) / float(global_batch_size) * dp_size
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}")


class ActorLoss:
    """The loss function handed to veRL's actor workers (see the module docstring).

    Args:
        algorithm: the component names and ``*_args`` (:meth:`from_config` builds it) and
            ``loss_agg_mode``.
        plugin_dirs: ``--plugin-dir`` folders to load in the worker before the lookup.
    """

    def __init__(self, algorithm: dict[str, Any], plugin_dirs: list[str] | None = None) -> None:
        self.algorithm = dict(algorithm)
        self.plugin_dirs = list(plugin_dirs or [])
        self._components: AlgorithmComponents | None = None

    @classmethod
    def from_config(cls, config: Config) -> ActorLoss:
        """The loss of ``config.algorithm``, with the driver's plugin folders."""
        from trinity.plugins import ENV_DIRS

        spec = algorithm_spec(config.algorithm, LOSS_KEYS)
        spec.pop("algorithm_type")  # checked on the driver; the workers need only the loss
        dirs = [d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d]
        return cls(spec, dirs)

    def __getstate__(self) -> dict[str, Any]:
        # Only names travel; the classes are looked up again in the worker's own registry.
        return {"algorithm": self.algorithm, "plugin_dirs": self.plugin_dirs, "_components": None}

    @property
    def loss_agg_mode(self) -> str:
        """How micro-batch losses are weighted: the policy loss's own mode (``mix`` with batch
        sizes weights by rows), else the section's ``loss_agg_mode``."""
        own = getattr(self.components().policy_loss_fn, "loss_agg_mode", None)
        return own or self.algorithm.get("loss_agg_mode") or "token-mean"

    def components(self) -> AlgorithmComponents:
        """The loss components, built from the names once per process (as the native trainer's)."""
        if self._components is None:
            from trinity.plugins import add_plugin_dirs

            if self.plugin_dirs:
                add_plugin_dirs(self.plugin_dirs)
            spec = {k: v for k, v in self.algorithm.items() if k != "algorithm_type"}
            self._components = AlgorithmComponents.from_spec(spec)
        return self._components

    def needs_entropy(self) -> bool:
        """Whether the loss uses entropy (veRL computes it only when asked)."""
        return self.components().needs_entropy

    def compute(
        self,
        logprob: torch.Tensor,
        entropy: torch.Tensor | None,
        tensors: dict[str, Any],
        global_step: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:meth:`AlgorithmComponents.actor_loss` with this loss's components (no scaling)."""
        return self.components().actor_loss(logprob, entropy, tensors, global_step=global_step)

    def __call__(
        self, model_output: dict[str, Any], data: Any, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict]:
        """veRL's loss-function protocol: ``model_output`` has nested ``log_probs`` (and
        ``entropy``); ``data`` is the micro-batch TensorDict with veRL's key names."""
        from verl.workers.utils.padding import no_padding_2_padding

        logprob = no_padding_2_padding(model_output["log_probs"], data)
        entropy = model_output.get("entropy")
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data)
        # TensorDict rejects `key in td`; its keys() view supports membership.
        keys = [k for k in VERL_TO_TRINITY if k in data.keys()]  # noqa: SIM118
        token_keys = [k for k in keys if k not in ROW_KEYS]
        padded = data.select(*token_keys).to_padded_tensor()
        tensors: dict[str, Any] = {VERL_TO_TRINITY[k]: padded[k] for k in token_keys}
        tensors.update({VERL_TO_TRINITY[k]: data[k] for k in keys if k in ROW_KEYS})
        tensors["action_mask"] = tensors["action_mask"].to(logprob.dtype)
        loss, metrics = self.compute(logprob, entropy, tensors, _non_tensor(data, "global_step"))
        scale = global_loss_scale(
            tensors["action_mask"],
            self.loss_agg_mode,
            batch_num_tokens=_non_tensor(data, "batch_num_tokens"),
            global_batch_size=_non_tensor(data, "global_batch_size"),
            dp_size=_non_tensor(data, "dp_size") or 1,
        )
        return loss * scale, metrics


def _non_tensor(data: Any, key: str) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=data, key=key, default=None)


__all__ = ["ActorLoss", "global_loss_scale"]
