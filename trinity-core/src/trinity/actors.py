"""Ray actors wrapping the Explorer and the Trainer for the launcher.

The actors are thin: they give each role its own process, a log file under
``<job_dir>/log/<actor>.log``, the same plugins as the driver (``TRINITY_PLUGIN_DIRS`` travels with the
environment: see :func:`trinity.cluster.travelling_env`), and translate between Ray object refs
and plain calls. An actor serves one stage, or several in turn: :meth:`restart` builds the
role anew for the job's next stage in the same process (see :mod:`trinity.stage_actors`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.job import ExploreStepResult, TrainStepResult
    from trinity.sync.group import GroupSpec


def _setup_actor(config: Config, actor_name: str) -> tuple[logging.Logger, logging.Handler]:
    """The actor's log file for this stage (attached to the job's loggers) and its logger."""
    from trinity.plugins import check_plugins
    from trinity.report import job_loggers

    log_dir = Path(config.checkpoint_job_dir) / "log"
    if config.log.group_by_node:
        log_dir = log_dir / ray.util.get_node_ip_address()
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_dir / f"{actor_name}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Workers load plugins again in their own process; a broken one fails this actor loudly.
    check_plugins()
    # The plugins' own loggers too: a judge's fallbacks, a reward's timeouts are the job's news.
    for name in job_loggers():
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(getattr(logging, str(config.log.level).upper(), logging.INFO))
    return logging.getLogger(f"trinity.{actor_name}"), handler


def _drop_log_file(handler: logging.Handler) -> None:
    """Detach a previous stage's log file from the job's loggers (the next stage has its own)."""
    from trinity.report import job_loggers

    for name in job_loggers():
        logging.getLogger(name).removeHandler(handler)
    handler.close()


def use_cpu_share(share: float | None, logger: logging.Logger | None = None) -> int | None:
    """Let torch use ``share`` of this process's CPU cores (see :func:`trinity.placement.cpu_shares`).

    ``None`` keeps the thread count Ray started the actor with. Returns the thread count set.
    """
    if share is None:
        return None
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    threads = max(1, int(cores * share))
    torch.set_num_threads(threads)
    if logger is not None:
        logger.info("torch uses %d of %d CPU cores", threads, cores)
    return threads


class _StageActor:
    """What both actors share: the role's part of one stage, built in this process, and built
    anew in place for the job's next stage (:meth:`restart`)."""

    logger: logging.Logger
    _log_file: logging.Handler | None = None
    _threads: int | None = None  # torch's thread count before any share was applied

    def _start(self, config: Config, cpu_share: float | None) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        """Release what the previous stage's part holds (engines, servers, model, optimizer)."""
        raise NotImplementedError

    def _set_up(self, config: Config, actor_name: str, cpu_share: float | None) -> None:
        import torch

        if self._log_file is not None:
            _drop_log_file(self._log_file)
        self.logger, self._log_file = _setup_actor(config, actor_name)
        if self._threads is None:
            self._threads = torch.get_num_threads()
        elif cpu_share is None:
            torch.set_num_threads(self._threads)  # not the previous stage's share
        use_cpu_share(cpu_share, self.logger)

    def ready(self) -> bool:
        return True

    def restart(self, config: Config, cpu_share: float | None = None) -> bool:
        """Serve the job's next stage (``config``) from this process: the previous stage's part
        is stopped, then built from ``config`` as a new actor would build it. Saves the new
        process, its imports (torch, transformers: seconds each stage) and warm-up."""
        import torch

        self._stop()
        gc.collect()  # the previous stage's model and optimizer, before the next one loads
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # and their GPU blocks, for the next stage's model
        self._start(config, cpu_share)
        self.logger.info("restarted in place: process %d served the job's previous stage too", os.getpid())
        return True


@ray.remote
class ExplorerActor(_StageActor):
    """The explorer in its own process.

    After every step it saves its position (step and taskset readers) to
    ``<job_dir>/explorer_state.json``, so a restarted job continues with the next tasks. The
    experience buffer drops rows whose experience id it already holds, so a step redone after a
    crash cannot duplicate data.
    """

    def __init__(self, config: Config, cpu_share: float | None = None) -> None:
        self._start(config, cpu_share)

    def _start(self, config: Config, cpu_share: float | None) -> None:
        from trinity.explorer.explorer import Explorer

        self._set_up(config, config.explorer.name, cpu_share)
        self.config = config
        self.explorer = Explorer(config)
        self.state_file = Path(config.checkpoint_job_dir) / "explorer_state.json"
        if config.continue_from_checkpoint and self.state_file.is_file():
            state = json.loads(self.state_file.read_text())
            self.explorer.explore_step_num = int(state["step"])
            self.explorer.taskset_reader.load_state_dict(state["taskset"])
            self.logger.info("resumed explorer at step %d", self.explorer.explore_step_num)
        if config.mode in ("both", "explore", "colocate"):
            # Registers this run's writer before the trainer's first read (the launcher waits
            # for this constructor): a shared buffer whose earlier writers all finished must
            # not look exhausted to it. Every step up to the current one is written.
            self.explorer.writer.end_step(self.explorer.explore_step_num)

    def _stop(self) -> None:
        self.explorer.shutdown()
        del self.explorer

    def current_step(self) -> int:
        return self.explorer.explore_step_num

    def model_version(self) -> int:
        return self.explorer.model_version

    def explore_step(self) -> ExploreStepResult | None:
        """One explore step's metrics and failure line; ``None`` once the taskset is exhausted."""
        from trinity.explorer.explorer import FAILURES_KEY
        from trinity.job import ExploreStepResult

        metrics = self.explorer.explore_step()
        if metrics is None:
            return None
        state = {
            "step": self.explorer.explore_step_num,
            "taskset": self.explorer.taskset_reader.state_dict(),
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)  # atomic: a crash never leaves half a state file
        failures = metrics.pop(FAILURES_KEY, None)
        return ExploreStepResult(metrics, failures)

    def eval(self) -> dict[str, float]:
        return self.explorer.eval()

    def benchmark(self) -> dict[str, float]:
        results = self.explorer.bench()
        out: dict[str, float] = {}
        for step, metrics in sorted(results.items()):
            out.update({f"bench/step_{step}/{k}": v for k, v in metrics.items()})
        return out

    def update_weights(self, boxed_ref: list[Any]) -> int:
        from trinity.sync.memory import from_wire

        wire, version = ray.get(boxed_ref[0])
        self.explorer.sync_weights(from_wire(wire), version=version)
        return version

    def load_checkpoint(self, path_and_version: tuple[str, int]) -> int:
        path, version = path_and_version
        self.explorer.sync_weights(checkpoint_path=path, version=version)
        return version

    # -- broadcast weight sync (sync_method nccl; see trinity.sync.transport) -----------------

    def weight_sync_devices(self) -> list[list[str]]:
        return self.explorer.weight_sync_devices()

    def init_weight_group(self, spec: GroupSpec) -> None:
        self.explorer.init_weight_group(spec)

    def receive_weights(self, metas: list[Any], version: int) -> int:
        self.explorer.receive_weights(metas, version)
        self.logger.info("loaded weights version %d from the trainer's broadcast", version)
        return version

    def close_weight_group(self) -> None:
        self.explorer.close_weight_group()

    def finish(self) -> None:
        # Tell the trainer no more experiences will come; the engines stay up for a final eval.
        if not self.explorer.finished:
            self.explorer.finished = True
            self.explorer.writer.finish()


@ray.remote
class TrainerActor(_StageActor):
    """The trainer in its own process."""

    def __init__(self, config: Config, cpu_share: float | None = None) -> None:
        self._start(config, cpu_share)

    def _start(self, config: Config, cpu_share: float | None) -> None:
        from trinity.trainer.trainer import Trainer

        self._set_up(config, config.trainer.name, cpu_share)
        self.trainer = Trainer(config)

    def _stop(self) -> None:
        self.close_weight_group()
        del self.trainer

    def current_step(self) -> int:
        return self.trainer.step

    def reader_position(self) -> dict[str, Any]:
        """The experience reader's state (what the driver gives back after an interrupt)."""
        return self.trainer.experience_reader.state_dict()

    def train_step(self) -> TrainStepResult | None:
        """One train step's metrics and the reader's position after it; ``None`` once no more
        experiences will come."""
        from trinity.job import TrainStepResult

        metrics = self.trainer.train_step()
        if metrics is None:
            return None
        return TrainStepResult(metrics, self.reader_position())

    def get_weights(self) -> tuple[dict[str, Any], int]:
        from trinity.sync.memory import to_wire

        # As numpy arrays: Ray sends those without pickling them through torch.save.
        return to_wire(self.trainer.state_dict()), self.trainer.step

    def save_weights(self) -> tuple[str, int]:
        return str(self.trainer.save_checkpoint()), self.trainer.step

    def finish(self) -> str | None:
        path = self.trainer.finish()
        return None if path is None else str(path)

    # -- broadcast weight sync (sync_method nccl): this actor is rank 0 -----------------------
    # One implementation for both back-ends: the weights come from Trainer.state_dict() (the
    # native model, or veRL's gathered full state dict) and are broadcast from this process.

    def weight_sync_device(self) -> str:
        from trinity.sync.group import describe_device

        return describe_device(getattr(self.trainer.backend, "device", None))

    def open_weight_group(self, world_size: int, backend: str, timeout_s: float) -> GroupSpec:
        """Start the group's store on a free port; returns what the explorer joins with."""
        from trinity.sync.broadcast import WeightSender

        self.close_weight_group()
        device = getattr(self.trainer.backend, "device", None)
        self.weight_sender = WeightSender(world_size, backend, timeout_s, device=device)
        return self.weight_sender.spec

    def connect_weight_group(self) -> None:
        self._sender().connect()

    def prepare_weights(self) -> tuple[list[Any], int]:
        """Snapshot the current weights for the next :meth:`send_weights`; returns their
        metadata (wire form) and version."""
        version = self.trainer.step
        return self._sender().prepare(self.trainer.state_dict(), version), version

    def send_weights(self) -> dict[str, float]:
        return self._sender().send()

    def close_weight_group(self) -> None:
        sender = getattr(self, "weight_sender", None)
        self.weight_sender = None
        if sender is not None:
            sender.close()

    def _sender(self) -> Any:
        sender = getattr(self, "weight_sender", None)
        if sender is None:
            raise RuntimeError("the weight-sync group is not open (open_weight_group was not called)")
        return sender
