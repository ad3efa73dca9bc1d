"""trinity.job: what the launcher, the step loop, the actors and serve mode hand each other. It
is a leaf (it imports nothing of trinity), so none of them needs to import the launcher; the
actors return typed step results, not metric dicts carrying a failure line or a reader state."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import trinity
from trinity.actors import ExplorerActor, TrainerActor
from trinity.job import ExploreStepResult, TrainStepResult

SRC = Path(trinity.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_job_is_a_leaf():
    assert not {m for m in _imported_modules(SRC / "job.py") if m.split(".")[0] == "trinity"}


def test_nothing_the_launcher_starts_imports_the_launcher():
    for module in ("actors.py", "step_loop.py", "report.py", "serving/serve.py", "sync/explore_job.py"):
        imported = _imported_modules(SRC / module)
        assert not {m for m in imported if m == "trinity.launcher" or m.startswith("trinity.launcher.")}, (
            module
        )


def test_the_explorer_actor_returns_the_failure_line_apart_from_the_metrics(tmp_path):
    from trinity.explorer.explorer import FAILURES_KEY

    class Explorer:
        explore_step_num = 3
        taskset_reader = SimpleNamespace(state_dict=lambda: {"offset": 6})

        def __init__(self, metrics):
            self.metrics = metrics

        def explore_step(self):
            return self.metrics

    actor = object.__new__(ExplorerActor.__ray_actor_class__)
    actor.state_file = tmp_path / "explorer_state.json"
    actor.explorer = Explorer({"rollout/num_experiences": 0.0, FAILURES_KEY: "2 of 2 tasks failed: boom"})
    result = actor.explore_step()
    assert result == ExploreStepResult({"rollout/num_experiences": 0.0}, "2 of 2 tasks failed: boom")
    assert json.loads(actor.state_file.read_text()) == {"step": 3, "taskset": {"offset": 6}}
    actor.explorer = Explorer({"rollout/num_experiences": 4.0})
    assert actor.explore_step() == ExploreStepResult({"rollout/num_experiences": 4.0}, None)
    actor.explorer = Explorer(None)  # the taskset is exhausted
    assert actor.explore_step() is None


def test_the_trainer_actor_returns_the_readers_position_apart_from_the_metrics():
    steps = iter([{"actor/loss": 0.5}, None])
    trainer = SimpleNamespace(
        train_step=lambda: next(steps), experience_reader=SimpleNamespace(state_dict=lambda: {"rows": 8})
    )
    actor = object.__new__(TrainerActor.__ray_actor_class__)
    actor.trainer = trainer
    assert actor.train_step() == TrainStepResult({"actor/loss": 0.5}, {"rows": 8})
    assert actor.train_step() is None  # no more experiences will come
