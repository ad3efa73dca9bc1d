"""What the launcher prints around a stage: the sync_method warning only where the setting is
the stage's own, evals on the trainer's bar, the closing line after the bar, a saved config, and
no folder left behind by a start that failed before its actors were up."""

from __future__ import annotations

import logging
import os

import pytest
import yaml

from trinity import launcher
from trinity.config import load_config, stage_configs
from trinity.step_loop import StepLoop, sync_method_set_for
from trinity.sync import Synchronizer

from .test_sync_styles import FakeExplorer, FakeRay, FakeTrainer, FakeTransport, Monitor, _config

STAGED = """
project: p
name: job
checkpoint_root_dir: {root}
model: {{model_path: /models/m, max_prompt_tokens: 8, max_response_tokens: 8}}
buffer:
  batch_size: 2
  total_steps: 2
  explorer_input:
    taskset: {{path: /data/t}}
  trainer_input:
    experience_buffer: {{name: e, storage_type: queue}}
synchronizer: {{sync_method: memory}}
stages:
  - stage_name: warmup
    mode: train
    algorithm: {{algorithm_type: sft}}
    buffer:
      trainer_input:
        experience_buffer: {{name: sft, storage_type: file, path: /data/sft}}
  - stage_name: rl
    mode: {rl_mode}
    {rl_buffer}
"""


def _stages(tmp_path, rl_mode="both"):
    # A second train-only stage reads a dataset too (a queue there would wait for an explore job).
    rl_buffer = (
        "buffer: {trainer_input: {experience_buffer: {name: more, storage_type: file, path: /data/more}}}"
    )
    file = tmp_path / "job.yaml"
    file.write_text(
        STAGED.format(
            root=tmp_path / "ckpt", rl_mode=rl_mode, rl_buffer=rl_buffer if rl_mode == "train" else ""
        )
    )
    return stage_configs(load_config(file))


def test_a_train_stage_inheriting_the_jobs_sync_method_is_not_warned_about(tmp_path, caplog):
    """The quickstart's shape: an SFT warm-up (train) before an RL stage (both) that syncs in
    memory. The warm-up has the job's synchronizer, meant for the RL stage: no warning there.
    Where no stage can use it, the setting truly has no effect: warned."""
    warmup, rl = _stages(tmp_path)
    assert warmup.synchronizer.sync_method == "memory"  # the job's, for stage rl
    assert not sync_method_set_for(warmup) and sync_method_set_for(rl)
    (alone, other) = _stages(tmp_path, rl_mode="train")  # no stage syncs in memory
    assert sync_method_set_for(alone) and sync_method_set_for(other)

    def run_train_only(stage):
        ray = FakeRay()
        config = _config(tmp_path, method="memory", mode="train", steps=2)
        if stage is not None:
            config._sync_for_other_stages = stage._sync_for_other_stages
        monitors = {"explorer": Monitor(), "trainer": Monitor()}
        loop = StepLoop(
            ray,
            config,
            None,
            FakeTrainer(ray, 1, None),
            Synchronizer.from_config(config.synchronizer),
            monitors,
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trinity.launcher"):
            loop.run()
        return [r.getMessage() for r in caplog.records if "exchanges no weights" in r.getMessage()]

    assert run_train_only(warmup) == []
    assert len(run_train_only(alone)) == 1
    assert len(run_train_only(None)) == 1  # a job without stages


def test_the_mark_survives_the_next_stage_start_and_a_rename(tmp_path):
    from trinity.config.resolve import resolve_with, start_from

    warmup, _ = _stages(tmp_path)
    moved = resolve_with(start_from(warmup, "/ckpt/global_step_2"), {"name": "job/warmup_2"})
    assert moved.name == "job/warmup_2" and not sync_method_set_for(moved)


class Console(Monitor):
    def __init__(self) -> None:
        super().__init__()
        self.evals: list[tuple[int, dict]] = []

    def log_eval(self, metrics, step):
        self.evals.append((step, dict(metrics)))


class Group(Monitor):
    """A role's monitors (what ``get_monitors`` returns: a MultiMonitor)."""

    def __init__(self, *monitors) -> None:
        super().__init__()
        self.monitors = list(monitors)

    def log(self, metrics, step):
        for monitor in self.monitors:
            monitor.log(metrics, step)


def test_evals_reach_the_trainers_console_bar(tmp_path, monkeypatch):
    ray = FakeRay()
    config = _config(tmp_path, steps=4, eval_interval=2)
    explorer = FakeExplorer(ray, 1, 4)
    trainer = FakeTrainer(ray, 1, explorer)
    monkeypatch.setattr("trinity.sync.make_transport", lambda method, r, e, t, s: FakeTransport(ray, e, t))
    console = Console()
    monitors = {"explorer": Monitor(), "trainer": Group(Monitor(), console)}
    StepLoop(ray, config, explorer, trainer, Synchronizer.from_config(config.synchronizer), monitors).run()
    evals = [(step, m) for step, m in monitors["explorer"].logged if "eval/x/accuracy" in m]
    assert evals and console.evals == evals
    assert console.evals[0] == (2, {"eval/x/accuracy": 0.5})


def test_the_closing_line_comes_after_the_bars_final_state(tmp_path, capsys):
    from trinity.monitor.console import ConsoleMonitor

    class Terminal:
        text = ""

        def write(self, s):
            Terminal.text += s
            return len(s)

        def flush(self):
            pass

        def isatty(self):
            return True

    ray = FakeRay()
    config = _config(tmp_path, method="checkpoint", mode="train", steps=3)
    bar = ConsoleMonitor("trainer", total_steps=3, stream=Terminal(), fields=("loss",))
    monitors = {"explorer": Monitor(), "trainer": Group(bar)}
    StepLoop(
        ray, config, None, FakeTrainer(ray, 1, None), Synchronizer.from_config(config.synchronizer), monitors
    ).run()
    assert bar._line is None  # ended by the loop before its closing line
    assert Terminal.text.endswith("3/3 loss 0.0000 in 0:00:00\n"), repr(Terminal.text[-80:])
    assert "[trinity] done: 3 train steps" in capsys.readouterr().out


def test_save_config_names_the_explore_jobs_file_apart(tmp_path):
    assert launcher.config_file_name("both") == "config.yaml"
    assert launcher.config_file_name("train") == "config.yaml"
    assert launcher.config_file_name("explore") == "config.explore.yaml"
    (warmup, _) = _stages(tmp_path)
    launcher.save_config(warmup)
    saved = yaml.safe_load((tmp_path / "ckpt" / "p" / "job" / "warmup" / "config.yaml").read_text())
    assert saved["mode"] == "train" and saved["algorithm"]["algorithm_type"] == "sft"
    assert saved["checkpoint_job_dir"] == warmup.checkpoint_job_dir


@pytest.mark.parametrize("fails", ["before actors", "after actors"])
def test_a_start_that_fails_before_its_actors_leaves_no_folder(tmp_path, monkeypatch, fails):
    (warmup, _) = _stages(tmp_path)
    root = tmp_path / "ckpt"

    def run(config, start=None, more_stages=False, actors=None):
        assert (root / "p" / "job" / "warmup" / "config.yaml").is_file()
        if fails == "after actors":
            start.actors_ready = True
        raise launcher.JobFailed("starting actors: explorer: ValueError: no such model")

    monkeypatch.setattr(launcher, "_run_stage", run)
    with pytest.raises(launcher.JobFailed) as failed:
        launcher.run_stage(warmup)
    if fails == "before actors":
        assert not (root / "p").exists()  # the stage folder and the parents this start made
        (note,) = failed.value.__notes__  # printed after the failure's line
        assert note.endswith("warmup removed: this start stopped before its actors were up (nothing to keep)")
    else:
        assert not getattr(failed.value, "__notes__", None)
        status = yaml.safe_load((root / "p" / "job" / "warmup" / "run_status.json").read_text())
        assert status["status"] == "failed"


def test_a_failed_start_keeps_a_folder_it_did_not_create(tmp_path, monkeypatch):
    (warmup, _) = _stages(tmp_path)
    job_dir = tmp_path / "ckpt" / "p" / "job" / "warmup"
    job_dir.mkdir(parents=True)
    (job_dir / "notes.txt").write_text("mine")
    monkeypatch.setattr(warmup, "continue_from_checkpoint", True)

    def run(config, start=None, more_stages=False, actors=None):
        raise launcher.JobFailed("starting actors: boom")

    monkeypatch.setattr(launcher, "_run_stage", run)
    with pytest.raises(launcher.JobFailed):
        launcher.run_stage(warmup)
    assert (job_dir / "notes.txt").read_text() == "mine" and os.path.isfile(job_dir / "run_status.json")
