"""Upstream's decoupled pair, ``examples/async_gsm8k/explorer.yaml`` + ``trainer.yaml`` (stored
unchanged under ``upstream_configs/``), loads as two sides of one run: a ``mode: explore`` job
and a ``mode: train`` job with the same job folder, sharing the ``queue`` buffer ``gsm8k_buffer``
through its SQL path (each job has a Ray of its own) and the weights through checkpoints.
``tests/e2e/test_decoupled.py`` runs such a pair for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity.config import load_config

UPSTREAM = Path(__file__).parent / "upstream_configs" / "async_gsm8k"


def test_the_async_gsm8k_pair_loads_as_two_sides_of_one_run(upstream_env):
    explore = load_config(UPSTREAM / "explorer.yaml")
    train = load_config(UPSTREAM / "trainer.yaml")
    assert (explore.mode, train.mode) == ("explore", "train")
    assert explore.checkpoint_job_dir == train.checkpoint_job_dir
    for config in (explore, train):
        buffer = config.buffer.trainer_input.experience_buffer
        # No shared Ray cluster: the queue is shared through its SQL backup, one file for both.
        assert (buffer.name, buffer.storage_type) == ("gsm8k_buffer", "sql")
        assert buffer.path == f"sqlite:///{upstream_env / 'gsm8k.db'}"
        assert config.synchronizer.sync_method == "checkpoint"
        assert config.synchronizer.sync_interval == 10
    # One training step takes one explorer step: 96 tasks x 8 rollouts.
    assert train.buffer.train_batch_size == explore.buffer.batch_size * explore.algorithm.repeat_times == 768


def test_on_a_shared_ray_cluster_the_pair_uses_the_named_queue(upstream_env, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    explore = load_config(UPSTREAM / "explorer.yaml")
    train = load_config(UPSTREAM / "trainer.yaml")
    for config in (explore, train):
        buffer = config.buffer.trainer_input.experience_buffer
        assert buffer.storage_type == "queue" and buffer.path == f"sqlite:///{upstream_env / 'gsm8k.db'}"
    assert (
        explore.buffer.trainer_input.experience_buffer.ray_namespace
        == train.buffer.trainer_input.experience_buffer.ray_namespace
        == "Trinity-RFT-gsm8k/async-qwen2.5-1.5B-gsm8k"
    )


def test_a_queue_without_a_path_cannot_be_shared_without_a_cluster(upstream_env, tmp_path):
    from trinity.config.errors import ConfigError

    text = (UPSTREAM / "trainer.yaml").read_text().replace("      path: 'sqlite:///gsm8k.db'\n", "")
    (tmp_path / "trainer.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "trainer.yaml")
    message = str(info.value)
    assert "\n" not in message and "buffer.trainer_input.experience_buffer.path" in message
    assert "give the queue a path" in message and "cluster.ray_address" in message


def test_nccl_between_two_jobs_without_one_ray_cluster_syncs_through_checkpoints(
    upstream_env, tmp_path, monkeypatch, caplog
):
    text = (
        (UPSTREAM / "explorer.yaml").read_text().replace("sync_method: 'checkpoint'", "sync_method: 'nccl'")
    )
    (tmp_path / "explorer.yaml").write_text(text)
    with caplog.at_level("WARNING", logger="trinity.config.resolve"):
        config = load_config(tmp_path / "explorer.yaml")
    assert config.synchronizer.sync_method == "checkpoint"  # as Trinity-RFT falls back
    (line,) = [r.getMessage() for r in caplog.records if "sync_method: 'nccl'" in r.getMessage()]
    assert "mode 'explore' reaches only when both jobs run on one Ray cluster" in line
    assert "syncs through checkpoints" in line
    caplog.clear()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # on one cluster: the train job broadcasts
    assert load_config(tmp_path / "explorer.yaml").synchronizer.sync_method == "nccl"
    assert not [r for r in caplog.records if "sync_method: 'nccl'" in r.getMessage()]


def test_the_experience_replay_example_loads_with_its_sync_style_and_priority_function(upstream_env):
    # ppo_countdown_exp_replay: explorer_driven (the trainer trains as long as the priority queue
    # has experiences) and decay_limit_randomization (each experience replayed a bounded number
    # of times).
    config = load_config(UPSTREAM.parent / "ppo_countdown_exp_replay" / "countdown.yaml")
    assert config.synchronizer.sync_style == "explorer_driven"
    replay = config.buffer.trainer_input.experience_buffer.replay_buffer
    assert replay.enable and replay.priority_fn == "decay_limit_randomization"
    assert replay.reuse_cooldown_time == 40
