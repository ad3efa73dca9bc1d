"""The veRL back-end's pure parts, without veRL: config translation and batch conversion.

What needs veRL itself (a real ``DataProto``, veRL's unpadding, its config dataclasses and every
name the back-end calls) is tested in ``test_verl_api.py`` under ``nox -s verl_api``.
"""

from __future__ import annotations

import copy
import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from trinity.config import load_config, resolve_config
from trinity.config.errors import ConfigError
from trinity.config.validation import validate_config
from trinity.experience import EID, Experience
from trinity.plugins import install_hint
from trinity.trainer.components import MissingInputError
from trinity.trainer.verl.config import build_verl_config, trainer_gpu_split
from trinity.trainer.verl.dataproto import (
    VERL_TO_TRINITY,
    build_verl_batch,
    pad_rows,
    verl_non_tensors,
    verl_tensors,
)
from trinity.trainer.verl.loss import ActorLoss, global_loss_scale

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verl"


def _config(mode: str = "both", explorer: dict | None = None, cluster: dict | None = None, **sections: Any):
    data: dict[str, Any] = {
        "mode": mode,
        "project": "p",
        "name": "n",
        "checkpoint_root_dir": "/tmp/trinity-verl-test",
        "model": {"model_path": "org/model", "max_prompt_tokens": 100, "max_response_tokens": 200},
        "algorithm": sections.pop("algorithm", {"algorithm_type": "grpo", "repeat_times": 4}),
        "cluster": cluster or {"node_num": 1, "gpu_per_node": 8},
        "explorer": explorer or {},
        "buffer": {
            "batch_size": 8,
            "explorer_input": {"tasksets": [{"name": "t", "storage_type": "file", "path": "/unused"}]},
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
            },
        },
        **sections,
    }
    return resolve_config(validate_config(data))


def _select(tree: dict, path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


# -- GPU split -----------------------------------------------------------------------------------


def test_trainer_gets_the_gpus_the_explorer_and_auxiliary_models_leave():
    explorer = {
        "rollout_model": {"engine_num": 2, "tensor_parallel_size": 2},
        "auxiliary_models": [{"model_path": "judge", "engine_num": 1, "tensor_parallel_size": 2}],
    }
    config = _config(explorer=explorer, cluster={"node_num": 2, "gpu_per_node": 8})
    # 16 GPUs - 2 engines x TP 2 - 1 judge x TP 2 = 10: not whole nodes of 8.
    with pytest.raises(ConfigError, match=r"10 GPUs.*unevenly"):
        trainer_gpu_split(config)
    config = _config(
        explorer={"rollout_model": {"engine_num": 4, "tensor_parallel_size": 2}},
        cluster={"node_num": 2, "gpu_per_node": 8},
    )
    assert trainer_gpu_split(config) == (1, 8)
    config = _config(explorer=explorer, cluster={"node_num": 1, "gpu_per_node": 8})
    assert trainer_gpu_split(config) == (1, 2)
    verl = build_verl_config(config)
    assert (verl["trainer"]["nnodes"], verl["trainer"]["n_gpus_per_node"]) == (1, 2)


def test_train_mode_gives_every_gpu_to_the_trainer_and_a_full_explorer_is_an_error():
    explorer = {"rollout_model": {"engine_num": 8}}
    assert trainer_gpu_split(
        _config(mode="train", explorer=explorer, cluster={"node_num": 3, "gpu_per_node": 4})
    ) == (3, 4)
    with pytest.raises(ConfigError, match="no GPU is left for the trainer") as err:
        trainer_gpu_split(_config(explorer=explorer))
    assert err.value.key == "cluster.gpu_per_node"


def test_unknown_cluster_size_asks_for_it_unless_passed_in():
    config = _config(cluster={"node_num": 0, "gpu_per_node": 0})
    with pytest.raises(ConfigError, match=r"set cluster\.node_num and cluster\.gpu_per_node"):
        build_verl_config(config)
    assert build_verl_config(config, node_num=1, gpu_per_node=4)["trainer"]["n_gpus_per_node"] == 3


# -- CPU (gloo) ----------------------------------------------------------------------------------


def test_on_cpu_the_ranks_come_from_verls_trainer_keys_and_no_gpu_split_applies():
    config = _config(cluster={"node_num": 0, "gpu_per_node": 0})
    verl = build_verl_config(config, device="cpu")
    assert (verl["trainer"]["nnodes"], verl["trainer"]["n_gpus_per_node"], verl["trainer"]["device"]) == (
        1,
        1,
        "cpu",
    )
    # Unset micro-batching: one micro-batch per rank, of the rank's share of the mini-batch.
    assert verl["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 32
    two = _config(
        cluster={"node_num": 0, "gpu_per_node": 0},
        trainer={"trainer_config": {"trainer": {"n_gpus_per_node": 2}}},
    )
    verl = build_verl_config(two, device="cpu")
    assert verl["trainer"]["n_gpus_per_node"] == 2
    assert verl["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 16
    bad = _config(trainer={"trainer_config": {"trainer": {"n_gpus_per_node": 0}}})
    with pytest.raises(ConfigError, match="must be a positive integer") as err:
        build_verl_config(bad, device="cpu")
    assert err.value.key == "trainer.trainer_config.trainer.n_gpus_per_node"


def test_cpu_settings_apply_on_cpu_only_and_the_users_keys_win():
    from trinity.trainer.verl.config import CPU_SETTINGS

    config = _config()
    cpu, gpu = build_verl_config(config, device="cpu"), build_verl_config(config)
    for path, (value, why) in CPU_SETTINGS.items():
        assert _select(cpu, path) == value and why, path
        with pytest.raises(KeyError):
            _select(gpu, path)
    # trainer.dtype auto: float32 on CPU (as the native trainer), veRL's own default on GPU.
    assert _select(cpu, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype") == "fp32"
    assert "mixed_precision" not in gpu["actor_rollout_ref"]["actor"]["fsdp_config"]
    bf16 = build_verl_config(_config(trainer={"dtype": "bfloat16"}), device="cpu")
    assert _select(bf16, "critic.fsdp.mixed_precision.param_dtype") == "bf16"
    eager = {"actor_rollout_ref": {"model": {"override_config": {"attn_implementation": "eager"}}}}
    mine = build_verl_config(_config(trainer={"trainer_config": eager}), device="cpu")
    assert _select(mine, "actor_rollout_ref.model.override_config.attn_implementation") == "eager"


def test_flash_attention_on_cpu_is_one_line_naming_the_key():
    flash = {"critic": {"model": {"override_config": {"attn_implementation": "flash_attention_2"}}}}
    config = _config(trainer={"trainer_config": flash})
    build_verl_config(config)  # on GPUs it is veRL's default
    with pytest.raises(
        ConfigError, match=r"'flash_attention_2' needs a CUDA GPU .* use one of sdpa, eager"
    ) as err:
        build_verl_config(config, device="cpu")
    assert err.value.key == "trainer.trainer_config.critic.model.override_config.attn_implementation"
    assert "\n" not in str(err.value)
    cuda = _config(trainer={"trainer_config": {"trainer": {"device": "cuda"}}})
    with pytest.raises(ConfigError, match="Ray reports no GPU") as err:
        build_verl_config(cuda, device="cpu")
    assert err.value.key == "trainer.trainer_config.trainer.device"


def test_placement_timeout_comes_from_the_environment_or_is_refused_in_one_line(monkeypatch):
    from trinity.trainer.verl.trainer import PLACEMENT_TIMEOUT_S, placement_timeout_s

    monkeypatch.delenv("TRINITY_VERL_PLACEMENT_TIMEOUT_S", raising=False)
    assert placement_timeout_s() == PLACEMENT_TIMEOUT_S < 60
    monkeypatch.setenv("TRINITY_VERL_PLACEMENT_TIMEOUT_S", "5")
    assert placement_timeout_s() == 5.0
    monkeypatch.setenv("TRINITY_VERL_PLACEMENT_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match=r"must be a positive number of seconds, got 'soon'"):
        placement_timeout_s()


# -- translation and trainer_config precedence ---------------------------------------------------


def test_translated_keys_follow_our_config():
    config = _config(
        algorithm={
            "algorithm_type": "grpo",
            "repeat_times": 4,
            "optimizer": {
                "lr": 3e-6,
                "optimizer_type": "sgd",
                "lr_scheduler_type": "cosine",
                "clip_grad": 0.5,
            },
            "loss_agg_mode": "seq-mean-token-mean",
        },
        trainer={
            "ppo_epochs": 2,
            "use_dynamic_bsz": False,
            "ppo_micro_batch_size_per_gpu": 3,
            "total_steps": 50,
        },
    )
    verl = build_verl_config(config)
    actor = verl["actor_rollout_ref"]["actor"]
    assert actor["optim"]["optimizer"] == "SGD" and actor["optim"]["lr"] == 3e-6
    assert actor["optim"]["lr_scheduler_type"] == "cosine"
    assert actor["grad_clip"] == 0.5  # an explicit optimizer.clip_grad wins over trainer.grad_clip
    assert actor["ppo_epochs"] == 2 and verl["critic"]["ppo_epochs"] == 2
    assert actor["loss_agg_mode"] == "seq-mean-token-mean"
    # train_batch_size 32 = ppo_mini_batch_size 8 x rollout.n 4, veRL's meaning.
    assert actor["ppo_mini_batch_size"] == 8 and verl["actor_rollout_ref"]["rollout"]["n"] == 4
    assert verl["actor_rollout_ref"]["rollout"]["log_prob_micro_batch_size_per_gpu"] == 3
    assert verl["actor_rollout_ref"]["ref"]["log_prob_use_dynamic_bsz"] is False
    assert actor["optim"]["total_training_steps"] == 50 == verl["critic"]["optim"]["total_training_steps"]
    assert verl["trainer"]["default_local_dir"] == config.job_dir
    assert verl["critic"]["enable"] is False  # GRPO has no critic


def test_unsupported_optimizer_names_the_key():
    config = _config(algorithm={"algorithm_type": "grpo", "optimizer": {"optimizer_type": "adafactor"}})
    with pytest.raises(ConfigError) as err:
        build_verl_config(config)
    assert err.value.key == "algorithm.optimizer.optimizer_type"


def test_trainer_config_wins_and_moves_the_keys_that_follow_it():
    user = {
        "actor_rollout_ref": {
            "actor": {
                "use_dynamic_bsz": False,
                "ppo_max_token_len_per_gpu": 1000,
                "optim": {"weight_decay": 0.0},
            },
            "ref": {"log_prob_max_token_len_per_gpu": 77},
        },
        "critic": {"model": {"fsdp_config": {"param_offload": True}}},
        "trainer": {"balance_batch": False},
    }
    config = _config(trainer={"use_dynamic_bsz": True, "trainer_config": copy.deepcopy(user)})
    verl = build_verl_config(config)
    arr = verl["actor_rollout_ref"]
    assert arr["actor"]["use_dynamic_bsz"] is False
    assert arr["actor"]["optim"]["weight_decay"] == 0.0
    assert arr["actor"]["optim"]["lr"] == config.algorithm.optimizer.lr  # siblings of a user key stay ours
    # Followers of a user-set leader move with it, unless the user set them too.
    assert arr["rollout"]["log_prob_use_dynamic_bsz"] is False
    assert arr["rollout"]["log_prob_max_token_len_per_gpu"] == 1000
    assert arr["ref"]["log_prob_max_token_len_per_gpu"] == 77
    assert verl["critic"]["ppo_max_token_len_per_gpu"] == 2000
    assert verl["critic"]["use_dynamic_bsz"] is False
    assert verl["trainer"]["balance_batch"] is False
    # Trinity-RFT's critic.model.fsdp_config is where veRL 0.9 reads it, critic.fsdp.
    assert verl["critic"]["fsdp"]["param_offload"] is True
    assert "fsdp_config" not in verl["critic"]["model"]
    assert config.trainer.trainer_config == user  # the config itself is untouched


# The veRL command lines of Trinity-RFT's "Align configuration with veRL" guide, for the keys our
# example configs carry (see examples/verl/*.yaml). The trainer gets fewer GPUs than veRL's
# colocated run, because our explorer has GPUs of its own.
PPO_CLI = {
    "algorithm.adv_estimator": "gae",
    "data.max_prompt_length": 1024,
    "data.max_response_length": 512,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.n": 1,
    "critic.optim.lr": 1e-5,
    "critic.model.use_remove_padding": True,
    "critic.optim.lr_warmup_steps_ratio": 0.05,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.ppo_micro_batch_size_per_gpu": 32,
    "critic.fsdp.param_offload": False,
    "critic.fsdp.optimizer_offload": False,
    "algorithm.use_kl_in_reward": False,
    "trainer.critic_warmup": 0,
    "trainer.project_name": "verl_example",
    "trainer.experiment_name": "Qwen2-7B-Instruct_hybrid_rm",
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 4,  # 8 - 2 rollout engines - 2 reward-model engines
    "trainer.save_freq": 20,
}
GRPO_CLI = {
    "algorithm.adv_estimator": "grpo",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "actor_rollout_ref.model.path": "deepseek-ai/deepseek-llm-7b-chat",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 24000,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "algorithm.use_kl_in_reward": False,
    "trainer.critic_warmup": 0,
    "trainer.project_name": "verl_grpo_example_gsm8k",
    "trainer.experiment_name": "deepseek_llm_7b_function_rm_seq_packing",
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 6,  # 8 - 1 rollout engine x TP 2
    "trainer.save_freq": 20,
}


@pytest.mark.parametrize(("example", "expected"), [("ppo.yaml", PPO_CLI), ("grpo.yaml", GRPO_CLI)])
def test_example_configs_translate_to_the_verl_command_line(example: str, expected: dict[str, Any]):
    verl = build_verl_config(load_config(EXAMPLES / example))
    wrong = {k: (_select(verl, k), v) for k, v in expected.items() if _select(verl, k) != v}
    assert not wrong, f"(ours, veRL's) differ: {wrong}"


def test_ppo_example_trains_a_critic_from_its_own_path():
    verl = build_verl_config(load_config(EXAMPLES / "ppo.yaml"))
    assert verl["critic"]["enable"] is True
    assert verl["critic"]["model"]["path"] == os.path.expanduser("~/models/Qwen2-7B-Instruct")


# -- batch conversion ----------------------------------------------------------------------------


def _exp(prompt, response, task, reward, logprobs=True, action_mask=None, run=0) -> Experience:
    tokens = torch.tensor(prompt + response)
    return Experience(
        tokens=tokens,
        prompt_length=len(prompt),
        reward=reward,
        logprobs=torch.full((len(response),), -0.5) if logprobs else None,
        action_mask=None if action_mask is None else torch.tensor(action_mask),
        eid=EID(batch=0, task=task, run=run),
    )


def _experiences() -> list[Experience]:
    return [
        _exp([1, 2, 3], [10, 11], task=0, reward=1.0),
        _exp([4], [12, 13, 14, 15], task=0, reward=0.0, run=1, action_mask=[1, 0, 0, 1]),
        _exp([5, 6], [16], task=1, reward=0.5),
    ]


def test_verl_tensors_have_verls_names_and_layout():
    batch = build_verl_batch(_experiences(), pad_token_id=0)
    t = verl_tensors(batch)
    assert torch.equal(t["prompts"], torch.tensor([[1, 2, 3], [0, 0, 4], [0, 5, 6]]))
    assert torch.equal(t["responses"], torch.tensor([[10, 11, 0, 0], [12, 13, 14, 15], [16, 0, 0, 0]]))
    assert torch.equal(torch.cat([t["prompts"], t["responses"]], dim=1), t["input_ids"])
    # response_mask is veRL's loss mask: the multi-turn action mask, as integers.
    assert t["response_mask"].dtype == torch.long
    assert torch.equal(t["response_mask"], torch.tensor([[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 0]]))
    assert torch.equal(t["rollout_log_probs"][1], torch.full((4,), -0.5))
    # Scores sit on each row's last action token; no KL penalty yet, so rewards equal scores.
    assert torch.equal(
        t["token_level_scores"], torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 0.0], [0.5, 0, 0, 0]])
    )
    assert torch.equal(t["token_level_rewards"], t["token_level_scores"])
    assert t["position_ids"][1].tolist() == [0, 0, 0, 1, 2, 3, 4]
    uids = verl_non_tensors(batch, _experiences())["uid"]
    assert uids[0] == uids[1] != uids[2]


def test_rollout_log_probs_only_when_every_experience_has_them():
    exps = _experiences()
    exps[2] = _exp([5, 6], [16], task=1, reward=0.5, logprobs=False)
    assert "rollout_log_probs" not in verl_tensors(build_verl_batch(exps))
    assert "rollout_log_probs" in verl_tensors(build_verl_batch(_experiences()))


def test_advantages_and_model_outputs_get_verls_names():
    keys = ("old_logprob", "ref_logprob", "values", "advantages", "returns")
    batch = build_verl_batch(_experiences()).with_(**{key: torch.randn(3, 4) for key in keys})
    t = verl_tensors(batch)
    for ours, theirs in [
        ("old_logprob", "old_log_probs"),
        ("ref_logprob", "ref_log_prob"),
        ("advantages", "advantages"),
        ("returns", "returns"),
        ("values", "values"),
    ]:
        assert torch.equal(t[theirs], batch[ours])
        assert VERL_TO_TRINITY[theirs] == ours
    assert VERL_TO_TRINITY["response_mask"] == "action_mask"


def test_dpo_pairs_and_empty_prompts_are_refused_with_a_reason():
    dpo = Experience(
        tokens=torch.tensor([1, 2]), prompt_length=2, chosen=torch.tensor([3]), rejected=torch.tensor([4])
    )
    with pytest.raises(ValueError, match="trainer_type: native"):
        build_verl_batch([dpo])
    with pytest.raises(ValueError, match="at least one prompt token"):
        build_verl_batch([_exp([], [1, 2], task=0, reward=1.0)])


def test_padding_rows_count_for_nothing():
    batch = build_verl_batch(_experiences()).with_(advantages=torch.ones(3, 4))
    padded, n = pad_rows(batch, 4)
    assert n == 3 and padded["input_ids"].shape[0] == 4
    assert torch.equal(padded["input_ids"][3], batch["input_ids"][2])
    assert padded["action_mask"][3].sum() == 0 and padded["advantages"][3].sum() == 0
    assert padded["rewards"][3] == 0 and len(padded["uids"]) == 4
    assert pad_rows(batch, 3)[0] is batch


# -- the actor loss ------------------------------------------------------------------------------


def _loss_inputs(rows: int = 6, width: int = 5):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(rows, width, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    tensors = {
        "action_mask": mask,
        "old_logprob": -torch.rand(rows, width, generator=gen),
        "ref_logprob": -torch.rand(rows, width, generator=gen),
        "advantages": torch.randn(rows, width, generator=gen),
    }
    logprob = tensors["old_logprob"] + 0.1 * torch.randn(rows, width, generator=gen)
    entropy = torch.rand(rows, width, generator=gen)
    return logprob, entropy, tensors


def _components(loss_agg_mode: str) -> ActorLoss:
    return ActorLoss(
        {
            "policy_loss_fn": "ppo",
            "policy_loss_fn_args": {"loss_agg_mode": loss_agg_mode},
            "kl_loss_fn": "low_var_kl",
            "kl_loss_fn_args": {"kl_coef": 0.1},
            "entropy_loss_fn": "default",
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
            "loss_agg_mode": loss_agg_mode,
        }
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("dp_size", [1, 2])
def test_scaled_micro_batch_losses_add_up_to_the_full_batch_loss(mode: str, dp_size: int):
    """What veRL does with our loss: per rank, sum the micro-batch losses; average over ranks."""
    loss_fn = _components(mode)
    logprob, entropy, tensors = _loss_inputs()
    full, _ = loss_fn.compute(logprob, entropy, tensors)
    rows = torch.arange(6)
    ranks = rows.chunk(dp_size)
    batch_num_tokens = float(tensors["action_mask"].sum())
    rank_sums = []
    for rank_rows in ranks:
        total = 0.0
        for mb in rank_rows.split(2 if dp_size == 1 else 1):  # uneven micro-batches per rank
            part = {k: v[mb] for k, v in tensors.items()}
            loss, _ = loss_fn.compute(logprob[mb], entropy[mb], part)
            scale = global_loss_scale(
                part["action_mask"],
                mode,
                batch_num_tokens=batch_num_tokens,
                global_batch_size=6,
                dp_size=dp_size,
            )
            total += float(loss) * scale
        rank_sums.append(total)
    assert sum(rank_sums) / dp_size == pytest.approx(float(full), rel=1e-5)


def test_actor_loss_is_policy_plus_kl_minus_entropy_and_reports_its_parts():
    loss_fn = _components("token-mean")
    logprob, entropy, tensors = _loss_inputs()
    comps = loss_fn.components()
    total, metrics = comps.actor_loss(logprob, entropy, tensors)
    pg, _ = comps.policy_loss_fn(logprob, entropy=entropy, **tensors)
    kl, _ = comps.kl_loss_fn.calculate_kl_loss(
        logprob, tensors["ref_logprob"], tensors["action_mask"], "token-mean"
    )
    ent, _ = comps.entropy_loss_fn(entropy, tensors["action_mask"], loss_agg_mode="token-mean")
    assert float(total) == pytest.approx(float(pg + kl - ent))
    assert metrics["loss"] == pytest.approx(float(total))
    assert "entropy" in metrics
    with pytest.raises(MissingInputError, match="kl_loss_fn 'low_var_kl' needs 'ref_logprob'"):
        comps.actor_loss(logprob, entropy, {k: v for k, v in tensors.items() if k != "ref_logprob"})


def test_actor_loss_travels_as_names_and_rebuilds_from_the_registry():
    loss_fn = _components("token-mean")
    assert loss_fn.needs_entropy()
    clone = pickle.loads(pickle.dumps(loss_fn))
    assert clone._components is None  # instances are rebuilt in the worker's own process
    logprob, entropy, tensors = _loss_inputs()
    assert float(clone.compute(logprob, entropy, tensors)[0]) == pytest.approx(
        float(loss_fn.compute(logprob, entropy, tensors)[0])
    )
    no_entropy = ActorLoss(
        {"policy_loss_fn": "ppo", "entropy_loss_fn": "default", "entropy_loss_fn_args": {"entropy_coef": 0}}
    )
    assert not no_entropy.needs_entropy()


def test_actor_loss_from_config_carries_the_algorithm_and_plugin_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_PLUGIN_DIRS", str(tmp_path))
    config = load_config(EXAMPLES / "grpo.yaml")
    loss_fn = ActorLoss.from_config(config)
    assert loss_fn.plugin_dirs == [str(tmp_path)]
    assert loss_fn.algorithm["kl_loss_fn"] == "low_var_kl"
    assert loss_fn.algorithm["kl_loss_fn_args"]["kl_coef"] == 0.001
    assert loss_fn.algorithm["policy_loss_fn"] == config.algorithm.policy_loss_fn


def test_an_unknown_policy_loss_fails_in_the_worker_with_the_registry_message():
    loss_fn = ActorLoss({"policy_loss_fn": "no_such_loss"})
    with pytest.raises(Exception, match="no_such_loss"):
        loss_fn.components()


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("verl") is not None, reason="veRL is installed here"
)
def test_verl_trainer_type_without_verl_says_what_to_install():
    from trinity.trainer.trainer import _build_backend

    config = _config(mode="train", trainer={"trainer_type": "verl"})
    with pytest.raises(RuntimeError, match=re.escape(install_hint("trinity-core", extra="verl"))):
        _build_backend(config)
