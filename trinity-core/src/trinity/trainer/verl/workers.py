"""veRL worker classes of the Trinity back-end (imported only inside veRL's Ray workers and the
:class:`~trinity.trainer.verl.trainer.VerlTrainer`; importing this module imports veRL).

The policy loss needs no worker subclass: veRL's ``set_loss_fn`` hook takes our
:class:`~trinity.trainer.verl.loss.ActorLoss`. What veRL's actor worker lacks is a way to hand
the trained weights to a process that is not one of its own rollout engines — our explorer runs
in another Ray actor, fed by ``synchronizer.sync_method: memory`` with a state dict. This module
adds exactly that, and on CPU readies the process for veRL (see
:func:`~trinity.trainer.verl.platform.prepare_cpu_worker`).
"""

from __future__ import annotations

from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker


class TrinityActorWorker(ActorRolloutRefWorker):
    """veRL's actor worker plus :meth:`export_weights` for weight sync."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from verl.utils.device import get_device_name

        # First in the colocated worker (VerlTrainer._spawn puts the actor first): the reference
        # model's and the critic's workers share this process and start after it.
        if get_device_name() == "cpu":
            from trinity.trainer.verl.platform import prepare_cpu_worker

            prepare_cpu_worker()
        super().__init__(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self) -> dict[str, Any] | None:
        """The actor's full weights (Hugging Face names, CPU tensors) on rank 0, ``None`` elsewhere.

        Every rank iterates: gathering a sharded parameter is a collective operation, so a rank
        that skipped it would leave the others waiting.
        """
        params, _ = self.actor.engine.get_per_tensor_param()
        keep = self.rank == 0
        out: dict[str, Any] = {}
        for name, tensor in params:
            if keep:
                out[name] = tensor.detach().to("cpu", copy=True)
        return out if keep else None


__all__ = ["TrinityActorWorker"]
