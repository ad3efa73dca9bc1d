"""The veRL example configs (PPO, GRPO) load unchanged and resolve to the expected values."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from trinity.config import Config, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verl"


def test_grpo_example_resolves() -> None:
    config = load_config(EXAMPLES / "grpo.yaml")
    home = os.environ["HOME"]
    assert config.buffer.batch_size == 256
    assert config.buffer.train_batch_size == 2048  # given explicitly: 256 * 8
    assert config.algorithm.repeat_times == 8
    assert config.model.max_model_len == 1024  # 512 + 512
    assert config.model.critic_model_path == "deepseek-ai/deepseek-llm-7b-chat"
    # User-chosen components win; unset ones come from the fake grpo default_config().
    algo = config.algorithm
    assert (algo.advantage_fn, algo.policy_loss_fn, algo.kl_loss_fn, algo.kl_penalty_fn) == (
        "grpo",
        "clip",
        "low_var_kl",
        "none",
    )
    assert algo.kl_loss_fn_args == {"kl_coef": 0.001, "adaptive": False, "target_kl": None, "horizon": None}
    assert algo.entropy_loss_fn_args == {"entropy_coef": 0}
    assert algo.advantage_fn_args == {"epsilon": 1e-3, "std_threshold": None}
    assert algo.policy_loss_fn_args == {"clip_range": 0.2, "loss_agg_mode": "token-mean"}
    train, evaluation = (
        config.buffer.explorer_input.tasksets[0],
        config.buffer.explorer_input.eval_tasksets[0],
    )
    assert train.path == f"{home}/data/gsm8k"
    assert (train.repeat_times, train.rollout_args.n, train.is_eval) == (8, 8, False)
    assert (evaluation.repeat_times, evaluation.rollout_args.n, evaluation.is_eval) == (1, 1, True)
    assert train.rollout_args.temperature == 1.0 and train.rollout_args.max_tokens == 512
    assert config.trainer.max_token_len_per_gpu == 24000
    assert config.trainer.trainer_config["actor_rollout_ref"]["ref"]["fsdp_config"]["param_offload"] is True
    assert config.ray_namespace == "verl_grpo_example_gsm8k/deepseek_llm_7b_function_rm_seq_packing"
    assert config.job_dir == os.path.join(
        os.getcwd(), "checkpoints", "verl_grpo_example_gsm8k", "deepseek_llm_7b_function_rm_seq_packing"
    )
    # No GPU back-end in tests: auto picks the CPU ones and a sync method that works with them.
    assert config.explorer.rollout_model.engine_type == "transformers"
    assert config.trainer.trainer_type == "native"
    assert config.synchronizer.sync_method == "memory"
    assert config.synchronizer.sync_interval == 4 and config.synchronizer.sync_offset == 1
    assert config.monitor.monitor_type == "wandb"


def test_ppo_example_resolves() -> None:
    config = load_config(EXAMPLES / "ppo.yaml")
    home = os.environ["HOME"]
    assert config.algorithm.repeat_times == 1
    assert config.buffer.train_batch_size == 256
    assert config.model.model_path == f"{home}/models/Qwen2-7B-Instruct"
    assert config.model.max_model_len == 1536
    assert config.algorithm.optimizer.lr == 1e-6 and config.algorithm.optimizer.lr_warmup_steps_ratio == 0.1
    assert config.algorithm.advantage_fn == "ppo"
    assert config.algorithm.advantage_fn_args == {"gamma": 1.0, "lam": 0.95}
    assert config.algorithm.kl_loss_fn == "none"
    assert [t.name for t in config.buffer.explorer_input.tasksets] == ["gsm8k", "math"]
    assert [t.repeat_times for t in config.buffer.explorer_input.eval_tasksets] == [1, 1]
    aux = config.explorer.auxiliary_models[0]
    assert aux.model_path == f"{home}/models/FsfairX-LLaMA3-RM-v0.1" and aux.engine_num == 2
    assert config.explorer.eval_on_startup is False
    assert config.trainer.trainer_config["critic"]["optim"]["lr"] == 1e-5
    eb = config.buffer.trainer_input.experience_buffer
    assert (eb.name, eb.storage_type, eb.batch_size, eb.schema_type) == (
        "experience_buffer",
        "queue",
        256,
        "experience",
    )


def test_to_yaml_round_trips(tmp_path) -> None:
    config = load_config(EXAMPLES / "grpo.yaml")
    text = config.to_yaml()
    assert "train_batch_size: 2048" in text
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(text)
    again = load_config(dumped)
    assert again.model_dump() == config.model_dump()
    assert isinstance(yaml.safe_load(text), dict)


def test_overrides_apply_after_the_file() -> None:
    config = load_config(
        EXAMPLES / "grpo.yaml", overrides=["buffer.batch_size=4", "buffer.train_batch_size=32"]
    )
    assert (config.buffer.batch_size, config.buffer.train_batch_size) == (4, 32)
    config = load_config(EXAMPLES / "grpo.yaml", overrides={"algorithm.repeat_times": 2})
    assert config.buffer.explorer_input.tasksets[0].repeat_times == 2


def test_config_import_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, trinity.config; "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_defaults_build_without_a_file() -> None:
    assert Config().algorithm.algorithm_type == "ppo"
