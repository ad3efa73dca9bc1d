"""Where the explorer and trainer actors run: CPU and GPU requests per role.

The GPU split follows Trinity-RFT's veRL-alignment guide: rollout engines take
``engine_num * tensor_parallel_size`` GPUs, auxiliary models theirs, the trainer the rest.
vLLM engines and veRL worker groups reserve their own GPUs (placement groups), so the actors
that drive them ask for none; the transformers engine and the native trainer run inside their
actors, so those actors ask for the GPUs themselves. On a single GPU shared by both roles,
each gets half of it (they take turns, as a colocated setup does).

Ray starts an actor that asks for one CPU with ``OMP_NUM_THREADS=1``, so torch in it uses one
core however many the machine has. :func:`cpu_shares` says how much of its node's cores each
role computing on CPU may use instead.
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


def _computes_on_cpu(config: Config, role: str, resources: dict[str, Any]) -> bool:
    """Whether ``role`` runs its model on the CPU of its own process."""
    if "num_gpus" in resources:
        return False
    if role == "explorer":
        # vLLM engines compute in their own GPU workers, whatever the actor asks for.
        return config.explorer.rollout_model.engine_type == "transformers"
    return config.trainer.trainer_type == "native"


def cpu_shares(config: Config, cluster_gpus: float) -> dict[str, float]:
    """Share of its node's CPU cores the torch threads of each CPU-computing role may use.

    The roles of a stage that compute on CPU split the cores: one alone (``train``,
    ``explore``, ``bench``) gets every core, two get half each. Even a strictly on-policy run,
    where the two mostly take turns, evaluates while the trainer trains, and torch threads that
    oversubscribe the cores slow both down several times over (measured: a 100-prompt eval took
    7.4 s instead of 1.7 s on 2 cores). Roles on a GPU, or whose back-end computes elsewhere
    (vLLM, veRL), are left out: Ray's one thread is enough to drive them.
    """
    resources = actor_resources(config, cluster_gpus)
    running = {
        "explorer": config.mode in ("both", "explore", "bench"),
        "trainer": config.mode in ("both", "train"),
    }
    on_cpu = [
        role for role, runs in running.items() if runs and _computes_on_cpu(config, role, resources[role])
    ]
    return {role: 1.0 / len(on_cpu) for role in on_cpu}
