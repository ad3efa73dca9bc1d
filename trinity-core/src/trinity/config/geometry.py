"""The batch geometry of a job: how many tasks, rollouts and experiences make its steps.

:func:`trinity.config.resolve_config` derives it once (:func:`batch_geometry`) and keeps it on the
resolved config (``config.geometry``); the launcher, the trainer, serve mode and the veRL config
read it there rather than recomputing ``batch_size * repeat_times`` and re-looking-up the
algorithm type each on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trinity.config.models import Config

# Steps are counted in floats (train_batch_size need not be a multiple of an explore step's
# experiences); this keeps ceil() from rounding 2.0000000001 up.
_EPS = 1e-9


@dataclass(frozen=True)
class BatchGeometry:
    """The step sizes of a resolved job.

    Attributes:
        algorithm_type: the resolved ``algorithm.algorithm_type``.
        tasks_per_explore_step: ``buffer.batch_size``.
        repeat_times: rollouts per task (``algorithm.repeat_times``).
        experiences_per_train_step: ``buffer.train_batch_size`` (an upper bound for step-wise
            algorithms, whose rollouts make one experience per turn).
        step_wise: the algorithm type trains on one experience per turn (``step_wise``), so each
            train step reads exactly one explore step.
        explored_per_train_step: of ``experiences_per_train_step``, those that come from the
            explorer (``AlgorithmType.explored_per_train_step``; ``mix`` reads the rest from its
            expert buffer); ``None``: all of them.
        experiences_per_rollout: experiences a rollout of the training tasksets' workflows
            makes on average (``Workflow.experiences_per_rollout``; 1 unless a workflow trains
            more than its rollouts, as the trainable RULER's judgings).
    """

    algorithm_type: str
    tasks_per_explore_step: int
    repeat_times: int
    experiences_per_train_step: int
    step_wise: bool = False
    explored_per_train_step: int | None = None
    experiences_per_rollout: float = 1.0

    @property
    def rollouts_per_explore_step(self) -> int:
        """Trajectories an explore step makes: tasks x repeats."""
        return self.tasks_per_explore_step * self.repeat_times

    @property
    def experiences_per_explore_step(self) -> float:
        """Experiences an explore step writes, on average: its rollouts, and what the workflows
        add to them (:attr:`experiences_per_rollout`)."""
        return self.rollouts_per_explore_step * self.experiences_per_rollout

    @property
    def explore_steps_per_train_step(self) -> float:
        """Explore steps whose experiences make one training batch (1 for step-wise algorithms;
        a fraction when a training batch is smaller than an explore step's output)."""
        if self.step_wise:
            return 1.0
        explored = self.experiences_per_train_step
        if self.explored_per_train_step is not None:
            explored = self.explored_per_train_step
        return max(_EPS, explored / max(1.0, self.experiences_per_explore_step))

    def explore_steps_through(self, train_step: int) -> int:
        """The last explore step that train steps ``1..train_step`` read."""
        return math.ceil(train_step * self.explore_steps_per_train_step - _EPS)

    def train_step_reading(self, explore_step: int) -> int:
        """The train step that reads the experiences of ``explore_step``."""
        return math.ceil(explore_step / self.explore_steps_per_train_step - _EPS)


def batch_geometry(config: Config, step_wise: bool, explored: int | None = None) -> BatchGeometry:
    """The geometry of ``config`` once its buffer and algorithm are resolved (``explored``: the
    experiences of a train step that come from the explorer, if not all)."""
    b, a = config.buffer, config.algorithm
    return BatchGeometry(
        algorithm_type=a.algorithm_type,
        tasks_per_explore_step=b.batch_size,
        repeat_times=a.repeat_times,
        experiences_per_train_step=b.train_batch_size,
        step_wise=step_wise,
        # None when the explorer supplies the whole batch, so such geometries compare equal.
        explored_per_train_step=None if explored == b.train_batch_size else explored,
        experiences_per_rollout=1.0 if step_wise else _experiences_per_rollout(config),
    )


def _experiences_per_rollout(config: Config) -> float:
    """The mean of ``Workflow.experiences_per_rollout`` over the training tasksets (1 for a
    taskset whose rows name their own workflow: nothing is known of them before they run)."""
    from trinity.config.errors import ConfigError
    from trinity.plugins import get_component

    factors = []
    for i, ts in enumerate(config.buffer.explorer_input.tasksets):
        if not ts.default_workflow_type or ts.format.workflow_key:
            factors.append(1.0)
            continue
        workflow = get_component("workflow", ts.default_workflow_type)
        try:
            factors.append(float(workflow.experiences_per_rollout(ts.workflow_args or {})))
        except (TypeError, ValueError) as exc:  # a workflow arg it cannot read
            raise ConfigError(str(exc), key=f"buffer.explorer_input.tasksets[{i}].workflow_args") from None
    return sum(factors) / len(factors) if factors else 1.0
