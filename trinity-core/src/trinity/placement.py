"""Where the explorer and trainer actors run: CPU and GPU requests per role.

The GPU split follows Trinity-RFT's veRL-alignment guide: rollout engines take
``engine_num * tensor_parallel_size`` GPUs, auxiliary models theirs, the trainer the rest.
vLLM engines and veRL worker groups reserve their own GPUs (placement groups), so the actors
that drive them ask for none; the transformers engine and the native trainer run inside their
actors, so those actors ask for the GPUs themselves. On a single GPU shared by both roles,
each gets half of it (they take turns, as a colocated setup does). veRL's workers also reserve
their own CPU (one in each rank's bundle, beside its GPU where there are GPUs), so the trainer actor
driving them asks for no CPU of its own: its share of the work (advantages, batching) is small,
and a CPU it held would be one rank fewer (on 2 cores: the explorer plus one veRL rank). ``mode: colocate`` asks for
exactly that (Trinity-RFT's meaning): the two roles share one GPU however many the cluster has;
on a CPU-only cluster it runs as ``both``, the roles sharing the cores (:func:`cpu_shares`).

Actors are placed by resources only, never by node name: Ray puts each where its CPUs and GPUs
are free, on any node of the cluster the job joined (``cluster.ray_address``).

Ray starts an actor that asks for one CPU with ``OMP_NUM_THREADS=1``, so torch in it uses one
core however many the machine has. :func:`cpu_shares` says how much of its node's cores each
role computing on CPU may use instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config


_ROLE_MODES = {
    "explorer": ("both", "explore", "bench", "serve", "colocate"),
    "trainer": ("both", "train", "colocate"),
}


def runs(config: Config, role: str) -> bool:
    """Whether a stage in ``config.mode`` starts the ``role`` (``explorer``/``trainer``) actor."""
    return config.mode in _ROLE_MODES[role]


def model_in_actor(config: Config, role: str) -> bool:
    """Whether the role's model runs inside its actor's process (transformers engine, native
    trainer) rather than in workers of its own (vLLM, veRL)."""
    if role == "explorer":
        return config.explorer.rollout_model.engine_type == "transformers"
    return config.trainer.trainer_type == "native"


def actor_resources(config: Config, cluster_gpus: float) -> dict[str, dict[str, Any]]:
    """Ray ``.options()`` for the ``explorer`` and ``trainer`` actors of ``config``."""
    explorer: dict[str, Any] = {"num_cpus": 1}
    trainer: dict[str, Any] = {"num_cpus": 0 if config.trainer.trainer_type == "verl" else 1}
    if cluster_gpus <= 0:
        return {"explorer": explorer, "trainer": trainer}
    if config.mode == "colocate":
        cluster_gpus = min(cluster_gpus, 1.0)  # the roles share one GPU, whatever else is free
    explorer_gpus = 0.0
    if runs(config, "explorer") and model_in_actor(config, "explorer"):
        explorer_gpus = float(config.explorer.rollout_model.engine_num)
    trainer_gpus = 1.0 if runs(config, "trainer") and model_in_actor(config, "trainer") else 0.0
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


def takes_turns(config: Config) -> bool:
    """Whether the explorer and the trainer of the stage never compute at the same time.

    ``sync_style: fixed`` with ``sync_interval: 1`` and ``sync_offset: 0`` (strictly on-policy):
    explore step ``N + 1`` waits for the weights of train step ``N``, train step ``N + 1`` for the
    experiences of explore step ``N + 1``, and evals wait for the weights they are due on, so
    they run between train steps (``tests/launcher/test_sync_styles.py`` checks that no explore
    step or eval overlaps a train step)."""
    from trinity.sync.synchronizer import ALIASES

    sync = config.synchronizer
    style = ALIASES.get(sync.sync_style, sync.sync_style)
    return (
        config.mode in ("both", "colocate")
        and style == "fixed"
        and sync.sync_interval == 1
        and sync.sync_offset == 0
    )


def cpu_shares(config: Config, cluster_gpus: float) -> dict[str, float]:
    """Share of its node's CPU cores the torch threads of each CPU-computing role may use.

    One role computing on CPU alone (``train``, ``explore``, ``bench``) gets every core. Two
    that may compute at the same time (asynchronous sync settings) get half each: torch threads
    that oversubscribe the cores slow both down several times over (measured: a 100-prompt eval
    took 7.4 s instead of 1.7 s on 2 cores when it overlapped a train step). Two that take turns
    (:func:`takes_turns`) never compete, so each gets every core while it computes (quickstart
    GRPO on 2 cores, paired runs: 0.78 s a step against 0.85 s with one thread for the explorer
    and 1.10 s with one each; docs/performance.md). Roles on a GPU, or whose back-end computes
    elsewhere (vLLM, veRL), are left out: Ray's one thread is enough to drive them.
    """
    resources = actor_resources(config, cluster_gpus)
    on_cpu = [
        role
        for role in ("explorer", "trainer")
        if runs(config, role) and model_in_actor(config, role) and "num_gpus" not in resources[role]
    ]
    # Roles that take turns never compete for the cores; roles that may compute at once split them.
    share = 1.0 if takes_turns(config) else 1.0 / max(1, len(on_cpu))
    return {role: share for role in on_cpu}
