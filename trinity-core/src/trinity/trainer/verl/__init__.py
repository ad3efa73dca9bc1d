"""The veRL trainer back-end (``trainer.trainer_type: verl``, ``pip install './trinity-core[verl]'``).

- :mod:`~trinity.trainer.verl.config`: our config → veRL's config, ``trainer_config`` merged over
  it (pure Python, no veRL needed);
- :mod:`~trinity.trainer.verl.dataproto`: experiences → veRL's batch (``DataProto``) with veRL's
  key names, built on :func:`trinity.trainer.batch.build_batch` (the tensor part needs no veRL);
- :mod:`~trinity.trainer.verl.loss`: our policy loss, KL loss and entropy bonus as the loss
  function veRL's workers call (``set_loss_fn``);
- :mod:`~trinity.trainer.verl.trainer`: ``VerlTrainer``, the driver of veRL's FSDP worker groups
  (imports veRL and Ray; on GPUs, or on CPU with gloo);
- :mod:`~trinity.trainer.verl.workers`: the actor worker with the weight export weight sync uses;
- :mod:`~trinity.trainer.verl.platform`: veRL's platform on CPU (device ``cpu``, gloo), used
  where the cluster has no GPU.

This package is imported only when ``trainer_type: verl``; nothing here imports veRL at import
time, so the core and its tests never need it.
"""
