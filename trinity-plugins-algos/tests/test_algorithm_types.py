"""Algorithm types: Trinity-RFT defaults and cross-field checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trinity_algos.algorithm_types import ALGORITHM_TYPES


def config(
    mode="both", repeat_times=8, algorithm_type="grpo", experience_path="data", auxiliary=None, **algo
):
    """A stand-in with the attribute paths of trinity.config.Config that check_config reads."""
    return SimpleNamespace(
        mode=mode,
        algorithm=SimpleNamespace(algorithm_type=algorithm_type, repeat_times=repeat_times, **algo),
        buffer=SimpleNamespace(
            trainer_input=SimpleNamespace(
                experience_buffer=SimpleNamespace(path=experience_path), auxiliary_buffers=auxiliary or {}
            )
        ),
    )


# name -> (repeat_times, advantage_fn, policy_loss_fn, kl_loss_fn, use_critic, use_reference, schema)
TRINITY_DEFAULTS = {
    "ppo": (1, "ppo", "ppo", "k2", True, True, "experience"),
    "grpo": (2, "grpo", "ppo", "k2", False, True, "experience"),
    "dapo": (16, "grpo", "ppo", "none", False, False, "experience"),
    "opmd": (2, "opmd", "opmd", "k2", False, True, "experience"),
    "asymre": (2, "asymre", "opmd", "none", False, False, "experience"),
    "rloo": (2, "rloo", "ppo", "k2", False, True, "experience"),
    "reinforceplusplus": (2, "reinforceplusplus", "ppo", "k2", False, True, "experience"),
    "gspo": (2, "grpo", "gspo", "k2", False, True, "experience"),
    "cispo": (2, "grpo", "cispo", "k2", False, True, "experience"),
    "mix": (8, "grpo", "mix", "k2", False, True, "experience"),
    "dpo": (2, None, "dpo", "k2", False, True, "dpo"),
    "sft": (1, None, "sft", "none", False, False, "sft"),
}


@pytest.mark.parametrize("name", sorted(TRINITY_DEFAULTS))
def test_defaults_follow_trinity_rft(name):
    cls = ALGORITHM_TYPES[name]
    repeat, adv, loss, kl, critic, ref, schema = TRINITY_DEFAULTS[name]
    cfg = cls.default_config()
    assert cfg["repeat_times"] == repeat
    assert cfg.get("advantage_fn") == adv
    assert cfg["policy_loss_fn"] == loss and cfg["kl_loss_fn"] == kl
    assert (cls.use_critic, cls.use_reference, cls.schema) == (critic, ref, schema)
    assert cls.use_advantage == (adv is not None)


def test_only_dpo_forbids_batch_balancing():
    assert [n for n, c in ALGORITHM_TYPES.items() if not c.can_balance_batch] == ["dpo"]


@pytest.mark.parametrize("name", ["grpo", "dapo", "opmd", "asymre", "rloo", "gspo", "cispo", "mix"])
def test_group_algorithms_need_several_rollouts(name):
    with pytest.raises(ValueError, match=r"algorithm\.repeat_times"):
        ALGORITHM_TYPES[name].check_config(config(repeat_times=1, algorithm_type=name))
    ALGORITHM_TYPES[name].check_config(
        config(repeat_times=2, algorithm_type=name, auxiliary={"sft_dataset": object()})
    )


@pytest.mark.parametrize("name", ["ppo", "reinforceplusplus"])
def test_non_group_algorithms_accept_one_rollout(name):
    ALGORITHM_TYPES[name].check_config(config(repeat_times=1, algorithm_type=name))


@pytest.mark.parametrize("name", ["dpo", "sft"])
def test_offline_algorithms_train_mode_only(name):
    for mode in ("both", "explore"):
        with pytest.raises(ValueError, match=r"mode.*train"):
            ALGORITHM_TYPES[name].check_config(config(mode=mode, algorithm_type=name))
    with pytest.raises(ValueError, match=r"experience_buffer\.path"):
        ALGORITHM_TYPES[name].check_config(config(mode="train", algorithm_type=name, experience_path=None))
    ALGORITHM_TYPES[name].check_config(config(mode="train", algorithm_type=name))


def test_mix_needs_expert_buffer():
    with pytest.raises(ValueError, match=r"auxiliary_buffers\.sft_dataset"):
        ALGORITHM_TYPES["mix"].check_config(config(algorithm_type="mix", sample_strategy="mix"))
    ALGORITHM_TYPES["mix"].check_config(
        config(
            algorithm_type="mix",
            sample_strategy="mix",
            sample_strategy_args={"sft_dataset_name": "expert"},
            auxiliary={"expert": object()},
        )
    )
