"""Each stage starts from the previous stage's weights: every derived model path follows."""

from __future__ import annotations

import contextlib
import signal

import pytest

from trinity.config import load_config, stage_configs
from trinity.launcher import start_from

CONFIG = """
project: p
name: n
model: {model_path: /models/base, max_prompt_tokens: 8, max_response_tokens: 8}
algorithm: {algorithm_type: grpo, repeat_times: 2}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {name: t, path: /data, format: {prompt_key: q, response_key: a}}
explorer: {rollout_model: {engine_type: transformers}}
trainer: {trainer_type: native}
stages:
  - stage_name: sft
    mode: train
    algorithm: {algorithm_type: sft}
    buffer: {trainer_input: {experience_buffer: {name: sft, storage_type: file, path: /sft}}}
  - stage_name: rl
"""


def test_second_stage_rolls_out_and_trains_the_first_stages_weights(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(CONFIG)
    sft, rl = stage_configs(load_config(path))
    assert rl.explorer.rollout_model.model_path == "/models/base"  # as resolved, before the run

    rl = start_from(rl, "/ckpt/sft/global_step_10")
    assert rl.model.model_path == "/ckpt/sft/global_step_10"
    assert rl.explorer.rollout_model.model_path == "/ckpt/sft/global_step_10"
    assert rl.model.critic_model_path == "/ckpt/sft/global_step_10"
    assert rl.buffer.tokenizer_path == "/ckpt/sft/global_step_10"

    sft = start_from(sft, "/ckpt/other")
    assert sft.buffer.trainer_input.experience_buffer.tokenizer_path == "/ckpt/other"


def test_a_stage_trains_lora_from_the_previous_stages_full_weights(tmp_path):
    # Full-weight SFT, then RL with an adapter: stages[].model is merged over the global model
    # section for that stage only, and the stage still starts from the previous stage's weights.
    path = tmp_path / "job.yaml"
    path.write_text(CONFIG + "    model: {lora_configs: [{lora_rank: 4}], max_response_tokens: 16}\n")
    sft, rl = stage_configs(load_config(path))
    assert sft.model.lora_configs is None and sft.model.max_response_tokens == 8
    assert [c.lora_rank for c in rl.model.lora_configs] == [4] and rl.model.max_response_tokens == 16
    assert rl.model.max_prompt_tokens == 8  # the global keys the stage does not set
    rl = start_from(rl, "/ckpt/sft/global_step_10")
    assert rl.model.model_path == "/ckpt/sft/global_step_10" and rl.model.lora_configs[0].lora_rank == 4


def test_paths_the_user_set_elsewhere_are_kept(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        CONFIG.replace("max_response_tokens: 8}", "max_response_tokens: 8, critic_model_path: /critic}")
    )
    _, rl = stage_configs(load_config(path))
    rl = start_from(rl, "/ckpt/new")
    assert rl.model.critic_model_path == "/critic"
    assert rl.explorer.rollout_model.model_path == "/ckpt/new"


def test_keys_interpolated_from_the_model_path_follow_it(tmp_path):
    # ${model.model_path} is replaced by the path when the YAML loads: the later stage must
    # still roll out, and tokenize with, the previous stage's weights.
    path = tmp_path / "job.yaml"
    path.write_text(
        CONFIG.replace(
            "explorer: {rollout_model: {engine_type: transformers}}",
            "explorer: {rollout_model: {engine_type: transformers, model_path: '${model.model_path}'}}",
        )
    )
    _, rl = stage_configs(load_config(path))
    assert "model_path" in rl._source["explorer"]["rollout_model"]  # the user set it
    rl = start_from(rl, "/ckpt/sft/global_step_10")
    assert rl.explorer.rollout_model.model_path == "/ckpt/sft/global_step_10"
    assert rl.checkpoint_job_dir.endswith("/p/n/rl")  # everything else resolved as before


def test_an_interrupt_whose_raise_was_swallowed_still_stops_the_step_loop(tmp_path):
    # Ray can run the signal handler inside a callback that drops the KeyboardInterrupt; the
    # flag it sets is what the step loop checks.
    from trinity import launcher
    from trinity.step_loop import StepLoop
    from trinity.sync import Synchronizer

    from .test_sync_styles import FakeRay, FakeTrainer, Monitor, _config

    def train_only_loop():
        ray = FakeRay()
        config = _config(tmp_path, method="checkpoint", mode="train", steps=2)
        monitors = {"explorer": Monitor(), "trainer": Monitor()}
        trainer = FakeTrainer(ray, 1, None)
        synchronizer = Synchronizer.from_config(config.synchronizer)
        return StepLoop(ray, config, None, trainer, synchronizer, monitors, launcher._INTERRUPTED), trainer

    launcher._INTERRUPTED.clear()
    loop, trainer = train_only_loop()
    assert loop.run().trainer_steps == 2  # no interrupt: the loop runs to its end
    with contextlib.suppress(KeyboardInterrupt):  # swallowed, as a callback in Ray's core would
        launcher._interrupt(signal.SIGINT, None)
    loop, trainer = train_only_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run()
        assert trainer.step == 0  # stopped before its first step
    finally:
        launcher._INTERRUPTED.clear()
