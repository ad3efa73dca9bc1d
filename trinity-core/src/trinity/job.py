"""What a job's parts hand each other: exit codes, the job's error, stage and step results.

A leaf module (it imports nothing of trinity), so that the launcher (:mod:`trinity.launcher`),
the step loop (:mod:`trinity.step_loop`), the actors (:mod:`trinity.actors`) and serve mode
(:mod:`trinity.serving.serve`) can all use these types without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: ``trinity run``'s exit codes. A stage stopped by a signal exits ``128 + signal`` (130 for
#: Ctrl-C, 143 for SIGTERM), as a shell reports it.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class JobFailed(RuntimeError):
    """An actor failed; the message says which one and why."""


@dataclass
class StageResult:
    """How one stage ended: the steps each role finished, the final weights, the last metrics."""

    name: str
    trainer_steps: int
    explorer_steps: int
    final_checkpoint: str | None
    metrics: dict[str, float]
    shortfall: str | None = None  # what the stage did not do that it was asked to


@dataclass
class ExploreStepResult:
    """One finished explore step, as the explorer actor returns it to the step loop.

    ``failures`` is the console's line about the step's failed tasks (how many, the first error;
    ``None`` when none failed): printed, never plotted."""

    metrics: dict[str, float]
    failures: str | None = None


@dataclass
class TrainStepResult:
    """One finished train step, as the trainer actor returns it to the step loop.

    ``reader_position`` is the experience reader's state after the step: when the job is
    interrupted during the next step, the rows read after it are given back (made unread)."""

    metrics: dict[str, float]
    reader_position: dict[str, Any] = field(default_factory=dict)


__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "ExploreStepResult",
    "JobFailed",
    "StageResult",
    "TrainStepResult",
]
