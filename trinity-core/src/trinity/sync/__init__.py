"""Weight synchronisation between trainer and explorer.

- :mod:`trinity.sync.synchronizer`: the ``Synchronizer`` policy (when to wait, when to sync);
- :mod:`trinity.sync.transport`: how one stage moves the weights — a ``WeightTransport`` per
  ``sync_method`` (``memory``, ``checkpoint``, ``nccl``) with ``open`` / ``sync`` / ``close``,
  which the launcher calls;
- :mod:`trinity.sync.trainer_job`: the heartbeat by which a decoupled explore job knows that
  its train job runs (and whether to wait for the checkpoint it needs);
- :mod:`trinity.sync.explore_job`: ``ExploreJobSync``, a decoupled explore job's waits for its
  train job's weights (how long, when it gives up), which the step loop performs;
- :mod:`trinity.sync.stage_weights`: a stage's transport as the step loop uses it (opened, each
  call failing the job in one line) and a train-only stage's broadcast to its explore job;
- :mod:`trinity.sync.memory`: the trainer's weights packed as CPU tensors (``memory``);
- :mod:`trinity.sync.broadcast`: ``WeightSender`` (trainer, rank 0) and ``WeightReceiver``
  (each rollout rank) broadcasting over the group of :mod:`trinity.sync.group` (``GroupSpec``,
  NCCL when every rank has a GPU of its own, gloo otherwise) for ``nccl``.

Nothing heavy is imported here.
"""

from trinity.sync.group import GroupSpec
from trinity.sync.synchronizer import SyncDecision, Synchronizer
from trinity.sync.transport import WeightSyncFailed, WeightTransport, make_transport

__all__ = [
    "GroupSpec",
    "SyncDecision",
    "Synchronizer",
    "WeightSyncFailed",
    "WeightTransport",
    "make_transport",
]
