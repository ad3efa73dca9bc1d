"""Each ``synchronizer.sync_style`` by the order of events it produces.

The real ``StepLoop`` (:mod:`trinity.step_loop`) drives a fake explorer and a fake trainer through a fake
``ray`` on a virtual clock: a call takes its actor's step duration, an actor runs one call at a
time (as a Ray actor does), and trainer step ``t`` cannot end before explorer step ``t`` wrote
its experiences. The weight transport checks that a sync only happens while neither actor is
in a step. Events are ``explore N (vV)`` (explorer step ``N`` ran with weights version ``V``),
``train N`` and ``sync vV``, in virtual-time order.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest

from trinity import step_loop
from trinity.config.geometry import BatchGeometry
from trinity.job import ExploreStepResult, JobFailed, TrainStepResult
from trinity.step_loop import StepLoop
from trinity.sync import Synchronizer
from trinity.trainer.checkpoint import LATEST_FILE, STATE_FILE, checkpoint_dir


class Ref:
    def __init__(self, end: float, value, seq: int) -> None:
        self.end, self.value, self.seq = end, value, seq


class FakeRay:
    """``wait``/``get`` over :class:`Ref` s on a virtual clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events: list[tuple[float, int, str]] = []
        self.seq = itertools.count()

    def event(self, at: float, text: str) -> None:
        self.events.append((at, next(self.seq), text))

    def wait(self, refs, num_returns=1, timeout=None):
        first = min(refs, key=lambda r: (r.end, r.seq))
        self.now = max(self.now, first.end)
        return [first], [r for r in refs if r is not first]

    def get(self, refs):
        if isinstance(refs, list):
            return [self.get(r) for r in refs]
        self.now = max(self.now, refs.end)
        return refs.value

    def ordered(self) -> list[str]:
        return [text for _, _, text in sorted(self.events)]


class _Method:
    def __init__(self, actor, name) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args):
        return self.actor.call(self.name, *args)


class FakeActor:
    def __init__(self, ray: FakeRay) -> None:
        self.ray, self.busy_until = ray, 0.0

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def submit(self, duration: float, value, label: str | None = None, not_before: float = 0.0) -> Ref:
        start = max(self.ray.now, self.busy_until, not_before)
        self.busy_until = start + duration
        if label:
            self.ray.event(self.busy_until, label)
        return Ref(self.busy_until, value, next(self.ray.seq))

    def idle(self) -> bool:
        return self.busy_until <= self.ray.now


class FakeExplorer(FakeActor):
    def __init__(self, ray, step_s, steps, slow=()) -> None:
        super().__init__(ray)
        self.step_s, self.steps, self.slow = step_s, steps, dict(slow)
        self.step = self.version = 0
        self.step_end: dict[int, float] = {}
        self.eval_s = 0.0
        self.busy: list[tuple[float, float]] = []  # (start, end) of its explore steps and evals

    def call(self, name, *args):
        if name == "explore_step":
            if self.step >= self.steps:
                return self.submit(0, None)
            self.step += 1
            metrics = {"rollout/num_experiences": 4.0, "rollout/model_version": float(self.version)}
            result = ExploreStepResult(metrics)
            duration = self.slow.get(self.step, self.step_s)
            ref = self.submit(duration, result, f"explore {self.step} (v{self.version})")
            self.step_end[self.step] = ref.end
            self.busy.append((ref.end - duration, ref.end))
            return ref
        if name == "load_checkpoint":
            (path, version) = args[0]
            self.version = version
            return self.submit(0, version, f"load {path.rsplit('/', 1)[-1]}")
        if name == "eval":
            ref = self.submit(self.eval_s, {"eval/x/accuracy": 0.5}, f"eval (v{self.version})")
            self.busy.append((ref.end - self.eval_s, ref.end))
            return ref
        value = {"current_step": self.step, "model_version": self.version, "finish": None}[name]
        return self.submit(0, value)


class FakeTrainer(FakeActor):
    def __init__(self, ray, step_s, explorer) -> None:
        super().__init__(ray)
        self.step_s, self.explorer, self.step = step_s, explorer, 0
        self.saved: list[int] = []
        self.busy: list[tuple[float, float]] = []

    def call(self, name, *args):
        if name == "train_step":
            self.step += 1
            if self.explorer is not None:
                # The launcher starts a train step only once its explore step started.
                assert self.step in self.explorer.step_end, f"train {self.step} before explore {self.step}"
                ready = self.explorer.step_end[self.step]
            else:
                ready = 0.0
            start = max(self.ray.now, self.busy_until, ready)
            self.busy_until = start + self.step_s
            self.busy.append((start, self.busy_until))
            self.ray.event(self.busy_until, f"train {self.step}")
            return Ref(self.busy_until, TrainStepResult({"actor/loss": 0.0}, {}), next(self.ray.seq))
        if name == "save_weights":
            self.saved.append(self.step)
            return self.submit(0, (f"/ckpt/global_step_{self.step}", self.step), f"save {self.step}")
        value = {"current_step": 0, "reader_position": {}, "finish": None}[name]
        return self.submit(0, value)


class FakeTransport:
    method = "memory"

    def __init__(self, ray, explorer, trainer) -> None:
        self.ray, self.explorer, self.trainer = ray, explorer, trainer

    def open(self):
        return ""

    def sync(self):
        assert self.explorer.idle() and self.trainer.idle(), "a sync while an actor is in a step"
        self.explorer.version = self.trainer.step
        self.ray.event(self.ray.now, f"sync v{self.trainer.step}")
        return self.trainer.step

    def close(self):
        pass


class Monitor:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def _config(
    tmp_path,
    style="fixed",
    interval=1,
    offset=0,
    steps=4,
    method="memory",
    timeout=60,
    mode="both",
    eval_interval=0,
    storage_type="sql",
):
    return SimpleNamespace(
        name="job",
        mode=mode,
        checkpoint_job_dir=str(tmp_path),
        algorithm=SimpleNamespace(algorithm_type="grpo", repeat_times=2),
        buffer=SimpleNamespace(
            total_steps=steps,
            batch_size=2,
            train_batch_size=4,
            trainer_input=SimpleNamespace(
                experience_buffer=SimpleNamespace(storage_type=storage_type, path=f"{tmp_path}/rows")
            ),
        ),
        trainer=SimpleNamespace(total_steps=None),
        explorer=SimpleNamespace(
            name="explorer",
            eval_interval=eval_interval,
            eval_on_startup=False,
            max_consecutive_failed_steps=0,
        ),
        synchronizer=SimpleNamespace(
            sync_method=method,
            sync_style=style,
            sync_interval=interval,
            explorer_sync_interval=None,
            trainer_sync_interval=None,
            sync_offset=offset,
            sync_timeout=timeout,
        ),
        geometry=BatchGeometry(
            "grpo", tasks_per_explore_step=2, repeat_times=2, experiences_per_train_step=4
        ),
    )


def _run(tmp_path, monkeypatch, *, explore_s, train_s, slow=(), eval_s=0.0, actors=None, **kw):
    ray = FakeRay()
    config = _config(tmp_path, **kw)
    explorer = FakeExplorer(ray, explore_s, config.buffer.total_steps, slow)
    explorer.eval_s = eval_s
    trainer = FakeTrainer(ray, train_s, explorer)
    if actors is not None:
        actors.extend([explorer, trainer])
    monkeypatch.setattr("trinity.sync.make_transport", lambda method, r, e, t, s: FakeTransport(ray, e, t))
    monitors = {"explorer": Monitor(), "trainer": Monitor()}
    loop = StepLoop(ray, config, explorer, trainer, Synchronizer.from_config(config.synchronizer), monitors)
    result = loop.run()
    assert (result.explorer_steps, result.trainer_steps, result.shortfall) == (
        config.buffer.total_steps,
        config.buffer.total_steps,
        None,
    )
    return ray.ordered(), monitors


def test_fixed_on_policy_alternates_explore_train_sync(tmp_path, monkeypatch):
    events, monitors = _run(tmp_path, monkeypatch, explore_s=1, train_s=3, steps=3)
    assert events == [
        "explore 1 (v0)", "train 1", "sync v1",
        "explore 2 (v1)", "train 2", "sync v2",
        "explore 3 (v2)", "train 3",
    ]  # fmt: skip
    lags = [m["rollout/model_version_lag"] for _, m in monitors["explorer"].logged]
    assert lags == [0.0, 0.0, 0.0]  # on-policy: each batch trained by the weights that made it


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple]:
    return [(x, y) for x in a for y in b if min(x[1], y[1]) > max(x[0], y[0])]


def test_fixed_on_policy_actors_take_turns_evals_included(tmp_path, monkeypatch):
    """Strictly on-policy, no explore step or eval ever runs while the trainer is in a step:
    an eval due at step N runs after the sync that brings the weights of train step N."""
    actors: list = []
    events, _ = _run(
        tmp_path, monkeypatch, explore_s=1, train_s=3, eval_s=2, steps=4, eval_interval=2, actors=actors
    )
    explorer, trainer = actors
    assert "sync v2 | eval (v2) | explore 3 (v2)" in " | ".join(events)
    assert _overlap(explorer.busy, trainer.busy) == []
    # With an offset they do overlap.
    actors.clear()
    _run(
        tmp_path,
        monkeypatch,
        explore_s=1,
        train_s=3,
        eval_s=2,
        steps=4,
        offset=1,
        eval_interval=2,
        actors=actors,
    )
    assert _overlap(actors[0].busy, actors[1].busy) != []


def test_fixed_offset_1_lets_the_explorer_run_one_step_ahead(tmp_path, monkeypatch):
    events, monitors = _run(tmp_path, monkeypatch, explore_s=1, train_s=3, steps=4, offset=1)
    # After explore 2 it needs version 1: train 1 ran while it explored step 2.
    assert events == [
        "explore 1 (v0)", "explore 2 (v0)", "train 1", "sync v1",
        "explore 3 (v1)", "train 2", "sync v2",
        "explore 4 (v2)", "train 3", "train 4",
    ]  # fmt: skip
    lags = [m["rollout/model_version_lag"] for _, m in monitors["explorer"].logged]
    assert lags == [0.0, 1.0, 1.0, 1.0]


def test_fixed_waits_for_the_trainer_even_when_it_is_slow(tmp_path, monkeypatch):
    events, _ = _run(tmp_path, monkeypatch, explore_s=1, train_s=5, steps=4, interval=2)
    # Steps 1-2 on v0; at explore 2 the explorer needs version 2 and waits for train 2.
    assert events == [
        "explore 1 (v0)", "explore 2 (v0)", "train 1", "train 2", "sync v2",
        "explore 3 (v2)", "explore 4 (v2)", "train 3", "train 4",
    ]  # fmt: skip


def test_explorer_driven_syncs_what_the_trainer_has_at_its_sync_points(tmp_path, monkeypatch):
    events, _ = _run(
        tmp_path, monkeypatch, explore_s=1, train_s=5, steps=6, interval=2, offset=1, style="explorer_driven"
    )
    # Sync points after explore 3 and 5 (max lead 3). At each the trainer is mid-step: the
    # explorer waits for that one step (never for a version) and takes what it then has: v1
    # after explore 3, v3 after explore 5. Outside sync points it runs on with what it holds,
    # even when the trainer is idle (explore 5 starts on v1 although train 2 had ended).
    assert events == [
        "explore 1 (v0)", "explore 2 (v0)", "explore 3 (v0)", "train 1", "sync v1",
        "explore 4 (v1)", "train 2", "explore 5 (v1)", "train 3", "sync v3",
        "explore 6 (v3)", "train 4", "train 5", "train 6",
    ]  # fmt: skip


def test_trainer_driven_trainer_publishes_and_holds_until_loaded(tmp_path, monkeypatch):
    events, _ = _run(
        tmp_path, monkeypatch, explore_s=3, train_s=1, steps=4, interval=1, offset=1, style="trainer_driven"
    )
    # The trainer is fast: after each of its steps it holds until the explorer (mid-step) ends
    # that step and loads the version, whatever explorer step that is.
    assert events == [
        "explore 1 (v0)", "train 1", "explore 2 (v0)", "sync v1",
        "train 2", "explore 3 (v1)", "sync v2",
        "train 3", "explore 4 (v2)", "train 4",
    ]  # fmt: skip


def test_fully_async_never_holds_a_step_for_a_sync(tmp_path, monkeypatch):
    events, _ = _run(
        tmp_path, monkeypatch, explore_s=2, train_s=3, steps=5, interval=1, offset=1, style="fully_async"
    )
    # Syncs happen only when both are between steps; the explorer waits only for the lead
    # (at most offset + interval = 2 steps ahead).
    assert events == [
        "explore 1 (v0)", "explore 2 (v0)", "train 1", "sync v1",
        "explore 3 (v1)", "train 2", "sync v2",
        "explore 4 (v2)", "train 3", "sync v3",
        "explore 5 (v3)", "train 4", "train 5",
    ]  # fmt: skip


@pytest.mark.parametrize("style", ["fixed", "explorer_driven", "trainer_driven", "fully_async"])
def test_every_style_with_a_long_tail_step_bounds_the_lead(tmp_path, monkeypatch, style):
    events, monitors = _run(
        tmp_path, monkeypatch, explore_s=1, train_s=2, steps=8, interval=2, offset=1, style=style, slow={3: 9}
    )
    started = trained = 0
    for event in events:
        if event.startswith("explore"):
            started += 1
            assert started - trained <= 3  # offset + interval
        elif event.startswith("train"):
            trained += 1
    versions = [m["rollout/model_version"] for _, m in monitors["explorer"].logged]
    assert versions == sorted(versions) and versions[-1] > 0


def test_dynamic_is_fully_async():
    assert Synchronizer(1, 0, "dynamic").sync_style == "fully_async"


# -- explore-only and train-only stages -----------------------------------------------------------


def _checkpoint(job_dir, step):
    path = checkpoint_dir(job_dir, step)
    import os

    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, STATE_FILE), "w").close()
    with open(os.path.join(job_dir, LATEST_FILE), "w") as f:
        f.write(str(step))


def _train_job_runs(job_dir, *, pid=None, age=0.0):
    """The heartbeat a train job of the run keeps in the job dir (``pid``: this process)."""
    import json
    import os
    import socket
    import time

    from trinity.sync.trainer_job import FILE

    now = time.time() - age
    record = {"pid": pid or os.getpid(), "host": socket.gethostname(), "started": now, "updated": now}
    (job_dir / FILE).write_text(json.dumps(record))


def _gone_pid() -> int:
    """The pid of a process that has ended (as a SIGKILLed train job's has)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _explore_only(tmp_path, monkeypatch, **kw):
    ray = FakeRay()
    config = _config(tmp_path, method="checkpoint", mode="explore", **kw)
    explorer = FakeExplorer(ray, 1, config.buffer.total_steps)
    monitors = {"explorer": Monitor(), "trainer": Monitor()}
    loop = StepLoop(ray, config, explorer, None, Synchronizer.from_config(config.synchronizer), monitors)
    return ray, loop, monitors


def test_explore_only_loads_the_other_jobs_newest_checkpoint(tmp_path, monkeypatch, capsys):
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2)
    ray, loop, monitors = _explore_only(tmp_path, monkeypatch, style="fully_async", steps=2)
    loop.run()
    assert ray.ordered() == ["load global_step_2", "explore 1 (v2)", "explore 2 (v2)"]
    assert "loaded the trainer job's checkpoint" in capsys.readouterr().out
    assert monitors["explorer"].logged[0] == (0, {"sync/model_version": 2.0})


def test_explore_only_fixed_waits_for_the_needed_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRINITY_WAIT_REPORT_S", "0.1")
    _checkpoint(tmp_path, 1)
    _train_job_runs(tmp_path)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=3)
    polls, clock = [], [0.0]

    def sleep(seconds):  # the other job writes its checkpoint while the explorer polls
        polls.append(seconds)
        clock[0] += seconds
        if len(polls) == 3:
            _checkpoint(tmp_path, 2)

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == [
        "explore 1 (v0)", "load global_step_1", "explore 2 (v1)", "load global_step_2", "explore 3 (v2)"
    ]  # fmt: skip
    assert len(polls) == 3
    assert "waits for the trainer job's checkpoint of step 2" in capsys.readouterr().out


def test_explore_only_fixed_gives_up_after_sync_timeout(tmp_path, monkeypatch, capsys):
    _checkpoint(tmp_path, 1)
    _train_job_runs(tmp_path)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=3, timeout=1)
    clock = [0.0]
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(step_loop.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    loop.run()
    assert ray.ordered() == ["explore 1 (v0)", "load global_step_1", "explore 2 (v1)", "explore 3 (v1)"]
    err = capsys.readouterr().err
    assert "no checkpoint of trainer step 2" in err and "synchronizer.sync_timeout" in err
    assert clock[0] >= 1  # it did wait, sync_timeout (virtual) seconds


@pytest.mark.parametrize("checkpoint", [None, 1])
def test_an_explore_job_on_its_own_never_waits_for_a_trainer(tmp_path, monkeypatch, capsys, checkpoint):
    # explore-then-train (no train job runs, whatever checkpoints the folder holds): none may
    # ever come. Said once, not at every sync step.
    if checkpoint:
        _checkpoint(tmp_path, checkpoint)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=5)
    monkeypatch.setattr(step_loop.time, "sleep", lambda s: pytest.fail("the explorer waited"))
    loop.run()
    v = checkpoint or 0
    assert ray.ordered() == [
        *(["explore 1 (v0)", "load global_step_1"] if checkpoint else ["explore 1 (v0)"]),
        *[f"explore {step} (v{v})" for step in range(2, 6)],
    ]
    out = capsys.readouterr().out
    assert out.count("no train job runs") == 1 and "exploring on with model version" in out


def test_the_first_sync_waits_for_a_running_train_job_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    """The job dir holds no checkpoint yet, but a train job runs: the first sync step waits for
    its checkpoint (before, the explorer ran on with version 0 until the first one appeared)."""
    _train_job_runs(tmp_path)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=5, interval=2)
    clock, polls = [0.0], []

    def sleep(seconds):
        polls.append(loop.explorer_step)
        clock[0] += seconds
        if len(polls) == 5:
            _checkpoint(tmp_path, 2)
        if len(polls) == 10:
            _checkpoint(tmp_path, 4)

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == [
        "explore 1 (v0)", "explore 2 (v0)", "load global_step_2",
        "explore 3 (v2)", "explore 4 (v2)", "load global_step_4", "explore 5 (v4)",
    ]  # fmt: skip
    assert polls == [2] * 5 + [4] * 5
    out = capsys.readouterr().out
    # One line per wait, saying what it waits for.
    assert out.count("waits for the trainer job's checkpoint") == 2
    assert "explorer step 2: waits for the trainer job's checkpoint of step 2" in out
    assert "newest is step 0" in out and "the train job runs (pid" in out


def test_a_killed_train_job_is_waited_for_a_grace_then_the_explorer_goes_on(tmp_path, monkeypatch, capsys):
    from trinity.sync.trainer_job import GONE_GRACE_S

    pid = _gone_pid()
    _train_job_runs(tmp_path, pid=pid)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=4, interval=2, timeout=3600)
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
        _train_job_runs(tmp_path, pid=pid, age=clock[0])  # its heartbeat ages with the clock

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == ["explore 1 (v0)", "explore 2 (v0)", "explore 3 (v0)", "explore 4 (v0)"]
    assert GONE_GRACE_S <= clock[0] < GONE_GRACE_S + 5  # waited the grace once, not per sync step
    captured = capsys.readouterr()
    assert "is gone (killed?); waiting up to" in captured.out
    assert "none took over in" in captured.err and "exploring on with model version 0" in captured.err


def test_a_restarted_train_job_ends_the_grace_and_its_checkpoint_is_loaded(tmp_path, monkeypatch, capsys):
    _train_job_runs(tmp_path, pid=_gone_pid())
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=3, interval=2)
    clock, polls = [0.0], []

    def sleep(seconds):
        polls.append(seconds)
        clock[0] += seconds
        if len(polls) == 3:
            _train_job_runs(tmp_path)  # the train job is restarted
        if len(polls) == 6:
            _checkpoint(tmp_path, 2)

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == ["explore 1 (v0)", "explore 2 (v0)", "load global_step_2", "explore 3 (v2)"]
    assert len(polls) == 6
    out = capsys.readouterr().out
    assert "is gone (killed?)" in out
    assert "still waits for the checkpoint of trainer step 2: the train job runs (pid" in out


@pytest.mark.parametrize(("resumed_at", "loaded"), [(3, 2), (4, 4), (1, None)])
def test_a_restarted_explorer_first_loads_what_its_last_sync_point_needed(
    tmp_path, monkeypatch, resumed_at, loaded
):
    """A restarted explore job starts from the initial weights at the step it had finished: it
    loads the checkpoint its last sync point needed before exploring on (killed at step 3, it
    would otherwise run step 4 with version 0), waiting for it while the train job runs."""
    _train_job_runs(tmp_path)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=5, interval=2)
    loop.explorer.step = resumed_at
    clock, polls = [0.0], []

    def sleep(seconds):
        polls.append(loop.explorer_step)
        clock[0] += seconds
        _checkpoint(tmp_path, 2)
        if len(polls) == 3:
            _checkpoint(tmp_path, 4)

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    first = ray.ordered()[0]
    if loaded is None:  # before its first sync point: nothing to catch up on
        assert first == f"explore {resumed_at + 1} (v0)"
    else:
        assert first == f"load global_step_{loaded}"
        assert ray.ordered()[1] == f"explore {resumed_at + 1} (v{loaded})"


def test_a_train_job_that_ended_is_not_waited_for(tmp_path, monkeypatch, capsys):
    """A train job that ended while the explorer waited (its heartbeat removed): no checkpoint
    will come, the explorer goes on at once and says why."""
    from trinity.sync.trainer_job import FILE

    _train_job_runs(tmp_path)
    ray, loop, _ = _explore_only(tmp_path, monkeypatch, style="fixed", steps=3, interval=2)
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
        (tmp_path / FILE).unlink(missing_ok=True)

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == ["explore 1 (v0)", "explore 2 (v0)", "explore 3 (v0)"]
    assert clock[0] <= 1.0
    assert "no train job runs (none started, or it ended)" in capsys.readouterr().err


def test_train_only_saves_a_checkpoint_every_trainer_sync_interval(tmp_path, monkeypatch):
    ray = FakeRay()
    config = _config(tmp_path, method="checkpoint", mode="train", steps=5, interval=2)
    trainer = FakeTrainer(ray, 1, None)
    monitors = {"explorer": Monitor(), "trainer": Monitor()}
    StepLoop(ray, config, None, trainer, Synchronizer.from_config(config.synchronizer), monitors).run()
    assert trainer.saved == [2, 4]
    assert ray.ordered()[:5] == ["train 1", "train 2", "save 2", "train 3", "train 4"]


def test_a_train_only_job_reading_files_publishes_nothing_for_an_explore_job(tmp_path, caplog):
    """SFT or DPO rows from files: no explore job can feed the trainer, so no checkpoint is saved
    every sync interval for one (trainer.save_interval keeps the run's own); said once."""
    ray = FakeRay()
    config = _config(tmp_path, method="checkpoint", mode="train", steps=5, interval=1, storage_type="file")
    trainer = FakeTrainer(ray, 1, None)
    monitors = {"explorer": Monitor(), "trainer": Monitor()}
    with caplog.at_level("INFO", logger="trinity"):
        StepLoop(ray, config, None, trainer, Synchronizer.from_config(config.synchronizer), monitors).run()
    assert trainer.saved == []
    assert ray.ordered()[:5] == [f"train {i}" for i in range(1, 6)]
    assert caplog.text.count("no weights are published for an explore job") == 1


def test_a_lead_no_train_step_can_close_fails_with_a_message(tmp_path, monkeypatch):
    ray = FakeRay()
    config = _config(tmp_path, steps=4)
    config.buffer.train_batch_size = 8  # one train step reads two explore steps
    config.geometry = replace(config.geometry, experiences_per_train_step=8)
    explorer = FakeExplorer(ray, 1, 4)
    trainer = FakeTrainer(ray, 1, explorer)
    monkeypatch.setattr("trinity.sync.make_transport", lambda method, r, e, t, s: FakeTransport(ray, e, t))
    monitors = {"explorer": Monitor(), "trainer": Monitor()}
    loop = StepLoop(ray, config, explorer, trainer, Synchronizer.from_config(config.synchronizer), monitors)
    with pytest.raises(JobFailed, match=r"wait for each other.*raise synchronizer\.sync_offset"):
        loop.run()


# -- a decoupled pair with sync_method nccl (both jobs on one Ray cluster) -------------------------


class BroadcastExplorer(FakeExplorer):
    """The explore job's explorer: its version changes when the train job broadcasts into it."""

    def call(self, name, *args):
        if name == "model_version":
            return self.submit(0, self.version)
        return super().call(name, *args)


def test_explore_only_nccl_fixed_waits_for_the_train_jobs_broadcast(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRINITY_WAIT_REPORT_S", "0.1")
    ray = FakeRay()
    config = _config(tmp_path, method="nccl", mode="explore", style="fixed", interval=2, steps=4)
    explorer = BroadcastExplorer(ray, 1, 4)
    loop = StepLoop(ray, config, explorer, None, Synchronizer.from_config(config.synchronizer), {
        "explorer": Monitor(), "trainer": Monitor()
    })  # fmt: skip
    polls, clock = [], [0.0]

    def sleep(seconds):  # the train job's broadcast lands while the explorer polls
        polls.append(seconds)
        clock[0] += seconds
        if len(polls) == 3:
            explorer.version = 2

    monkeypatch.setattr(step_loop.time, "sleep", sleep)
    monkeypatch.setattr(step_loop.time, "monotonic", lambda: clock[0])
    loop.run()
    assert ray.ordered() == ["explore 1 (v0)", "explore 2 (v0)", "explore 3 (v2)", "explore 4 (v2)"]
    out = capsys.readouterr().out
    assert "waits for the train job's broadcast of version 2" in out
    assert "holds the train job's broadcast weights (model version 2)" in out


def test_train_only_nccl_broadcasts_to_the_explorer_job_while_it_runs(tmp_path, monkeypatch, capsys):
    from trinity.sync import WeightSyncFailed

    ray = FakeRay()
    peer = {"actor": None}
    sent: list[int] = []

    def get_actor(name, namespace=None):
        assert (name, namespace) == ("explorer", "proj/job")
        if peer["actor"] is None:
            raise ValueError("no such actor")
        return peer["actor"]

    class Broadcast:
        def __init__(self, ray_, explorer, trainer, timeout):
            self.trainer = trainer

        def open(self):
            return "gloo"

        def sync(self):
            if peer["actor"] == "dead":
                raise WeightSyncFailed("weight sync (broadcast of version 6): an actor died (...)")
            sent.append(self.trainer.step)
            return self.trainer.step

        def close(self):
            pass

    ray.get_actor = get_actor
    monkeypatch.setattr("trinity.sync.transport.BroadcastTransport", Broadcast)
    config = _config(tmp_path, method="nccl", mode="train", steps=6, interval=2)
    config.ray_namespace = "proj/job"
    trainer = FakeTrainer(ray, 1, None)
    loop = StepLoop(ray, config, None, trainer, Synchronizer.from_config(config.synchronizer), {
        "explorer": Monitor(), "trainer": Monitor()
    })  # fmt: skip
    real = loop.trained

    def trained(metrics):  # the explore job's actor appears after step 2 and ends after step 4
        if loop.trainer_step == 2:
            peer["actor"] = "explorer actor"
        if loop.trainer_step == 4:
            peer["actor"] = "dead"
        real(metrics)

    loop.trained = trained
    loop.run()
    assert sent == [4]
    out = capsys.readouterr().out
    assert out.count("no explorer job of this run on the cluster yet") == 1
    assert "trainer step 4: broadcast version 4 to the explorer job" in out
    assert "trainer step 6: the explorer job has ended; no more weights are sent" in out
