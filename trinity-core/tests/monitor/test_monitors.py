"""Monitors: real tensorboard event files, console output, optional wandb / mlflow."""

from __future__ import annotations

import importlib.util
import io
import os

import pytest
import torch

from trinity.config import Config
from trinity.experience import Experience
from trinity.monitor import get_monitors
from trinity.monitor.console import ConsoleMonitor, format_eta


def _config(tmp_path, monitor_type, **args) -> Config:
    return Config(
        checkpoint_root_dir=str(tmp_path),
        project="p",
        name="n",
        monitor={"monitor_type": monitor_type, "monitor_args": args or None},
    )


def test_tensorboard_writes_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = _config(tmp_path, "tensorboard")
    monitor = get_monitors(config, role="trainer")
    for step in (1, 2, 3):
        monitor.log({"actor/pg_loss": 0.5 * step, "info": "not a number", "nan": float("nan")}, step)
    monitor.close()
    log_dir = os.path.join(config.job_dir, "monitor", "tensorboard", "trainer")
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(log_dir))
    events = EventAccumulator(log_dir)
    events.Reload()
    assert events.Tags()["scalars"] == ["actor/pg_loss"]
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, 0.5), (2, 1.0), (3, 1.5)]


def test_tensorboard_monitor_does_not_import_torch(tmp_path):
    # The launcher's driver logs through it; importing torch there cost 1.9 s of start-up.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from trinity.monitor.tensorboard import TensorboardMonitor, read_scalars\n"
        f"m = TensorboardMonitor({str(tmp_path)!r}, 'trainer')\n"
        "m.log({'a': 1.0, 'b': 2}, 1)\n"
        "m.close()\n"
        f"assert read_scalars({str(tmp_path / 'trainer')!r}) == {{'a': [(1, 1.0)], 'b': [(1, 2.0)]}}\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_read_scalars_returns_what_was_logged(tmp_path):
    from trinity.monitor.tensorboard import read_scalars

    config = _config(tmp_path, "tensorboard")
    monitor = get_monitors(config, role="explorer")
    monitor.log({"eval/t/accuracy": 0.25}, 0)
    monitor.log({"eval/t/accuracy": 0.75, "rollout/reward_mean": 1.0}, 4)
    monitor.close()
    scalars = read_scalars(os.path.join(config.job_dir, "monitor", "tensorboard", "explorer"))
    assert scalars == {"eval/t/accuracy": [(0, 0.25), (4, 0.75)], "rollout/reward_mean": [(4, 1.0)]}
    with pytest.raises(FileNotFoundError, match="no tensorboard folder"):
        read_scalars(tmp_path / "missing")
    from trinity.monitor.tensorboard import eval_curves

    assert eval_curves(config.job_dir) == {"t": [(0, 0.25), (4, 0.75)]}
    with pytest.raises(RuntimeError, match="no eval/<taskset>/reward"):
        eval_curves(config.job_dir, "reward")


def test_console_plain_lines_when_not_a_tty():
    out = io.StringIO()
    monitor = ConsoleMonitor("trainer", total_steps=10, stream=out)
    assert not monitor.use_rich
    monitor.log({"critic/score/mean": 0.25, "actor/pg_loss": -0.125}, 1)
    monitor.log({"critic/score/mean": 0.5}, 2)
    monitor.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[trainer] step 1/10 reward 0.2500 loss -0.1250 eta ")
    assert lines[1].startswith("[trainer] step 2/10 reward 0.5000 eta ")
    assert format_eta(3725) == "1:02:05" and format_eta(None) == "?"


def test_console_shows_the_reward_of_the_explorers_own_metrics():
    from trinity.explorer.explorer import rollout_metrics

    metrics = rollout_metrics([Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=2, reward=0.75)], 1.0)
    out = io.StringIO()
    ConsoleMonitor("explorer", total_steps=2, stream=out).log(metrics, 1)
    assert out.getvalue().startswith("[explorer] step 1/2 reward 0.7500 eta ")


def test_console_rich_progress_bar():
    out = io.StringIO()
    monitor = ConsoleMonitor("explorer", total_steps=4, stream=out, use_rich=True)
    monitor.log({"critic/score/mean": 0.75}, 2)
    monitor.close()
    text = out.getvalue()
    assert "explorer" in text and "2/4" in text and "reward 0.7500" in text


def test_unknown_monitor_is_rejected_by_config():
    with pytest.raises(ValueError, match="monitor_type"):
        Config(monitor={"monitor_type": "neptune"})


@pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="wandb not installed (extra trinity-core[wandb])"
)
def test_wandb_offline(tmp_path):
    monitor = get_monitors(_config(tmp_path, "wandb", mode="offline"), role="trainer")
    monitor.log({"actor/pg_loss": 1.0}, 1)
    monitor.close()
    assert any("offline-run" in d for d in os.listdir(os.path.join(tmp_path, "p", "n", "monitor", "wandb")))


@pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="mlflow not installed (extra trinity-core[mlflow])"
)
def test_mlflow_local_store(tmp_path):
    import mlflow

    monitor = get_monitors(_config(tmp_path, "mlflow"), role="trainer")
    monitor.log({"actor/pg_loss": 2.0}, 3)
    inner = monitor.monitors[0]
    monitor.close()
    client = mlflow.MlflowClient(tracking_uri=inner.tracking_uri)
    history = client.get_metric_history(inner._run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(3, 2.0)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("taskset_flag", "buffer_flag", "explorer_bar", "trainer_bar"),
    [
        (None, None, True, True),
        (False, None, False, True),
        (None, False, True, False),
        (True, True, True, True),
    ],
)
def test_console_progress_bar_follows_enable_progress_bar(
    tmp_path, monkeypatch, taskset_flag, buffer_flag, explorer_bar, trainer_bar
):
    """Upstream's `enable_progress_bar` of the storage a role reads: false -> plain lines."""
    taskset = {"path": "t.jsonl"} | ({} if taskset_flag is None else {"enable_progress_bar": taskset_flag})
    buffer = {} if buffer_flag is None else {"enable_progress_bar": buffer_flag}
    config = Config(
        checkpoint_root_dir=str(tmp_path),
        monitor={"monitor_type": "console"},
        buffer={
            "explorer_input": {"tasksets": [taskset]},
            "trainer_input": {"experience_buffer": buffer},
        },
    )
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    for role, bar in (("explorer", explorer_bar), ("trainer", trainer_bar)):
        monitor = get_monitors(config, role=role, total_steps=3)
        monitor.log({"rollout/reward_mean": 0.25}, 1)
        monitor.close()
        assert monitor.monitors[0].use_rich is bar, role
    if not explorer_bar:
        assert "[explorer] step 1/3 reward 0.2500" in terminal.getvalue()
