"""The stages of a job on a Ray of its own share that Ray; each stage's end removes what would
outlive it there (its queue actor, the placement groups its actors made, its actors' names), and
the job's end stops the Ray — also when a stage fails midway."""

from __future__ import annotations

import pytest

from trinity import launcher
from trinity.cluster import end_stage
from trinity.config import load_config, stage_configs
from trinity.job import EXIT_FAILED, JobFailed, StageResult

pytestmark = pytest.mark.slow  # each test starts a local Ray

CONFIG = """
project: p
name: n
model: {model_path: /models/base, max_prompt_tokens: 8, max_response_tokens: 8}
algorithm: {algorithm_type: grpo, repeat_times: 2}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {name: t, path: /data, format: {prompt_key: q, response_key: a}}
  trainer_input:
    experience_buffer: {name: exp, storage_type: queue}
explorer: {rollout_model: {engine_type: transformers}}
trainer: {trainer_type: native}
stages:
  - stage_name: one
  - stage_name: two
  - stage_name: three
"""


@pytest.fixture
def stages(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = tmp_path / "job.yaml"
    path.write_text(CONFIG)
    return stage_configs(load_config(path))


@pytest.fixture
def own_ray():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_a_stage_followed_by_another_leaves_its_ray_clean_and_running_and_the_last_stops_it(stages, own_ray):
    from ray.util import placement_group, placement_group_table

    from trinity.buffer.factory import start_queue
    from trinity.buffer.queue import queue_actor_name

    ray = own_ray
    first = stages[0]
    exp = first.buffer.trainer_input.experience_buffer
    assert start_queue(first)  # what a stage with a queue buffer starts (detached: it outlives the stage)
    ray.get_actor(queue_actor_name(exp.name), namespace=exp.ray_namespace)
    group = placement_group([{"CPU": 1}])  # what a vLLM engine or a veRL worker group reserves
    ray.get(group.ready(), timeout=60)

    @ray.remote(num_cpus=0)
    class Role:
        def ready(self):
            return True

    actor = Role.options(name=first.explorer.name, namespace=first.ray_namespace).remote()
    ray.get(actor.ready.remote())
    ray.kill(actor)

    end_stage(ray, first, more_stages=True, actor_names=[(first.explorer.name, first.ray_namespace)])

    assert ray.is_initialized()
    with pytest.raises(ValueError):
        ray.get_actor(queue_actor_name(exp.name), namespace=exp.ray_namespace)
    with pytest.raises(ValueError):  # the name is free for a next stage in the same namespace
        ray.get_actor(first.explorer.name, namespace=first.ray_namespace)
    assert {info["state"] for info in placement_group_table().values()} == {"REMOVED"}
    # The group's CPU is back: a next stage's actor that needs it starts.
    follower = Role.options(num_cpus=1).remote()
    assert ray.get(follower.ready.remote(), timeout=60)

    end_stage(ray, stages[-1], more_stages=False)
    assert not ray.is_initialized()


def test_a_job_whose_second_stage_fails_stops_the_ray_its_first_stage_kept(stages, monkeypatch):
    import ray

    calls = []

    def run_stage(config, *, more_stages=False, actors=None):
        calls.append((config.name, more_stages))
        if len(calls) == 1:
            ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
            return StageResult(config.name, 1, 1, "/ckpt/one/global_step_1", {})
        assert ray.is_initialized()  # the first stage's Ray, kept for this one
        raise JobFailed("starting actors: boom")

    monkeypatch.setattr(launcher, "stage_configs", lambda config: stages)
    monkeypatch.setattr(launcher, "run_stage", run_stage)
    try:
        assert launcher.run(stages[0]) == EXIT_FAILED
        assert calls == [("n/one", True), ("n/two", True)]
        assert not ray.is_initialized()
    finally:
        if ray.is_initialized():
            ray.shutdown()
