"""Weight synchronisation between trainer and explorer.

- :mod:`trinity.sync.synchronizer`: the ``Synchronizer`` policy (when to wait, when to sync);
- :mod:`trinity.sync.memory`: weights through Ray's object store (``sync_method: memory``);
- :mod:`trinity.sync.checkpoint`: explorer reloads Hugging Face checkpoints (``checkpoint``);
- :mod:`trinity.sync.nccl`: broadcast from the trainer to every rollout worker over a process
  group of their own (``nccl``): NCCL when every rank has a GPU, gloo on CPU.

Nothing heavy is imported here.
"""

from trinity.sync.synchronizer import SyncDecision, Synchronizer

SYNC_METHODS = ("memory", "checkpoint", "nccl")

__all__ = ["SYNC_METHODS", "SyncDecision", "Synchronizer"]
