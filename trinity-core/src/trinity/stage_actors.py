"""The explorer and trainer actors of a job's stages, kept from one stage for the next.

A new actor is a new Python process. It imports torch and transformers and builds its model
again. On 2 CPU cores that is 3 to 8 s a stage, more than a short stage's steps. So a stage
that ended well hands its actor to the job's next stage when that stage starts the same role
with the same Ray options (name, resources) and the role's model lives inside the
actor: the transformers engine (and transformers auxiliary models), the native trainer. What a
vLLM engine or a veRL worker holds lives in Ray workers and placement groups of its own, which a
stage's end removes (:func:`trinity.cluster.end_stage`), so those actors are never kept.

The next stage calls the kept actor's ``restart`` with its own config. That stops the previous
stage's part (engines, servers, model, optimizer) and builds the role anew from the config, as a
new actor would. Jobs that join a cluster disconnect after each stage and keep nothing.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from trinity.placement import actor_resources, model_in_actor, runs

if TYPE_CHECKING:
    from trinity.config import Config

ROLES = ("explorer", "trainer")


def actor_options(config: Config, role: str, cluster_gpus: float) -> dict[str, Any]:
    """Ray ``.options()`` of the ``role``'s actor in a stage of ``config``.

    The namespace is explicit: a later stage runs on the Ray (and the driver's namespace) of
    the first."""
    name = config.explorer.name if role == "explorer" else config.trainer.name
    return {"name": name, "namespace": config.ray_namespace, **actor_resources(config, cluster_gpus)[role]}


def can_restart(config: Config, role: str) -> bool:
    """Whether the ``role``'s actor of a stage of ``config`` may serve another stage: it holds
    all of its state in its own process (a restart in place leaves nothing of the stage behind),
    and nobody looks it up by its name. A kept actor keeps the name it has in the first stage's
    Ray namespace, and each stage has a namespace of its own; the explorer of an ``explore``
    stage is looked up by name (a decoupled train job's ``nccl`` broadcasts find it so), and a
    ``serve`` stage starts actors of its own (:mod:`trinity.serving.serve`)."""
    if config.mode in ("explore", "serve") or not runs(config, role) or not model_in_actor(config, role):
        return False
    if role == "explorer":
        return all(aux.engine_type == "transformers" for aux in config.explorer.auxiliary_models)
    return True


def _resources(options: dict[str, Any]) -> dict[str, Any]:
    """What of an actor's Ray options a kept actor must match: all but its namespace."""
    return {key: value for key, value in options.items() if key != "namespace"}


class StageActors:
    """Starts a stage's actors, restarting the ones the previous stage kept.

    ``next_stage``: the job's next stage (its resolved config) while a stage runs, ``None`` for
    the last one. The launcher sets it before each stage."""

    def __init__(self) -> None:
        self.next_stage: Config | None = None
        self._kept: dict[str, tuple[Any, dict[str, Any]]] = {}

    def start(
        self, ray: Any, config: Config, role: str, options: dict[str, Any], cpu_share: float | None
    ) -> tuple[Any, dict[str, Any], Any]:
        """The ``role``'s actor for the stage ``config``, its Ray options and the reference to
        wait on until it is up: the kept actor restarted when it has these ``options`` (but for
        the namespace: it keeps its first stage's), else a new one."""
        from trinity.actors import ExplorerActor, TrainerActor

        kept = self._kept.pop(role, None)
        if kept is not None:
            actor, kept_options = kept
            if _resources(kept_options) == _resources(options):
                return actor, kept_options, actor.restart.remote(config, cpu_share)
            self._kill(ray, [(actor, kept_options)])
        actor_class = ExplorerActor if role == "explorer" else TrainerActor
        actor = actor_class.options(**options).remote(config, cpu_share)
        return actor, options, actor.ready.remote()

    def keep(
        self, config: Config, role: str, actor: Any, options: dict[str, Any], cluster_gpus: float
    ) -> bool:
        """Keep ``actor`` (the ``role`` of the stage ``config``, which ended well) for the next
        stage if that stage wants it as it is; ``False``: the caller kills it."""
        from trinity.config.resolve import joins_cluster

        following = self.next_stage
        if following is None or joins_cluster(config):
            return False
        if not (can_restart(config, role) and can_restart(following, role)):
            return False
        if _resources(actor_options(following, role, cluster_gpus)) != _resources(options):
            return False
        self._kept[role] = (actor, options)
        return True

    def kill_kept(self, ray: Any) -> None:
        """Kill the actors kept for a stage that will not run (a failed or stopped job)."""
        kept, self._kept = list(self._kept.values()), {}
        self._kill(ray, kept)

    @staticmethod
    def _kill(ray: Any, actors: list[tuple[Any, dict[str, Any]]]) -> None:
        from trinity.cluster import wait_until_names_free

        wait_until_names_free(ray, kill_actors(ray, actors))


def kill_actors(ray: Any, actors: list[tuple[Any, dict[str, Any]]]) -> list[tuple[str, str]]:
    """Kill ``(actor, its Ray options)`` pairs; returns their ``(name, namespace)``, which Ray
    lets go of shortly after (:func:`trinity.cluster.wait_until_names_free`)."""
    for actor, _ in actors:
        with contextlib.suppress(Exception):  # the actor may already be gone
            ray.kill(actor)
    return [(options["name"], options["namespace"]) for _, options in actors]
