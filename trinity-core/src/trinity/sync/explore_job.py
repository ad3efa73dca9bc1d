"""The explore job of a decoupled pair: when it loads its train job's weights, waits, gives up.

An explore-only stage (``mode: explore``) has no trainer of its own: its train job runs in
another process and is seen only through the job folder both share (its newest checkpoint and
its heartbeat, :mod:`trinity.sync.trainer_job`; ``sync_method: checkpoint``) or through the
version it broadcast into this job's explorer (``sync_method: nccl``). At each of its step
boundaries the step loop (:mod:`trinity.step_loop`) reads what is there and asks
:class:`ExploreJobSync` what to do; it then performs the answer (loads the checkpoint, polls
again, or explores on) and prints what the answer marks as news.

The :class:`~trinity.sync.synchronizer.Synchronizer` says which version a step needs; this
class adds what takes memory across polls: since when each needed version has been waited
for, which ones were given up (``synchronizer.sync_timeout``, or a train job that is gone or
never ran), and which reasons for not waiting were already said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from trinity.sync.trainer_job import checkpoint_wait

if TYPE_CHECKING:
    from trinity.sync.synchronizer import Synchronizer
    from trinity.sync.trainer_job import TrainerJob

#: What of an answer is news for the console: a wait starts, what it waits on changed, the
#: explorer gives up a wait (after waiting), or goes on without one (said once per reason).
Note = Literal["", "wait_starts", "wait_changes", "gives_up", "goes_on"]


@dataclass(frozen=True)
class ExploreJobStep:
    """The answer at a step boundary: ``run`` the next step, ``sync`` (load the checkpoint of
    step ``version``, then run) or ``wait`` (for version ``version``; poll again). With
    ``run``, a ``note`` of ``gives_up`` / ``goes_on`` means: without version ``version``, for
    the reason ``reason``."""

    action: Literal["run", "sync", "wait"]
    version: int
    reason: str = ""
    note: Note = ""


class ExploreJobSync:
    """One explore-only stage's sync decisions across its polls (see the module's docstring)."""

    def __init__(self, synchronizer: Synchronizer, sync_timeout: float) -> None:
        self.synchronizer = synchronizer
        self.sync_timeout = sync_timeout
        self._wait_since: dict[int, float] = {}  # needed version -> when first waited for
        self._given_up: set[int] = set()
        self._said_go_on: set[str] = set()  # the train job states already said "goes on" for
        self._last_reason = ""

    def checkpoint_step(
        self,
        explorer_step: int,
        latest_checkpoint: int,
        explorer_version: int,
        *,
        resumed: bool,
        trainer_job: Callable[[], TrainerJob],
        now: float,
    ) -> ExploreJobStep:
        """``sync_method: checkpoint``. ``latest_checkpoint``: the newest checkpoint step in the
        job folder (0: none); ``trainer_job``: reads the train job's heartbeat, called only when
        a needed checkpoint is missing; ``now``: a monotonic clock's time.

        In ``fixed`` style a sync step waits for the checkpoint it needs while a train job runs,
        at most ``sync_timeout`` seconds; a train job that is gone (killed) is given
        :data:`~trinity.sync.trainer_job.GONE_GRACE_S` to be restarted; without a train job it
        never waits (explore-then-train: nothing would come)."""
        decision = self.synchronizer.checkpoint_decision(
            explorer_step, latest_checkpoint, explorer_version, resumed=resumed
        )
        if decision.action == "sync":
            self._wait_since.pop(decision.version, None)
            return ExploreJobStep("sync", decision.version, decision.reason)
        target = decision.version
        if decision.action != "wait":
            return ExploreJobStep("run", explorer_version, decision.reason)
        if target in self._given_up:
            return ExploreJobStep("run", explorer_version, f"gave up waiting for version {target}")
        since = self._wait_since.get(target)
        waited = 0.0 if since is None else now - since
        trainer = trainer_job()
        verdict = checkpoint_wait(trainer, waited, self.sync_timeout)
        if verdict.action == "go_on":
            self._given_up.add(target)
            self._wait_since.pop(target, None)
            note: Note = ""
            if since is not None:
                note = "gives_up"  # said at the end of every wait
            elif trainer.state not in self._said_go_on:
                note = "goes_on"  # without a wait once per reason: a lone explore job would say it at every sync step
            if note:
                self._said_go_on.add(trainer.state)
            return ExploreJobStep("run", target, verdict.why, note)
        if since is None:
            self._wait_since[target] = now
            note = "wait_starts"
        else:
            note = "wait_changes" if verdict.why != self._last_reason else ""
        self._last_reason = verdict.why
        return ExploreJobStep("wait", target, verdict.why, note)

    def broadcast_step(self, explorer_step: int, explorer_version: int, *, now: float) -> ExploreJobStep:
        """``sync_method: nccl``: the train job broadcasts into this job's explorer by itself;
        in ``fixed`` style a sync step waits for the version it needs, at most
        ``sync_timeout`` seconds, then explores on with what it holds."""
        decision = self.synchronizer.broadcast_decision(explorer_step, explorer_version)
        target = decision.version
        if decision.action != "wait":
            return ExploreJobStep("run", explorer_version, decision.reason)
        if target in self._given_up:
            return ExploreJobStep("run", explorer_version, f"gave up waiting for version {target}")
        since = self._wait_since.setdefault(target, now)
        if now - since < self.sync_timeout:
            return ExploreJobStep("wait", target, decision.reason)
        self._given_up.add(target)
        return ExploreJobStep(
            "run", target, f"waited {self.sync_timeout:g}s (synchronizer.sync_timeout)", "gives_up"
        )


__all__ = ["ExploreJobStep", "ExploreJobSync", "Note"]
