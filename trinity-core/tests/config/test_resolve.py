"""Derived values, algorithm defaults from the registry, aliases and stage inheritance."""

from __future__ import annotations

import os

import pytest

from trinity.config import Config, ConfigError, load_config, resolve_config, stage_configs
from trinity.config import resolve as resolve_module

REAL_GPU_PROBE = resolve_module.gpu_backend_available  # the autouse fixture replaces it in tests


def test_derived_values(write_yaml, minimal_yaml) -> None:
    config = load_config(write_yaml(minimal_yaml))
    assert config.buffer.train_batch_size == 8  # batch_size 2 * repeat_times 4
    assert config.model.max_model_len == 96  # 64 + 32
    assert config.model.critic_model_path == "tiny-model"
    assert config.ray_namespace == "Trinity-RFT/rft"
    assert config.checkpoint_root_dir == os.path.abspath("checkpoints")
    assert config.checkpoint_job_dir == config.job_dir == os.path.abspath("checkpoints/Trinity-RFT/rft")
    assert config.log.save_dir == os.path.join(config.job_dir, "log")
    assert config.monitor.cache_dir == os.path.join(config.job_dir, "monitor")
    ts = config.buffer.explorer_input.tasksets[0]
    assert (ts.repeat_times, ts.rollout_args.n, ts.batch_size) == (4, 4, 2)
    assert (ts.rollout_args.temperature, ts.rollout_args.top_k, ts.rollout_args.max_tokens) == (1.0, -1, 32)
    rm = config.explorer.rollout_model
    assert (rm.model_path, rm.max_model_len, rm.max_response_tokens, rm.gpu_per_engine) == (
        "tiny-model",
        96,
        32,
        1,
    )
    assert config.trainer.max_token_len_per_gpu == 192  # ceil(2 * 96 / 1)
    eb = config.buffer.trainer_input.experience_buffer
    assert (eb.name, eb.storage_type, eb.batch_size, eb.tokenizer_path) == (
        "experience_buffer",
        "queue",
        8,
        "tiny-model",
    )


def test_user_values_win_over_derived(write_yaml, minimal_yaml) -> None:
    text = minimal_yaml + "    project: p\n    name: n\n    ray_namespace: custom\n"
    text = text.replace("max_response_tokens: 32", "max_response_tokens: 32\n      max_model_len: 200")
    config = load_config(write_yaml(text), overrides=["buffer.train_batch_size=6"])
    assert config.model.max_model_len == 200
    assert config.buffer.train_batch_size == 6
    assert config.ray_namespace == "custom"


def test_checkpoint_root_from_environment(write_yaml, minimal_yaml, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    config = load_config(write_yaml(minimal_yaml))
    assert config.job_dir == str(tmp_path / "ckpt" / "Trinity-RFT" / "rft")


def test_algorithm_defaults_fill_only_unset_keys(write_yaml, minimal_yaml) -> None:
    text = minimal_yaml.replace(
        "repeat_times: 4",
        "repeat_times: 4\n      kl_loss_fn_args: {kl_coef: 0.2}\n      advantage_fn: gae\n      loss_agg_mode: seq-mean-token-mean",
    )
    algo = load_config(write_yaml(text)).algorithm
    assert algo.advantage_fn == "gae"
    # grpo's default advantage args belong to its default estimator, so gae starts from its own.
    assert algo.advantage_fn_args == {"gamma": 1.0, "lam": 0.95}
    # default_config() gives kl_coef 0.05; the user's 0.2 wins; KLFn.default_args() fills the rest.
    assert algo.kl_loss_fn_args == {"kl_coef": 0.2, "adaptive": False, "target_kl": None, "horizon": None}
    assert algo.policy_loss_fn_args == {"clip_range": 0.2, "loss_agg_mode": "seq-mean-token-mean"}
    assert algo.sample_strategy == "default" and algo.sample_strategy_args == {}


def test_algorithm_repeat_times_default_comes_from_the_type(write_yaml, minimal_yaml) -> None:
    config = load_config(write_yaml(minimal_yaml.replace("      repeat_times: 4\n", "")))
    assert config.algorithm.repeat_times == 2  # FakeGRPO.default_config()
    assert config.buffer.train_batch_size == 4


def test_sft_schema_and_train_mode(write_yaml) -> None:
    config = load_config(
        write_yaml(
            """
            mode: train
            model: {model_path: m, max_model_len: 128}
            algorithm: {algorithm_type: sft}
            buffer:
              trainer_input:
                experience_buffer: {storage_type: file, path: sft.jsonl, format: {prompt_type: Messages}}
            """
        )
    )
    eb = config.buffer.trainer_input.experience_buffer
    assert (eb.schema_type, eb.format.prompt_type) == ("sft", "messages")
    assert config.algorithm.advantage_fn is None
    assert config.synchronizer.sync_method == "checkpoint"  # not both-mode: nothing to broadcast to


def test_trinity_rft_aliases_load(write_yaml, minimal_yaml, tmp_path) -> None:
    (tmp_path / "verl.yaml").write_text("actor_rollout_ref:\n  actor:\n    ppo_epochs: 2\n")
    text = minimal_yaml.replace(
        "        tasksets:\n          - name: train\n            path: data/train.jsonl\n",
        "        taskset:\n          name: train\n          path: data/train.jsonl\n"
        "          task_selector: {selector_type: SHUFFLE, seed: 7}\n",
    )
    text += """
    explorer:
      rollout_model: {engine_type: vllm_async}
    synchronizer: {sync_method: online, sync_style: dynamic_by_explorer}
    trainer: {trainer_config_path: verl.yaml}
    monitor: {monitor_type: [console, TensorBoard]}
    log: {level: debug}
    """
    text = text.replace(
        "buffer:\n",
        "buffer:\n      trainer_input:\n        experience_buffer:\n"
        "          name: exp\n          use_priority_queue: true\n          reuse_cooldown_time: 5\n",
        1,
    )
    config = load_config(write_yaml(text))
    ei = config.buffer.explorer_input
    assert ei.taskset is None and [t.name for t in ei.tasksets] == ["train"]
    assert ei.tasksets[0].data_selector.selector_type == "shuffle" and ei.tasksets[0].data_selector.seed == 7
    assert config.explorer.rollout_model.engine_type == "vllm"
    assert (config.synchronizer.sync_method, config.synchronizer.sync_style) == ("nccl", "explorer_driven")
    assert config.trainer.trainer_config == {"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}}
    assert config.monitor.monitor_types() == ["console", "tensorboard"]
    assert config.log.level == "DEBUG"
    replay = config.buffer.trainer_input.experience_buffer.replay_buffer
    assert (replay.enable, replay.reuse_cooldown_time) == (True, 5)


def test_auto_backends_follow_gpu_availability(write_yaml, minimal_yaml, monkeypatch) -> None:
    monkeypatch.setattr(resolve_module, "gpu_backend_available", lambda package: True)
    config = load_config(write_yaml(minimal_yaml))
    assert config.explorer.rollout_model.engine_type == "vllm"
    assert config.trainer.trainer_type == "verl"
    # NCCL weight sync is not implemented yet: the default is memory even on GPUs.
    assert config.synchronizer.sync_method == "memory"


def test_gpu_probe_needs_the_package_installed() -> None:
    assert REAL_GPU_PROBE("surely_not_an_installed_package_xyz") is False


def test_resolve_is_idempotent(write_yaml, minimal_yaml) -> None:
    config = load_config(write_yaml(minimal_yaml))
    assert resolve_config(config).model_dump() == config.model_dump()


def test_programmatic_config_resolves() -> None:
    config = Config(
        model={"model_path": "m", "max_model_len": 64},
        algorithm={"algorithm_type": "ppo"},
        buffer={"batch_size": 3, "explorer_input": {"tasksets": [{"path": "t.jsonl"}]}},
    )
    resolved = resolve_config(config)
    assert resolved.buffer.train_batch_size == 3
    assert resolved.buffer.explorer_input.tasksets[0].name == "taskset_0"
    assert config.buffer.train_batch_size is None  # the input is not modified
    assert [c.name for c in stage_configs(resolved)] == ["rft"]


STAGES = """
    name: exp
    mode: both
    model: {model_path: m, max_model_len: 256}
    algorithm:
      algorithm_type: grpo
      repeat_times: 4
      kl_loss_fn_args: {kl_coef: 0.3}
      optimizer: {lr: 1e-5}
    buffer:
      batch_size: 4
      explorer_input:
        tasksets: [{name: math, path: math.jsonl}]
    trainer: {save_interval: 7}
    stages:
      - stage_name: sft_warmup
        mode: train
        algorithm: {algorithm_type: sft}
        buffer:
          train_batch_size: 64
          total_steps: 100
          trainer_input:
            experience_buffer: {name: sft_buffer, storage_type: file, path: sft.jsonl}
      - stage_name: rft
        algorithm:
          repeat_times: 8
        trainer: {save_interval: 3}
"""


def test_stages_inherit_global_keys(write_yaml) -> None:
    config = load_config(write_yaml(STAGES))
    sft, rft = stage_configs(config)
    assert (sft.name, rft.name) == ("exp/sft_warmup", "exp/rft")
    assert sft.job_dir.endswith(os.path.join("Trinity-RFT", "exp", "sft_warmup"))
    # A different algorithm type replaces the algorithm section: grpo's components are not inherited.
    assert (sft.mode, sft.algorithm.algorithm_type, sft.algorithm.kl_loss_fn) == ("train", "sft", "none")
    assert sft.algorithm.optimizer.lr == 1e-6
    assert (sft.buffer.train_batch_size, sft.buffer.total_steps, sft.buffer.batch_size) == (64, 100, 4)
    assert sft.buffer.trainer_input.experience_buffer.name == "sft_buffer"
    assert sft.trainer.save_interval == 7 and sft.stages == []
    # Same algorithm type: keys deep-merge.
    assert (rft.mode, rft.algorithm.algorithm_type, rft.algorithm.repeat_times) == ("both", "grpo", 8)
    assert rft.algorithm.kl_loss_fn_args["kl_coef"] == 0.3 and rft.algorithm.optimizer.lr == 1e-5
    assert rft.buffer.train_batch_size == 32  # 4 * 8, recomputed for the stage
    assert rft.buffer.explorer_input.tasksets[0].repeat_times == 8
    assert rft.trainer.save_interval == 3
    assert stage_configs(rft) == [rft]


def test_stage_errors_name_the_stage(write_yaml) -> None:
    path = write_yaml(STAGES.replace("repeat_times: 8", "repeat_times: 1"))
    config = load_config(path)
    with pytest.raises(ConfigError) as info:
        stage_configs(config)
    message = str(info.value)
    assert "in stage 'rft'" in message and "repeat_times must be at least 2" in message
    assert message.startswith(str(path) + ": ")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # (max_model_len, max_prompt_tokens, max_response_tokens, min_response_tokens) -> resolved
        ((None, 64, 32, 0), (96, 64, 32, 0)),
        ((4096, None, None, 0), (4096, 2048, 2048, 0)),  # half each, the prompt gets the floor
        ((4097, None, None, 0), (4097, 2048, 2049, 0)),
        ((12288, None, 8192, 0), (12288, 4096, 8192, 0)),  # upstream's grpo_toolcall
        ((100, None, 500, 0), (100, 1, 99, 0)),  # the response leaves the prompt one token
        ((100, 30, None, 0), (100, 30, 70, 0)),
        ((100, 500, None, 0), (100, 99, 1, 0)),
        ((100, 50, 10, 10), (100, 50, 10, 9)),  # min_response_tokens lowered below the max
    ],
)
def test_token_limits_follow_trinity_rfts_rules(given, expected) -> None:
    model = {"model_path": "m", "min_response_tokens": given[3]}
    model.update({k: v for k, v in zip(("max_model_len", "max_prompt_tokens", "max_response_tokens"), given)
                  if v is not None})  # fmt: skip
    config = resolve_config(
        Config(model=model, buffer={"batch_size": 1, "explorer_input": {"tasksets": [{"path": "t.jsonl"}]}})
    )
    m, rm = config.model, config.explorer.rollout_model
    assert (m.max_model_len, m.max_prompt_tokens, m.max_response_tokens, m.min_response_tokens) == expected
    assert (
        rm.max_model_len,
        rm.max_prompt_tokens,
        rm.max_response_tokens,
        rm.min_response_tokens,
    ) == expected


def test_auxiliary_models_inherit_the_limits_or_split_their_own() -> None:
    config = resolve_config(
        Config(
            model={"model_path": "m", "max_model_len": 1000, "max_response_tokens": 200},
            explorer={
                "auxiliary_models": [
                    {"model_path": "judge"},
                    {"model_path": "rm", "max_model_len": 64},
                    {"model_path": "long", "max_prompt_tokens": 3500},
                ]
            },
            buffer={"batch_size": 1, "explorer_input": {"tasksets": [{"path": "t.jsonl"}]}},
        )
    )
    judge, rm, long = config.explorer.auxiliary_models
    assert (judge.max_model_len, judge.max_prompt_tokens, judge.max_response_tokens) == (1000, 800, 200)
    assert (rm.max_model_len, rm.max_prompt_tokens, rm.max_response_tokens) == (64, 32, 32)
    assert (long.max_model_len, long.max_prompt_tokens, long.max_response_tokens) == (3700, 3500, 200)
    assert judge.enable_prompt_truncation is True
