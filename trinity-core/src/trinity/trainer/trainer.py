"""The Trainer role: sample strategy + backend + checkpoints + resume.

The backend (``native`` here, ``verl`` on GPUs) turns a list of experiences into a gradient
step; this class decides *which* experiences (through the algorithm's sample strategy reading
the experience buffer and auxiliary buffers), counts steps, saves checkpoints every
``trainer.save_interval`` steps together with the buffer readers' and the sample strategy's
state, and restores all of it when ``continue_from_checkpoint`` is set.

Trainer step ``t`` trains on the experiences of the explorer's steps up to the one that
completes ``t * train_batch_size`` experiences (step ``t`` itself when one explorer step makes
one batch). When tasks of those steps failed, it trains on what arrived once the explorer ended
them; when none arrived it is an *empty step*: counted (``trainer/empty_step``), the weights
unchanged, so trainer and explorer steps stay aligned. Waiting longer than the buffer's
``max_read_timeout`` with nothing read is an error (:class:`ExperienceTimeout`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.trainer.backend import TrainerBackend

logger = logging.getLogger(__name__)


class ExperienceTimeout(RuntimeError):
    """The trainer waited the buffer's ``max_read_timeout`` and no experience came."""


def _build_backend(config: Config) -> TrainerBackend:
    kind = config.trainer.trainer_type
    if kind in ("native", "auto"):
        from trinity.trainer.native import NativeTrainer

        return NativeTrainer(config)
    if kind == "verl":
        import importlib.util

        # Checked first so a missing extra reads as what to install, not as a deep ImportError.
        if importlib.util.find_spec("verl") is None:
            from trinity.plugins import install_hint

            raise RuntimeError(
                "trainer.trainer_type 'verl' needs veRL, which is not installed: "
                f"{install_hint('trinity-core', extra='verl')} (GPUs required), or use trainer_type: native"
            )
        from trinity.trainer.verl.trainer import VerlTrainer

        return VerlTrainer(config)
    raise ValueError(f"trainer.trainer_type {kind!r}: use native or verl")


class Trainer:
    """One training job's trainer; ``train_step()`` returns metrics, or ``None`` when the
    buffers are exhausted."""

    def __init__(self, config: Config, backend: TrainerBackend | None = None) -> None:
        from trinity.buffer.factory import get_buffer_reader
        from trinity.plugins import get_component

        self.config = config
        self.backend: TrainerBackend = backend if backend is not None else _build_backend(config)
        trainer_input = config.buffer.trainer_input
        tokenizer = self.backend.tokenizer
        cache_dir = config.buffer.cache_dir
        self.experience_reader = get_buffer_reader(
            trainer_input.experience_buffer, tokenizer=tokenizer, cache_dir=cache_dir
        )
        self.auxiliary_readers = {
            name: get_buffer_reader(cfg, tokenizer=tokenizer, cache_dir=cache_dir)
            for name, cfg in (trainer_input.auxiliary_buffers or {}).items()
        }
        algo = config.algorithm
        strategy_cls = get_component("sample_strategy", algo.sample_strategy)
        self.sample_strategy = strategy_cls(
            experience_buffer=self.experience_reader,
            auxiliary_buffers=self.auxiliary_readers,
            train_batch_size=config.buffer.train_batch_size,
            **(algo.sample_strategy_args or {}),
        )
        self.geometry = config.geometry
        self.step_wise = self.geometry.step_wise
        self._warned_split = False
        self.last_saved_step = -1
        if config.continue_from_checkpoint:
            extra = self.backend.load_checkpoint()
            if extra is not None:
                self._load_extra(extra)
                self.last_saved_step = self.step
                logger.info("resumed trainer at step %d", self.step)

    @property
    def step(self) -> int:
        return self.backend.global_step

    def train_step(self) -> dict[str, float] | None:
        """Sample one batch and train on it; ``None`` when no more experiences will come.

        Raises :class:`ExperienceTimeout` when nothing arrived within ``max_read_timeout``.
        """
        from trinity.buffer.base import STEP_ENDED, TIMED_OUT, BufferExhausted

        next_step = self.step + 1
        reader = self.experience_reader
        reader.set_step(next_step)  # the SQL buffer records it as each row's consumed_step
        reader.expect_step(self.geometry.explore_steps_through(next_step))
        self.sample_strategy.set_model_version(self.step)
        try:
            experiences, sample_metrics = self.sample_strategy.sample(next_step)
        except BufferExhausted:
            logger.info("experience buffer exhausted after %d steps", self.step)
            return None
        if not experiences and reader.short_reason == TIMED_OUT:
            gone = getattr(reader, "writers_gone", None)
            if gone:
                raise ExperienceTimeout(f"trainer step {next_step}: no experience: {gone}")
            timeout = self.config.buffer.trainer_input.experience_buffer.max_read_timeout
            raise ExperienceTimeout(
                f"trainer step {next_step}: no experience arrived within "
                f"buffer.trainer_input.experience_buffer.max_read_timeout ({timeout} s); "
                "the explorer is slower than that, or stopped writing"
            )
        wanted = self.config.buffer.train_batch_size
        if not experiences:
            return self._empty_step(next_step)
        # Step-wise algorithms take one explorer step, train_batch_size only bounding it: a
        # step that ended short of it is the normal case, not a loss.
        normal_end = self.step_wise and reader.short_reason == STEP_ENDED
        if len(experiences) < wanted and not normal_end:
            logger.warning(
                "trainer step %d: training on %d of %d experiences (%s: the explorer's tasks "
                "failed or were dropped)",
                next_step,
                len(experiences),
                wanted,
                reader.short_reason or "short sample",
            )
        if self.step_wise and len(experiences) >= wanted and not self._warned_split:
            self._warned_split = True
            logger.warning(
                "trainer step %d: read buffer.train_batch_size (%d) experiences before explorer "
                "step %d ended, so its episodes may be split across training steps; for step-wise "
                "algorithms set train_batch_size to an upper bound (batch_size x repeat_times x "
                "the most turns of an episode)",
                next_step,
                wanted,
                next_step,
            )
        metrics = dict(self.backend.train_step(experiences))
        metrics.update({f"sample/{k}" if "/" not in k else k: v for k, v in sample_metrics.items()})
        metrics["trainer/num_experiences"] = float(len(experiences))
        metrics["trainer/empty_step"] = 0.0
        return self._after_step(metrics)

    def _empty_step(self, step: int) -> dict[str, float]:
        """Step ``step`` without experiences (the explorer ended its steps with none, or the
        sample strategy dropped them all). Counted; the weights stay as they are."""
        logger.warning(
            "trainer step %d: no experiences to train on (%s); the weights stay unchanged",
            step,
            "the explorer's step ended without any: its tasks failed or were dropped"
            if self.experience_reader.short_reason
            else "the sample strategy kept none of what it read",
        )
        # Both back-ends count steps in a plain ``global_step``; advancing it keeps weight
        # versions equal to explorer steps, which the synchroniser's schedule relies on.
        self.backend.global_step = step
        return self._after_step(
            {"trainer/num_experiences": 0.0, "trainer/empty_step": 1.0, "training/global_step": float(step)}
        )

    def _after_step(self, metrics: dict[str, float]) -> dict[str, float]:
        interval = self.config.trainer.save_interval
        if interval and self.step % interval == 0:
            self.save_checkpoint()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Current weights (for memory sync)."""
        return self.backend.state_dict()

    def save_checkpoint(self) -> str:
        """Save ``global_step_<step>`` with readers' and sample strategy's state; returns its path."""
        path = self.backend.save_checkpoint(self.step, extra_state=self._extra())
        self.last_saved_step = self.step
        return path

    def finish(self) -> str | None:
        """Save the final checkpoint (unless this step is saved already); returns its path."""
        from trinity.trainer.checkpoint import checkpoint_dir

        if self.step == 0:
            return None
        if self.last_saved_step != self.step:
            return self.save_checkpoint()
        return checkpoint_dir(self.config.checkpoint_job_dir, self.step)

    def _extra(self) -> dict[str, Any]:
        return {
            "sample_strategy": self.sample_strategy.state_dict(),
            "experience_reader": self.experience_reader.state_dict(),
            "auxiliary_readers": {n: r.state_dict() for n, r in self.auxiliary_readers.items()},
        }

    def _load_extra(self, extra: dict[str, Any]) -> None:
        if "experience_reader" in extra:
            self.experience_reader.load_state_dict(extra["experience_reader"])
        for name, state in extra.get("auxiliary_readers", {}).items():
            if name in self.auxiliary_readers:
                self.auxiliary_readers[name].load_state_dict(state)
        if "sample_strategy" in extra:
            self.sample_strategy.load_state_dict(extra["sample_strategy"])
