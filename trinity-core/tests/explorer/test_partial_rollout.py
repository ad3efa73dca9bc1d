"""Partial rollouts (``explorer.over_rollout.partial_rollout``, AReaL's semantics).

A task still running when its explore step ends is carried into the next step instead of being
dropped; the transformers engine stops its samples at that sync point and continues them from
their tokens under the weights loaded by then, each token keeping the model version (and the
logprob) it was sampled with; carried tasks too stale for the new weights are dropped.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch

from trinity import hookimpl
from trinity.config import ConfigError, load_config
from trinity.experience import Experience
from trinity.explorer.explorer import Explorer
from trinity.explorer.partial_rollout import CarryingRunnerPool
from trinity.rollout.base import SamplingArgs
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.workflow import Task, Workflow

SLOW_S = 20.0


class Gated(Workflow):
    """Async: waits for ``GATES[raw["gate"]]`` (when given) before returning one experience."""

    is_async = True

    def run(self):
        raise AssertionError("run_async is used")

    async def run_async(self):
        gate = self.task.raw_task.get("gate")
        if gate is not None:
            while not GATES[gate].is_set():
                await asyncio.sleep(0.01)
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=1.0)]


GATES: dict[str, threading.Event] = {}


def _task(index, **raw):
    return Task(workflow=Gated, raw_task=raw, repeat_times=1, taskset_name="t", index=index)


def _pool(runners=3):
    return CarryingRunnerPool([object()], runner_per_model=runners, max_retry_times=0, max_timeout=60)


@pytest.fixture
def gate():
    event = threading.Event()
    GATES["slow"], GATES["never"] = event, threading.Event()
    yield event
    event.set()
    GATES.pop("slow", None)


def test_a_task_cut_at_the_step_end_is_carried_and_finishes_in_the_next_step(gate):
    pool = _pool()
    step1 = pool.run_tasks([_task(0), _task(1, gate="slow")], min_finished=1, version=3)
    # Not dropped: the running task is carried, and is not among the step's results.
    assert [r.task.index for r in step1] == [0] and not step1[0].resumed
    assert [(c.task.index, c.started_version) for c in pool.carried] == [(1, 3)]
    gate.set()
    step2 = pool.run_tasks([_task(2)], min_finished=2, version=4)
    by_index = {r.task.index: r for r in step2}
    assert sorted(by_index) == [1, 2] and not pool.carried
    assert by_index[1].resumed and by_index[1].started_version == 3 and by_index[1].experiences
    assert not by_index[2].resumed and by_index[2].started_version == 4


def test_a_carried_task_keeps_its_runner_and_tasks_never_started_are_dropped(gate):
    pool = _pool(runners=2)
    step1 = pool.run_tasks([_task(0), _task(1, gate="slow"), _task(2, gate="slow"), _task(3)], min_finished=1)
    carried = {c.task.index for c in pool.carried}
    finished = [r.task.index for r in step1 if not r.cancelled]
    dropped = [r.task.index for r in step1 if r.cancelled]
    # Two runners: each task was finished, carried (started) or dropped (never started).
    assert sorted(finished + dropped + sorted(carried)) == [0, 1, 2, 3] and carried
    assert all(not r.experiences for r in step1 if r.cancelled)
    busy = {id(c.runner) for c in pool.carried}
    assert len(busy) == len(pool.carried)  # one runner each, held into the next step


def test_stale_carried_tasks_are_dropped_and_the_rest_kept(gate):
    pool = _pool()
    pool.run_tasks([_task(0), _task(1, gate="slow")], min_finished=1, version=0)
    # Task 3 starts (two runners are free) and is carried too; task 2 finishes the step.
    pool.run_tasks([_task(3, gate="slow"), _task(2)], min_finished=1, version=1)
    assert sorted(c.started_version for c in pool.carried) == [0, 1]
    # At version 2 with a bound of 1 version, the task started under version 0 is too old.
    stale = pool.drop_stale(2, max_staleness=1)
    assert [c.task.index for c in stale] == [1] and stale[0].future.cancelled()
    assert [c.task.index for c in pool.carried] == [3]
    gate.set()
    step = pool.run_tasks([], min_finished=1, version=2)
    assert [(r.task.index, r.resumed) for r in step] == [(3, True)]


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("gated", Gated)


class ListWriter:
    def __init__(self):
        self.written, self.ended = [], []

    def write(self, experiences):
        self.written.extend(experiences)

    def end_step(self, step):
        self.ended.append(step)

    def finish(self):
        pass

    def metrics(self):
        return {}


class PausingEngine:
    """An engine double that can pause (it only records the calls)."""

    supports_partial_rollout = True

    def __init__(self):
        self.model_version, self.calls = 0, []

    def pause_generation(self):
        self.calls.append("pause")

    def resume_generation(self):
        self.calls.append("resume")

    def update_weights(self, state_dict, version):
        self.model_version = version

    def shutdown(self):
        pass


def _yaml(tmp_path, ratio=0.5, partial=True, max_staleness=1):
    # Step 1: task 1 is cut and carried. Step 2: task 3 never finishes in the test, and task 2
    # only where the carried task is dropped (else the resumed task alone ends the step).
    rows = [{"q": "0", "a": "0"}, {"q": "1", "a": "0", "gate": "slow"}]
    rows.append({"q": "2", "a": "0", **({"gate": "never"} if max_staleness else {})})
    rows.append({"q": "3", "a": "0", "gate": "never"})
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "job.yaml"
    path.write_text(
        f"""
mode: explore
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {tmp_path}/model, max_prompt_tokens: 8, max_response_tokens: 8}}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{name: t, path: {tmp_path}/tasks.jsonl, default_workflow_type: gated,
              format: {{prompt_key: q, response_key: a}}}}
explorer:
  runner_per_model: 4
  over_rollout: {{ratio: {ratio}, wait_after_min: 0, partial_rollout: {str(partial).lower()},
                 max_staleness: {max_staleness}}}
  rollout_model: {{engine_type: transformers}}
synchronizer: {{sync_style: explorer_driven}}
"""
    )
    return path


@pytest.mark.parametrize("max_staleness", [1, 0])
def test_the_explorer_carries_a_cut_task_over_a_sync_and_counts_it(tmp_path, gate, max_staleness):
    with isolated_plugin_manager(autoload=True), registered_plugin(_Plugin(), "partial-rollout-test"):
        config = load_config(_yaml(tmp_path, max_staleness=max_staleness))
        writer, engine = ListWriter(), PausingEngine()
        explorer = Explorer(config, engines=[engine], writer=writer)
        explorer.sync_weights({}, version=1)  # the task starts under version 1
        # Evals never run on the training runners, which carried tasks hold across steps.
        assert explorer.eval_pool(1) is not explorer.pool
        first = explorer.explore_step()
        assert first["rollout/partial_rollout/carried_tasks"] == 1.0 and engine.calls == ["pause"]
        assert "rollout/over_rollout/dropped_tasks" not in first  # carried, not dropped
        explorer.sync_weights({}, version=2)  # the sync point: resumes, or drops the stale task
        assert engine.calls == ["pause", "resume"]
        gate.set()
        second = explorer.explore_step()
        explorer.shutdown()
    if max_staleness == 1:
        assert second["rollout/partial_rollout/resumed_tasks"] == 1.0
        assert second["rollout/partial_rollout/stale_dropped_tasks"] == 0.0
        resumed = [e for e in writer.written if e.eid.batch == 2 and e.token_versions is not None]
        # Sampled under version 1 (the workflow's own Experience says 0: not older than its
        # task), written under version 2.
        assert (
            len(resumed) == 1 and resumed[0].token_versions.tolist() == [1] and resumed[0].model_version == 2
        )
        assert second["rollout/partial_rollout/token_version_lag_max"] == 1.0
        assert second["rollout/partial_rollout/token_version_lag_mean"] == 1.0  # all it wrote
        assert second["rollout/partial_rollout/carried_tasks"] == 2.0  # tasks 2 and 3
    else:
        assert second["rollout/partial_rollout/resumed_tasks"] == 0.0
        assert second["rollout/partial_rollout/stale_dropped_tasks"] == 1.0
        assert second["rollout/partial_rollout/token_version_lag_max"] == 0.0


def test_partial_rollout_needs_a_ratio(tmp_path):
    with (
        isolated_plugin_manager(autoload=True),
        registered_plugin(_Plugin(), "partial-rollout-test"),
        pytest.raises(ConfigError) as err,
    ):
        load_config(_yaml(tmp_path, ratio=0))
    assert "explorer.over_rollout.ratio" in str(err.value) and "\n" not in str(err.value)


def test_token_versions_survive_the_buffers_encoding():
    exp = Experience(
        tokens=torch.tensor([5, 6, 7, 8]),
        prompt_length=1,
        logprobs=torch.tensor([-0.5, -1.0, -1.5]),
        token_versions=torch.tensor([2, 2, 3]),
        model_version=3,
    )
    back = Experience.deserialize(exp.serialize())
    assert back.token_versions.tolist() == [2, 2, 3] and back.token_versions.dtype == torch.int64
    with pytest.raises(ValueError, match="token_versions"):
        Experience(tokens=torch.tensor([5, 6, 7]), prompt_length=1, token_versions=torch.tensor([1]))


def test_the_engine_continues_an_interrupted_sample_under_the_new_weights(tiny_model_path):
    from trinity.rollout.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0, batch_wait=0)
    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    cut_at = 3

    def pause_at_the_cut(recorder):  # the sync point, in the middle of the sample
        if recorder.steps == cut_at:
            engine.pause_generation()

    engine._on_step = pause_at_the_cut
    args = SamplingArgs(n=2, max_tokens=10, min_tokens=10, temperature=1.0, seed=7)
    prompt = engine.encode("hello there")
    out: list = []
    caller = threading.Thread(target=lambda: out.append(engine.generate_tokens([prompt], args)))
    caller.start()
    deadline = time.monotonic() + 60
    while engine.batches_run < 1 and time.monotonic() < deadline:  # the first part ran
        time.sleep(0.01)
    assert caller.is_alive()  # waiting for the engine to resume
    engine._on_step = lambda recorder: None
    generator = torch.Generator().manual_seed(1)
    new = {k: v + 0.3 * torch.randn(v.shape, generator=generator) for k, v in old.items()}
    engine.update_weights(new, 1)
    engine.resume_generation()
    caller.join(60)
    [group] = out[0]
    for exp in group:
        assert exp.response_length == args.max_tokens and exp.prompt_length == len(prompt)
        assert exp.token_versions.tolist() == [0] * cut_at + [1] * (args.max_tokens - cut_at)
        assert exp.model_version == 1 and exp.info["resumed"] == 1
        assert exp.info["finish_reason"] == "length"
        assert exp.response_text == engine._decode(exp.tokens[len(prompt) :].tolist())
        tokens = exp.tokens.tolist()
        # The continuation's logprobs are the new weights', the prefix's the old ones'.
        under_new = engine.logprobs(tokens)[len(prompt) - 1 :]
        torch.testing.assert_close(exp.logprobs[cut_at:], under_new[cut_at:], atol=1e-4, rtol=0)
        assert not torch.allclose(exp.logprobs[:cut_at], under_new[:cut_at], atol=1e-3)
        engine.update_weights(old, 2)
        under_old = engine.logprobs(tokens)[len(prompt) - 1 :]
        torch.testing.assert_close(exp.logprobs[:cut_at], under_old[:cut_at], atol=1e-4, rtol=0)
        engine.update_weights(new, 1)
    assert engine.samples_resumed == 2
