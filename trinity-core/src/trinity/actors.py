"""Ray actors wrapping the Explorer and the Trainer for the launcher.

The actors are thin: they give each role its own process, a log file under
``<job_dir>/log/<actor>.log``, the same plugins as the driver (``TRINITY_PLUGIN_DIRS`` travels in
the Ray runtime environment), and translate between Ray object refs and plain calls.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from trinity.config import Config


def _setup_actor(config: Config, actor_name: str) -> logging.Logger:
    from trinity.plugins import check_plugins

    log_dir = Path(config.checkpoint_job_dir) / "log"
    if config.log.group_by_node:
        log_dir = log_dir / ray.util.get_node_ip_address()
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_dir / f"{actor_name}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("trinity")
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(config.log.level).upper(), logging.INFO))
    # Workers load plugins again in their own process; a broken one fails this actor loudly.
    check_plugins()
    return logging.getLogger(f"trinity.{actor_name}")


@ray.remote
class ExplorerActor:
    """The explorer in its own process."""

    def __init__(self, config: Config) -> None:
        from trinity.explorer.explorer import Explorer

        self.logger = _setup_actor(config, config.explorer.name)
        self.explorer = Explorer(config)

    def ready(self) -> bool:
        return True

    def current_step(self) -> int:
        return self.explorer.step

    def model_version(self) -> int:
        return self.explorer.model_version

    def explore_step(self) -> dict[str, float] | None:
        return self.explorer.explore_step()

    def eval(self) -> dict[str, float]:
        return self.explorer.eval()

    def benchmark(self) -> dict[str, float]:
        return self.explorer.benchmark()

    def update_weights(self, boxed_ref: list[Any]) -> int:
        state_dict, version = ray.get(boxed_ref[0])
        self.explorer.update_weights(state_dict, version)
        return version

    def load_checkpoint(self, path_and_version: tuple[str, int]) -> int:
        path, version = path_and_version
        self.explorer.load_checkpoint(path, version)
        return version

    def finish(self) -> None:
        self.explorer.finish()


@ray.remote
class TrainerActor:
    """The trainer in its own process."""

    def __init__(self, config: Config) -> None:
        from trinity.trainer.trainer import Trainer

        self.logger = _setup_actor(config, config.trainer.name)
        self.trainer = Trainer(config)

    def ready(self) -> bool:
        return True

    def current_step(self) -> int:
        return self.trainer.step

    def train_step(self) -> dict[str, float] | None:
        return self.trainer.train_step()

    def get_weights(self) -> tuple[dict[str, Any], int]:
        return self.trainer.state_dict(), self.trainer.step

    def save_weights(self) -> tuple[str, int]:
        return str(self.trainer.save_checkpoint()), self.trainer.step

    def finish(self) -> str | None:
        path = self.trainer.finish()
        return None if path is None else str(path)
