"""Our algorithm's actor loss as the loss function veRL's workers call.

veRL's training workers take their loss as a value: ``worker_group.set_loss_fn(fn)`` sends ``fn``
to every worker (pickled through Ray), and the FSDP engine calls
``fn(model_output=..., data=<micro-batch TensorDict>, dp_group=...)`` for each micro-batch and
back-propagates what it returns. :class:`ActorLoss` is that function for Trinity: it carries only
the *names and arguments* of the algorithm's components, and looks the classes up through
:func:`trinity.plugins.get_component` inside the worker on first use, after the worker process
has loaded the same plugins as the driver (``--plugin-dir`` folders travel in
``TRINITY_PLUGIN_DIRS``). So a policy loss from a third-party plugin trains under veRL exactly as
under the native trainer: ``loss = policy_loss + kl_loss - entropy_bonus``.

veRL sums micro-batch losses and averages gradients over data-parallel ranks, so each
micro-batch's loss must already be scaled to its share of the global mini-batch
(:func:`global_loss_scale`); our components return micro-batch means.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trinity._lazy import lazy_import
from trinity.trainer.verl.dataproto import ROW_KEYS, VERL_TO_TRINITY

if TYPE_CHECKING:
    import torch

    from trinity.config import Config
else:
    torch = lazy_import("torch")

_OFF = (None, "none")
# The algorithm keys ActorLoss carries to the workers.
_KEYS = ("policy_loss_fn", "kl_loss_fn", "entropy_loss_fn")
_KINDS = {"policy_loss_fn": "policy_loss_fn", "kl_loss_fn": "kl_fn", "entropy_loss_fn": "entropy_loss_fn"}


def compose_actor_loss(
    components: dict[str, Any],
    logprob: torch.Tensor,
    entropy: torch.Tensor | None,
    tensors: dict[str, Any],
    loss_agg_mode: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``policy_loss + kl_loss - entropy_bonus`` for one micro-batch, as the native trainer forms it.

    ``tensors`` holds Trinity names (``action_mask``, ``old_logprob``, ``advantages``,
    ``ref_logprob``, …); ``components`` maps ``policy_loss_fn`` / ``kl_loss_fn`` /
    ``entropy_loss_fn`` to instances (the last two may be ``None``). Metric names carry no prefix.
    """
    from trinity.algorithm import masked_mean

    mask = tensors["action_mask"]
    kwargs = dict(tensors)
    if entropy is not None:
        kwargs["entropy"] = entropy
    loss, metrics = components["policy_loss_fn"](logprob, **kwargs)
    metrics = dict(metrics)
    total = loss
    kl_fn = components.get("kl_loss_fn")
    if kl_fn is not None:
        if "ref_logprob" not in tensors:
            raise ValueError("the KL loss needs ref_logprob, but the batch has no reference log-probs")
        kl_loss, km = kl_fn.calculate_kl_loss(logprob, tensors["ref_logprob"], mask, loss_agg_mode)
        total = total + kl_loss
        metrics.update(km)
    entropy_fn = components.get("entropy_loss_fn")
    if entropy_fn is not None:
        if entropy is None:
            raise ValueError("the entropy bonus needs entropy; ask veRL for it with calculate_entropy")
        ent_loss, em = entropy_fn(entropy, mask, loss_agg_mode=loss_agg_mode)
        total = total - ent_loss
        metrics.update(em)
    if entropy is not None:
        metrics["entropy"] = float(masked_mean(entropy.detach(), mask))
    # veRL replaces this with its own sum over micro-batches, which means the same thing.
    metrics["loss"] = float(total.detach())
    return total, metrics


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
        self._components: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, config: Config) -> ActorLoss:
        """The loss of ``config.algorithm``, with the driver's plugin folders."""
        from trinity.plugins import ENV_DIRS

        algo = config.algorithm
        spec: dict[str, Any] = {"loss_agg_mode": algo.loss_agg_mode or "token-mean"}
        for key in _KEYS:
            spec[key] = getattr(algo, key)
            spec[f"{key}_args"] = dict(getattr(algo, f"{key}_args") or {})
        dirs = [d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d]
        return cls(spec, dirs)

    def __getstate__(self) -> dict[str, Any]:
        # Only names travel; the classes are looked up again in the worker's own registry.
        return {"algorithm": self.algorithm, "plugin_dirs": self.plugin_dirs, "_components": None}

    @property
    def loss_agg_mode(self) -> str:
        return self.algorithm.get("loss_agg_mode") or "token-mean"

    def components(self) -> dict[str, Any]:
        """Instances of the policy loss, KL loss and entropy bonus (built once per process)."""
        if self._components is None:
            from trinity.plugins import add_plugin_dirs, get_component

            if self.plugin_dirs:
                add_plugin_dirs(self.plugin_dirs)
            built: dict[str, Any] = {}
            for key in _KEYS:
                name = self.algorithm.get(key)
                if name in _OFF:
                    if key == "policy_loss_fn":
                        raise ValueError("algorithm.policy_loss_fn is not set; the veRL trainer needs one")
                    built[key] = None
                    continue
                cls = get_component(_KINDS[key], name)
                args = self.algorithm.get(f"{key}_args") or {}
                try:
                    built[key] = cls(**args)
                except TypeError as exc:
                    raise ValueError(
                        f"algorithm.{key}_args do not fit {_KINDS[key]} {name!r}: {exc}"
                    ) from None
            if getattr(built["entropy_loss_fn"], "entropy_coef", None) == 0:
                built["entropy_loss_fn"] = None  # a zero-weighted bonus costs a softmax backward for nothing
            self._components = built
        return self._components

    def needs_entropy(self) -> bool:
        """Whether the loss uses entropy (veRL computes it only when asked)."""
        comps = self.components()
        return comps["entropy_loss_fn"] is not None or "entropy" in comps["policy_loss_fn"].required_tensors()

    def compute(
        self, logprob: torch.Tensor, entropy: torch.Tensor | None, tensors: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:func:`compose_actor_loss` with this loss's components (no scaling)."""
        return compose_actor_loss(self.components(), logprob, entropy, tensors, self.loss_agg_mode)

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
        loss, metrics = self.compute(logprob, entropy, tensors)
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


__all__ = ["ActorLoss", "compose_actor_loss", "global_loss_scale"]
