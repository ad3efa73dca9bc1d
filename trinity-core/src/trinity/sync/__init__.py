"""Weight synchronisation between trainer and explorer.

- :mod:`trinity.sync.synchronizer`: the ``Synchronizer`` policy (when to wait, when to sync);
- :mod:`trinity.sync.memory`: weights through Ray's object store (``sync_method: memory``);
- :mod:`trinity.sync.checkpoint`: explorer reloads Hugging Face checkpoints (``checkpoint``);
- :mod:`trinity.sync.nccl`: GPU broadcast with vLLM (``nccl``), a clear error elsewhere.

Nothing heavy is imported here.
"""

from trinity.sync.synchronizer import SyncDecision, Synchronizer

SYNC_METHODS = ("memory", "checkpoint", "nccl")

__all__ = ["SYNC_METHODS", "SyncDecision", "Synchronizer"]
