"""The Explorer on the tiny model: steps, eids, metrics, eval, bench and weight sync."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity import hookimpl
from trinity.buffer.base import WriterBase
from trinity.config import Config
from trinity.experience import Experience
from trinity.explorer.explorer import Explorer, accuracy_metrics
from trinity.explorer.runner import TaskResult
from trinity.testing.plugins import isolated_plugin_manager, registered_plugin
from trinity.testing.tiny_model import create_tiny_model
from trinity.workflow import Task, Workflow


class LengthParity(Workflow):
    """Chats once with n = repeat_times; reward 1 when the response length is even."""

    can_repeat = True

    def run(self):
        messages = [{"role": "user", "content": self.task.task_desc}]
        exps = self.model.chat(messages, n=self.repeat_times, max_tokens=6, seed=self.task.index)
        for e in exps:
            e.reward = float(e.response_length % 2 == 0)
            e.metrics["parity"] = e.reward
        return exps


class Broken(Workflow):
    def run(self):
        raise ValueError("bad row")


class _Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("length_parity", LengthParity)
        register("broken", Broken)


class ListWriter(WriterBase):
    def __init__(self):
        self.batches: list[list[Experience]] = []
        self.ended_steps: list[int] = []
        self.finished = False

    def write(self, experiences):
        self.batches.append(list(experiences))

    def end_step(self, step):
        self.ended_steps.append(step)

    def finish(self):
        self.finished = True


@pytest.fixture
def plugins():
    with isolated_plugin_manager(), registered_plugin(_Plugin(), "explorer-test"):
        yield


def _config(tmp_path, model_path, *, workflow="length_parity", eval_interval=2, rows=5):
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(rows))
    )
    taskset = {"name": "train", "path": str(data), "repeat_times": 2, "default_workflow_type": workflow}
    eval_set = {
        "name": "dev",
        "path": str(data),
        "repeat_times": 3,
        "default_workflow_type": workflow,
        "is_eval": True,
    }
    return Config.model_validate(
        {
            "buffer": {
                "batch_size": 2,
                "explorer_input": {"tasksets": [taskset], "eval_tasksets": [eval_set]},
            },
            "explorer": {
                "runner_per_model": 2,
                "max_retry_times": 0,
                "eval_interval": eval_interval,
                "eval_on_startup": True,
                "rollout_model": {
                    "model_path": str(model_path),
                    "engine_type": "transformers",
                    "dtype": "float32",
                },
            },
        }
    )


def test_explore_steps_write_stamped_experiences(tmp_path, tiny_model_path, engine, plugins):
    writer = ListWriter()
    explorer = Explorer(_config(tmp_path, tiny_model_path), engines=[engine], writer=writer)
    metrics = explorer.explore_step()
    batch = writer.batches[0]
    assert len(batch) == 4  # 2 tasks x repeat_times 2
    assert sorted((e.eid.batch, e.eid.task, e.eid.run) for e in batch) == [
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
    assert {e.model_version for e in batch} == {engine.model_version}
    rewards = [e.reward for e in batch]
    assert metrics["rollout/reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert metrics["rollout/reward_max"] == max(rewards) and metrics["rollout/reward_min"] == min(rewards)
    assert metrics["rollout/response_length_mean"] == pytest.approx(sum(e.response_length for e in batch) / 4)
    assert metrics["rollout/parity"] == pytest.approx(metrics["rollout/reward_mean"])
    assert metrics["rollout/failed_tasks"] == 0.0
    assert metrics["rollout/tokens_per_second"] > 0 and metrics["timing/explore_step"] > 0
    assert batch[0].info["taskset"] == "train"


def test_steps_until_the_taskset_ends_and_evals_write_nothing(tmp_path, tiny_model_path, engine, plugins):
    # When to eval is the launcher's schedule (tests/launcher); here: what a step and an eval do.
    writer = ListWriter()
    explorer = Explorer(_config(tmp_path, tiny_model_path, eval_interval=2), engines=[engine], writer=writer)
    startup = explorer.eval()
    steps = []
    while (metrics := explorer.explore_step()) is not None:
        steps.append(metrics)
        if explorer.explore_step_num == 2:
            metrics.update(explorer.eval())
    assert len(steps) == 3  # 5 rows / batch 2
    assert "eval/dev/accuracy" in startup and "eval/dev/accuracy" in steps[1]
    assert "eval/dev/accuracy" not in steps[0] and "eval/dev/accuracy" not in steps[2]
    assert "eval/dev/accuracy/pass@3" in startup
    assert startup["eval/dev/accuracy/pass@3"] >= startup["eval/dev/accuracy/mean@3"]
    assert writer.finished
    assert sum(len(b) for b in writer.batches) == 5 * 2  # eval experiences are not written
    assert explorer.explore_step() is None


def test_an_eval_runs_all_its_tasks_at_once_with_the_same_results(
    tmp_path, tiny_model_path, engine, plugins, monkeypatch
):
    """An eval taskset's tasks all run at once (one runner and wrapper each), so the engine
    batches their calls into large generate calls; what they sample is what the training pool's
    two runners sample (each task's seed is its own)."""
    import trinity.explorer.explorer as explorer_module

    explorer = Explorer(_config(tmp_path, tiny_model_path, rows=7), engines=[engine], writer=ListWriter())
    before = engine.batches_run
    wide = explorer.eval()
    pool = explorer.eval_pool(7)
    assert len(pool.runners) == 7 and pool is not explorer.pool
    assert len({id(r.model) for r in pool.runners}) == 7, "runners share a wrapper"
    assert explorer.eval_pool(7) is pool, "the eval pool is kept between evals"
    wide_batches = engine.batches_run - before
    monkeypatch.setattr(explorer_module, "EVAL_RUNNERS_PER_ENGINE", 2)  # the training pool's width
    assert explorer.eval_pool(7) is explorer.pool
    before = engine.batches_run
    narrow = explorer.eval()
    narrow_batches = engine.batches_run - before
    same = [k for k in wide if k.startswith("eval/dev/") and "second" not in k]
    assert same and {k: wide[k] for k in same} == {k: narrow[k] for k in same}
    assert wide_batches <= narrow_batches, (wide_batches, narrow_batches)
    explorer.shutdown()
    assert explorer._eval_pool is None


def test_failing_workflow_is_counted_and_the_step_goes_on(tmp_path, tiny_model_path, engine, plugins):
    writer = ListWriter()
    explorer = Explorer(
        _config(tmp_path, tiny_model_path, workflow="broken"), engines=[engine], writer=writer
    )
    metrics = explorer.explore_step()
    assert metrics["rollout/failed_tasks"] == 2.0
    assert writer.batches == []
    assert explorer.explore_step_num == 1


def test_accuracy_metrics_mean_pass_worst():
    def result(accs, ok=True):
        task = Task(repeat_times=len(accs))
        exps = []
        for run, acc in enumerate(accs):
            e = Experience(tokens=torch.tensor([1, 2]), prompt_length=1, reward=acc)
            e.eid.run = run
            exps.append(e)
        return TaskResult(task, exps if ok else [], error=None if ok else "x")

    m = accuracy_metrics(
        [result([1, 0, 0, 0]), result([1, 1, 1, 1]), result([0, 0, 0, 0], ok=False)], "eval/x"
    )
    assert m["eval/x/accuracy/mean@4"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert m["eval/x/accuracy/pass@4"] == pytest.approx(2 / 3)
    assert m["eval/x/accuracy/worst@4"] == pytest.approx(1 / 3)
    assert m["eval/x/accuracy"] == m["eval/x/accuracy/mean@4"]


def test_sync_weights_and_bench(tmp_path, tiny_model_path, plugins):
    from trinity.rollout.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu")
    explorer = Explorer(_config(tmp_path, tiny_model_path), engines=[engine], writer=ListWriter())
    other = AutoModelForCausalLM.from_pretrained(create_tiny_model(tmp_path / "other", seed=3))
    explorer.sync_weights(other.state_dict(), version=7)
    assert explorer.model_version == 7
    with pytest.raises(ValueError, match="exactly one"):
        explorer.sync_weights(version=8)

    ckpts = tmp_path / "ckpt"
    for step, seed in [(10, 1), (20, 2)]:
        create_tiny_model(ckpts / f"global_step_{step}" / "huggingface", seed=seed)
    results = explorer.bench(ckpts)
    assert sorted(results) == [10, 20]
    assert explorer.model_version == 20
    assert "eval/dev/accuracy" in results[10]
    explorer.config.explorer.bench_on_latest_checkpoint = True
    assert sorted(explorer.bench(ckpts)) == [20]
    with pytest.raises(FileNotFoundError, match="global_step"):
        explorer.bench(tmp_path / "nothing")


def test_the_tasks_of_an_explore_step_share_one_generate(
    tmp_path, tiny_model_path, engine, plugins, monkeypatch
):
    """Runners mark their tasks as callers of the engine, and the engine's next ``generate``
    waits for each marked task's call: the first runner to call no longer starts alone with the
    others queued behind it (two generates a step instead of one). The waiting limits are raised
    here so that only the calls arriving can end the wait, however loaded the machine is."""
    monkeypatch.setattr(engine, "batch_wait", 60.0)
    monkeypatch.setattr(engine, "batch_gap", 60.0)
    config = _config(tmp_path, tiny_model_path, rows=12)
    config.buffer.batch_size = 6
    config.explorer.runner_per_model = 6
    explorer = Explorer(config, engines=[engine], writer=ListWriter())
    for _ in range(2):
        before = (engine.batches_run, engine.calls_batched)
        explorer.explore_step()
        assert (engine.batches_run - before[0], engine.calls_batched - before[1]) == (1, 6)
    assert engine._callers == 0  # every task unmarked itself
    explorer.shutdown()


def test_an_explore_step_reports_the_engines_generate_time(tmp_path, tiny_model_path, engine, plugins):
    explorer = Explorer(_config(tmp_path, tiny_model_path), engines=[engine], writer=ListWriter())
    before = engine.generate_seconds
    metrics = explorer.explore_step()
    spent = engine.generate_seconds - before
    assert spent > 0
    assert metrics["timing/generate"] == pytest.approx(spent)
    assert metrics["timing/generate"] <= metrics["timing/rollout"]


def test_engines_that_do_not_count_generate_time_report_none(tmp_path, tiny_model_path, engine, plugins):
    class Uncounted:
        """Stands for an engine in another process (vLLM): no generate_seconds."""

        def __getattr__(self, name):
            if name == "generate_seconds":
                raise AttributeError(name)
            return getattr(engine, name)

    explorer = Explorer(_config(tmp_path, tiny_model_path), engines=[engine], writer=ListWriter())
    explorer.engines = [Uncounted()]
    assert explorer._generate_seconds() is None
