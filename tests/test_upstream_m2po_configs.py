"""Upstream's M2PO example, ``examples/m2po_gsm8k/explorer.yaml`` + ``trainer.yaml`` (stored
unchanged under ``upstream_configs/``) load as they are: the trainer side asks for the rollout's
log-probs through ``algorithm.bypass_old_logprobs`` (Trinity-RFT 0.6's name for
``trainer.use_rollout_logprobs``, which M2PO needs), and passes ``trinity run --dry-run``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.config.errors import ConfigError

UPSTREAM = Path(__file__).parent / "upstream_configs" / "m2po_gsm8k"


def _with_trainer_key(tmp_path: Path, value: str) -> Path:
    text = (UPSTREAM / "trainer.yaml").read_text()
    assert text.count("\ntrainer:\n") == 1
    path = tmp_path / "trainer.yaml"
    path.write_text(text.replace("\ntrainer:\n", f"\ntrainer:\n  use_rollout_logprobs: {value}\n"))
    return path


def test_the_explorer_side_loads_unchanged(upstream_env):
    config = load_config(UPSTREAM / "explorer.yaml")
    algorithm = config.algorithm
    assert (config.mode, algorithm.algorithm_type, algorithm.policy_loss_fn) == ("explore", "m2po", "m2po")
    assert (algorithm.repeat_times, algorithm.advantage_fn) == (8, "grpo")
    assert algorithm.policy_loss_fn_args == {
        "m2_threshold": 0.04,
        "log_ratio_clip": 20.0,
        "loss_agg_mode": "token-mean",
    }


def test_the_trainer_side_loads_unchanged_with_the_rollout_logprobs(upstream_env, caplog, monkeypatch):
    from trinity_algos import algorithm_types

    monkeypatch.setattr(algorithm_types, "_M2PO_WARNED", set())  # the warning is once per process
    caplog.set_level(logging.WARNING)
    config = load_config(UPSTREAM / "trainer.yaml")
    # algorithm.bypass_old_logprobs: true is how it asks for them.
    assert config.trainer.use_rollout_logprobs and config.algorithm.policy_loss_fn == "m2po"
    assert (config.algorithm.kl_loss_fn, config.algorithm.entropy_loss_fn) == ("none", "none")
    # 256 experiences of up to 2048 tokens do not fit its 16384-token micro-batches.
    assert "raise trainer.max_token_len_per_gpu to 524288" in caplog.text
    assert "bypass_old_logprobs" not in caplog.text  # it had its effect


def test_the_trainers_own_key_wins_over_bypass_old_logprobs(upstream_env, tmp_path):
    with pytest.raises(ConfigError) as info:  # M2PO without the rollout's log-probs
        load_config(_with_trainer_key(tmp_path, "false"))
    message = str(info.value)
    assert "\n" not in message and "trainer.use_rollout_logprobs: true" in message


def test_trinity_run_dry_run(upstream_env, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from trinity.cli import cli

    model = tmp_path / "model"  # the dry run checks the model folder exists, not what it holds
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(model))
    result = CliRunner().invoke(cli, ["run", "--config", str(UPSTREAM / "trainer.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output[-2000:]
    assert "policy_loss_fn: m2po" in result.output and "m2_threshold: 0.04" in result.output
