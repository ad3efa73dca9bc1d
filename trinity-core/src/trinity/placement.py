"""Where the explorer and trainer actors run: CPU and GPU requests per role.

The GPU split follows Trinity-RFT's veRL-alignment guide: rollout engines take
``engine_num * tensor_parallel_size`` GPUs, auxiliary models theirs, the trainer the rest.
vLLM engines and veRL worker groups reserve their own GPUs (placement groups), so the actors
that drive them ask for none; the transformers engine and the native trainer run inside their
actors, so those actors ask for the GPUs themselves. On a single GPU shared by both roles,
each gets half of it (they take turns, as a colocated setup does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config


def actor_resources(config: Config, cluster_gpus: float) -> dict[str, dict[str, Any]]:
    """Ray ``.options()`` for the ``explorer`` and ``trainer`` actors of ``config``."""
    explorer: dict[str, Any] = {"num_cpus": 1}
    trainer: dict[str, Any] = {"num_cpus": 1}
    if cluster_gpus <= 0:
        return {"explorer": explorer, "trainer": trainer}
    runs_explorer = config.mode in ("both", "explore", "bench")
    runs_trainer = config.mode in ("both", "train")
    rollout = config.explorer.rollout_model
    explorer_gpus = 0.0
    if runs_explorer and rollout.engine_type == "transformers":
        explorer_gpus = float(rollout.engine_num)
    trainer_gpus = 1.0 if runs_trainer and config.trainer.trainer_type == "native" else 0.0
    if explorer_gpus + trainer_gpus > cluster_gpus:
        if explorer_gpus and trainer_gpus and cluster_gpus >= 1:
            explorer_gpus = trainer_gpus = cluster_gpus / 2
        else:
            explorer_gpus = min(explorer_gpus, cluster_gpus)
            trainer_gpus = min(trainer_gpus, cluster_gpus)
    if explorer_gpus:
        explorer["num_gpus"] = explorer_gpus
    if trainer_gpus:
        trainer["num_gpus"] = trainer_gpus
    return {"explorer": explorer, "trainer": trainer}
