"""A stage's actors serve the job's next stage when it wants them as they are (same role, name
and resources, the model inside the actor's process), restarted in place; anything else gets a
new actor. As pure logic (a stand-in Ray), plus the actor side's hand-over of its log file."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from trinity import actors as actors_module
from trinity.config import Config
from trinity.stage_actors import StageActors, actor_options, can_restart


def _config(mode="both", engine="transformers", trainer="native", namespace="p/n/one", aux=None) -> Config:
    return Config.model_validate(
        {
            "mode": mode,
            "ray_namespace": namespace,
            "explorer": {"rollout_model": {"engine_type": engine}, "auxiliary_models": aux or []},
            "trainer": {"trainer_type": trainer},
        }
    )


class _Call:
    def __init__(self, log, what):
        self.log, self.what = log, what

    def remote(self, *args):
        self.log.append((self.what, *args))
        return f"ref:{self.what}"


class _Actor:
    def __init__(self, label):
        self.label, self.calls = label, []
        self.restart = _Call(self.calls, "restart")
        self.ready = _Call(self.calls, "ready")


class _Ray:
    """What StageActors asks of Ray: kill, and get_actor to see a killed actor's name free."""

    def __init__(self):
        self.killed = []

    def kill(self, actor):
        self.killed.append(actor.label)

    def get_actor(self, name, namespace=None):
        raise ValueError("gone")


@pytest.fixture
def new_actors(monkeypatch):
    """The actor classes, recording each actor started: ``(role, options, label)``."""
    started = []

    def actor_class(role):
        def options(**opts):
            def remote(config, share):
                actor = _Actor(f"{role}{len(started)}")
                started.append((role, opts, actor.label))
                return actor

            return SimpleNamespace(remote=remote)

        return SimpleNamespace(options=options)

    monkeypatch.setattr(actors_module, "ExplorerActor", actor_class("explorer"))
    monkeypatch.setattr(actors_module, "TrainerActor", actor_class("trainer"))
    return started


def test_only_roles_whose_model_lives_in_the_actor_and_nobody_looks_up_by_name_restart():
    assert can_restart(_config(), "explorer") and can_restart(_config(), "trainer")
    assert not can_restart(_config(engine="vllm"), "explorer")  # engines are Ray actors of their own
    assert can_restart(_config(engine="vllm"), "trainer")
    assert not can_restart(_config(trainer="verl"), "trainer")  # veRL's workers
    aux = [{"model_path": "judge", "engine_type": "vllm"}]
    assert not can_restart(_config(aux=aux), "explorer")
    assert not can_restart(_config(mode="explore"), "explorer")  # a train job finds it by name
    assert not can_restart(_config(mode="serve"), "explorer")  # serve starts its own
    assert not can_restart(_config(mode="train"), "explorer")  # no explorer at all
    assert can_restart(_config(mode="train"), "trainer")


def test_a_kept_actor_is_restarted_with_the_next_stages_config_and_share(new_actors):
    ray, actors = _Ray(), StageActors()
    first, second = _config(namespace="p/n/one"), _config(namespace="p/n/two")
    actor, options, ready = actors.start(ray, first, "trainer", actor_options(first, "trainer", 0), 0.5)
    assert (new_actors, ready) == ([("trainer", options, "trainer0")], "ref:ready")
    actors.next_stage = second
    assert actors.keep(first, "trainer", actor, options, 0)

    again, kept_options, ready = actors.start(
        ray, second, "trainer", actor_options(second, "trainer", 0), 1.0
    )
    assert again is actor and ready == "ref:restart" and actor.calls[-1] == ("restart", second, 1.0)
    assert kept_options["namespace"] == "p/n/one"  # a Ray actor keeps its name where it was made
    assert len(new_actors) == 1 and ray.killed == []


@pytest.mark.parametrize(
    "next_stage, gpus",
    [
        (None, 0),  # the last stage
        (_config(mode="explore"), 0),
        (_config(trainer="verl"), 0),
        (_config(mode="train"), 1),  # alone, the trainer gets the whole GPU: other resources
    ],
)
def test_an_actor_the_next_stage_cannot_use_as_it_is_is_not_kept(new_actors, next_stage, gpus):
    ray, actors = _Ray(), StageActors()
    first = _config()
    actor, options, _ = actors.start(ray, first, "trainer", actor_options(first, "trainer", gpus), None)
    actors.next_stage = next_stage
    assert not actors.keep(first, "trainer", actor, options, gpus)
    actors.kill_kept(ray)
    assert ray.killed == []  # the caller kills what was not kept


def test_a_job_on_a_cluster_keeps_nothing(new_actors, monkeypatch):
    ray, actors = _Ray(), StageActors()
    first = _config()
    monkeypatch.setattr("trinity.config.resolve.joins_cluster", lambda config: True)
    actor, options, _ = actors.start(ray, first, "explorer", actor_options(first, "explorer", 0), None)
    actors.next_stage = _config(namespace="p/n/two")
    assert not actors.keep(first, "explorer", actor, options, 0)


def test_a_kept_actor_that_does_not_fit_is_killed_for_a_new_one_and_leftovers_at_the_end(new_actors):
    ray, actors = _Ray(), StageActors()
    first = _config()
    explorer, e_options, _ = actors.start(ray, first, "explorer", actor_options(first, "explorer", 0), None)
    trainer, t_options, _ = actors.start(ray, first, "trainer", actor_options(first, "trainer", 0), None)
    actors.next_stage = _config(namespace="p/n/two")
    assert actors.keep(first, "explorer", explorer, e_options, 0)
    assert actors.keep(first, "trainer", trainer, t_options, 0)
    # The next stage asks for other resources after all (what keep() was told changed).
    other = {**actor_options(first, "explorer", 0), "num_gpus": 1.0}
    fresh, _, ready = actors.start(ray, actors.next_stage, "explorer", other, None)
    assert fresh is not explorer and ready == "ref:ready" and ray.killed == ["explorer0"]
    actors.kill_kept(ray)  # the job ends (a stage failed): the trainer nobody took
    assert ray.killed == ["explorer0", "trainer1"]
    actors.kill_kept(ray)
    assert ray.killed == ["explorer0", "trainer1"]


class _Role(actors_module._StageActor):
    """A role's actor as the real ones are built (``_start`` sets up its log file), without Ray."""

    def __init__(self, config, share=None):
        self.stops = 0
        self._start(config, share)

    def _start(self, config, share):
        self._set_up(config, "explorer", share)

    def _stop(self):
        self.stops += 1


@pytest.fixture
def restored_loggers():
    from trinity.report import job_loggers

    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level) for n in job_loggers()}
    yield
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level)


def test_a_restarted_actor_logs_into_the_new_stages_file_only_with_its_thread_count_reset(
    tmp_path, restored_loggers
):
    import torch

    def stage(name):
        log = SimpleNamespace(group_by_node=False, level="INFO")
        return SimpleNamespace(checkpoint_job_dir=str(tmp_path / name), log=log)

    threads = torch.get_num_threads()
    try:
        role = _Role(stage("one"), 1 / max(threads, 1) / 2)  # one thread for the first stage
        assert torch.get_num_threads() == 1
        logging.getLogger("trinity.explorer").info("step of stage one")
        assert role.restart(stage("two"), None) is True
        assert role.stops == 1 and torch.get_num_threads() == threads  # Ray's count, not stage one's
        logging.getLogger("trinity.explorer").info("step of stage two")
    finally:
        torch.set_num_threads(threads)
    one = (tmp_path / "one" / "log" / "explorer.log").read_text()
    two = (tmp_path / "two" / "log" / "explorer.log").read_text()
    assert "step of stage one" in one and "stage two" not in one and "restarted" not in one
    assert "step of stage two" in two and "stage one" not in two
    assert "restarted in place" in two
