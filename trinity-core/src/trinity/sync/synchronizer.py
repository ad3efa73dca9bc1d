"""When the explorer waits for, and loads, the trainer's weights: pure scheduling logic.

Steps count *finished* steps: the explorer has produced ``explorer_step`` batches, the trainer
has trained on ``trainer_step`` of them; weights after trainer step ``t`` are version ``t``
(version 0 = the initial model). Trainer step ``t`` trains on the experiences of explorer step
``t`` in every style: that data dependency is the only thing the trainer waits for, besides
the ``trainer_driven`` hold below. The launcher's step loop asks :meth:`Synchronizer.explorer_decision`
whenever the explorer is between steps, and :meth:`Synchronizer.trainer_holds` whenever the
trainer is; it moves the weights through the stage's weight transport only while *both* actors
are between steps (an actor runs one call at a time, so a sync in the middle of a step would
queue behind it). The explorer's lead is ``explorer_step + 1 - trainer_step`` for the step it
would start; ``max_lead = sync_offset + sync_interval`` bounds it in every style.

Who waits for what:

``fixed`` (Trinity-RFT's default): after explorer step ``e`` with ``e > sync_offset`` and
``(e - sync_offset) % sync_interval == 0`` the explorer needs version ``e - sync_offset``: it
waits for the trainer to reach that step (and to finish the step it is on), then syncs.
``sync_offset`` lets the explorer run that many steps ahead (asynchronous RL);
``sync_interval 1, sync_offset 0`` is strictly on-policy (explore 1, train 1, sync, explore 2).

``explorer_driven`` (alias ``dynamic_by_explorer``): the explorer decides. At the same sync
points as ``fixed`` it loads whatever version the trainer holds at that moment, waiting only
for the train step in flight to end (never for a version); outside sync points it runs on.

``trainer_driven`` (alias ``dynamic_by_trainer``): the trainer decides. After every
``trainer_sync_interval`` of its steps it publishes its weights and does not start its next
step until the explorer loaded them, which the explorer does at its next step boundary,
whatever step that is. The explorer never waits for a version.

``fully_async``: nobody holds for a sync. The trainer publishes every ``trainer_sync_interval``
steps; the explorer loads the newest published version whenever it is between steps and the
trainer happens to be too (when the trainer waits for data, or the explorer for the lead).

``dynamic`` (accepted from older configs) means ``fully_async``.

Explore-only jobs (``mode: explore``, the trainer in another process) see the trainer's
progress only as the newest checkpoint in the job dir (:meth:`Synchronizer.checkpoint_decision`)
or, with ``sync_method: nccl``, as the version the train job broadcast into their explorer
(:meth:`Synchronizer.broadcast_decision`); how long they wait for it, and when they give up,
is :class:`trinity.sync.explore_job.ExploreJobSync`'s to decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trinity.config import SynchronizerConfig

Action = Literal["run", "wait", "sync"]
_STYLES = ("fixed", "explorer_driven", "trainer_driven", "fully_async")
# Older names, and what they mean here.
ALIASES = {
    "dynamic": "fully_async",
    "dynamic_by_explorer": "explorer_driven",
    "dynamic_by_trainer": "trainer_driven",
}


@dataclass(frozen=True)
class SyncDecision:
    """What the explorer does next: ``run`` its next step, ``wait`` for the trainer (to reach
    step ``version``), or ``sync`` (load the trainer's weights, at least version ``version``;
    then ask again)."""

    action: Action
    version: int
    reason: str = ""


class Synchronizer:
    """The ``synchronizer`` section's policy (``sync_interval``, ``sync_offset``, ``sync_style``).

    ``trainer_sync_interval`` (default ``sync_interval``) is how often the trainer publishes in
    the ``trainer_driven`` and ``fully_async`` styles, and how often a train-only job saves the
    checkpoints a separate explorer job loads.
    """

    def __init__(
        self,
        sync_interval: int = 1,
        sync_offset: int = 0,
        sync_style: str = "fixed",
        trainer_sync_interval: int | None = None,
    ) -> None:
        if sync_interval < 1:
            raise ValueError(f"synchronizer.sync_interval must be >= 1, got {sync_interval}")
        if sync_offset < 0:
            raise ValueError(f"synchronizer.sync_offset must be >= 0, got {sync_offset}")
        style = ALIASES.get(sync_style, sync_style)
        if style not in _STYLES:
            names = ", ".join((*_STYLES, *ALIASES))
            raise ValueError(f"synchronizer.sync_style {sync_style!r} is not one of: {names}")
        self.sync_interval = sync_interval
        self.sync_offset = sync_offset
        self.sync_style = style
        self.trainer_sync_interval = trainer_sync_interval or sync_interval

    @classmethod
    def from_config(cls, config: SynchronizerConfig) -> Synchronizer:
        """Built from ``config.synchronizer`` (``explorer_sync_interval`` /
        ``trainer_sync_interval`` win over ``sync_interval`` for their side when set)."""
        return cls(
            config.explorer_sync_interval or config.sync_interval,
            config.sync_offset,
            config.sync_style,
            config.trainer_sync_interval or config.sync_interval,
        )

    @property
    def max_lead(self) -> int:
        """Most steps the explorer may be ahead of the trainer (counting the one it starts)."""
        return self.sync_offset + self.sync_interval

    def is_sync_step(self, explorer_step: int) -> bool:
        """Is finishing ``explorer_step`` one of the explorer's sync points (``fixed`` and
        ``explorer_driven``)?"""
        e = explorer_step - self.sync_offset
        return e > 0 and e % self.sync_interval == 0

    def last_sync_step(self, explorer_step: int) -> int:
        """The newest of the explorer's sync points at or before ``explorer_step`` (0: none)."""
        e = explorer_step - self.sync_offset
        if e < self.sync_interval:
            return 0
        return e - e % self.sync_interval + self.sync_offset

    def published_version(self, trainer_step: int) -> int:
        """The newest version the trainer has published after ``trainer_step`` steps
        (``trainer_driven``, ``fully_async``; and a train-only job's checkpoints)."""
        return trainer_step - trainer_step % self.trainer_sync_interval

    def is_publish_step(self, trainer_step: int) -> bool:
        """Does the trainer publish its weights after ``trainer_step``?"""
        return trainer_step > 0 and trainer_step % self.trainer_sync_interval == 0

    def explorer_decision(
        self,
        explorer_step: int,
        trainer_step: int,
        explorer_version: int,
        trainer_busy: bool = False,
        trainer_done: bool = False,
    ) -> SyncDecision:
        """What the explorer does after ``explorer_step`` finished steps, the trainer having
        finished ``trainer_step`` (and running one more when ``trainer_busy``) and the explorer
        holding weights ``explorer_version``. ``sync`` is only answered while the trainer is
        not busy. Once the trainer is done (``trainer_done``) no more versions will come: the
        explorer loads the last one if it does not hold it, and never waits."""
        e, t, v = explorer_step, trainer_step, explorer_version
        if trainer_done:
            if t > v:
                return SyncDecision("sync", t, "the trainer finished")
            return SyncDecision("run", v, "the trainer finished")
        style = self.sync_style
        if style == "fixed" and self.is_sync_step(e):
            target = e - self.sync_offset
            if v < target:
                if t < target:
                    return SyncDecision("wait", target, f"sync step: trainer has {t} of {target} steps")
                if trainer_busy:
                    return SyncDecision("wait", t + 1, f"sync step: trainer is finishing step {t + 1}")
                return SyncDecision("sync", target, f"sync step: load version {target} or newer")
        if style == "explorer_driven" and self.is_sync_step(e):
            if trainer_busy and v <= t:
                return SyncDecision("wait", t + 1, f"sync point: trainer is finishing step {t + 1}")
            if t > v:
                return SyncDecision("sync", t, f"sync point: load the trainer's version {t}")
        if style in ("trainer_driven", "fully_async"):
            available = self.published_version(t)
            if available > v and not trainer_busy:
                return SyncDecision("sync", available, f"trainer published version {available}")
        if e + 1 - t > self.max_lead:
            need = e + 1 - self.max_lead
            return SyncDecision("wait", need, f"explorer would be more than {self.max_lead} steps ahead")
        return SyncDecision("run", v, "within the allowed lead")

    def trainer_holds(self, trainer_step: int, explorer_version: int) -> bool:
        """``trainer_driven``: after a publish step the trainer starts no new step until the
        explorer loaded that version."""
        return (
            self.sync_style == "trainer_driven"
            and self.is_publish_step(trainer_step)
            and explorer_version < trainer_step
        )

    def checkpoint_decision(
        self, explorer_step: int, latest_checkpoint: int, explorer_version: int, resumed: bool = False
    ) -> SyncDecision:
        """Explore-only jobs: the trainer runs elsewhere and its progress is the newest
        checkpoint step on disk. ``fixed`` waits at sync steps for the needed checkpoint (the
        launcher bounds the wait, and waits only while a train job runs); ``explorer_driven``
        loads the newest one at its sync points; ``trainer_driven`` and ``fully_async`` whenever
        a newer one exists. Nothing bounds the lead: the other job's steps are not visible
        between checkpoints.

        ``resumed``: the explorer was restarted at ``explorer_step`` with the initial weights;
        it first catches up on its last sync point (:meth:`last_sync_step`), as if it were
        there, so a restart between sync points does not explore on with version 0."""
        e, c, v = explorer_step, latest_checkpoint, explorer_version
        if resumed and self.sync_style in ("fixed", "explorer_driven"):
            e = self.last_sync_step(e) or e
        if self.sync_style in ("fixed", "explorer_driven"):
            if not self.is_sync_step(e):
                return SyncDecision("run", v, "not a sync step")
            target = e - self.sync_offset
            if self.sync_style == "fixed" and v < target and c < target:
                return SyncDecision(
                    "wait", target, f"sync step: newest checkpoint is step {c}, need {target}"
                )
        if c > v:
            return SyncDecision("sync", c, f"load checkpoint of step {c}")
        return SyncDecision("run", v, "no newer checkpoint")

    def broadcast_decision(self, explorer_step: int, explorer_version: int) -> SyncDecision:
        """Explore-only jobs whose train job broadcasts its weights into their explorer
        (``sync_method: nccl`` across a decoupled pair): the weights arrive by themselves, so
        the explorer only ever waits, in ``fixed`` style at a sync step for the version it
        needs (the caller bounds the wait by ``synchronizer.sync_timeout``)."""
        e, v = explorer_step, explorer_version
        if self.sync_style != "fixed" or not self.is_sync_step(e):
            return SyncDecision("run", v, "not a sync step")
        target = e - self.sync_offset
        if v >= target:
            return SyncDecision("run", v, f"holds version {v}")
        return SyncDecision("wait", target, f"sync step: needs version {target}")


__all__ = ["ALIASES", "SyncDecision", "Synchronizer"]
