"""Trainer back-ends and their building blocks.

- :mod:`trinity.trainer.batch`: experiences → padded tensors, a :class:`~trinity.trainer.batch.TrainBatch`
  (typed fields, never changed in place; veRL layout, DPO pairs);
- :mod:`trinity.trainer.step`: the one training step every back-end runs over its primitives;
- :mod:`trinity.trainer.components`: the algorithm runtime both back-ends share
  (``AlgorithmComponents``: components built once, the ``none`` rules, one ``actor_loss``);
- :mod:`trinity.trainer.backend`: ``TrainerBackend``, what the ``Trainer`` calls on a back-end;
- :mod:`trinity.trainer.native`: ``NativeTrainer`` (``trainer.trainer_type: native``);
- :mod:`trinity.trainer.verl`: ``VerlTrainer`` on veRL's FSDP workers (``trainer_type: verl``, GPU or CPU);
- :mod:`trinity.trainer.checkpoint`: ``global_step_N`` folders, resume, Trinity-RFT's rename rule;
- :mod:`trinity.trainer.schedule`, :mod:`~trinity.trainer.micro_batch`,
  :mod:`~trinity.trainer.forward`, :mod:`~trinity.trainer.critic`, :mod:`~trinity.trainer.metrics`.

Nothing heavy is imported here; import the submodule you need.
"""
