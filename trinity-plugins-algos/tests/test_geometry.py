"""The batch geometry of the algorithms registered here (step-wise algorithms, mix's split),
as config resolution derives it (trinity.config.geometry)."""

from __future__ import annotations

from trinity.config import Config, resolve_config

TASKSETS = {"explorer_input": {"tasksets": [{"path": "t.jsonl"}]}}


def resolved(**algorithm_and_buffer):
    algorithm = algorithm_and_buffer.pop("algorithm", {"algorithm_type": "grpo", "repeat_times": 4})
    buffer = {"batch_size": 3, **TASKSETS, **algorithm_and_buffer}
    return resolve_config(
        Config(model={"model_path": "m", "max_model_len": 64}, algorithm=algorithm, buffer=buffer)
    )


def test_a_step_wise_algorithm_trains_one_explore_step_per_step():
    g = resolved(
        algorithm={"algorithm_type": "multi_step_grpo", "repeat_times": 2}, train_batch_size=64
    ).geometry
    assert g.step_wise and g.algorithm_type == "multi_step_grpo" and g.experiences_per_train_step == 64
    assert g.explore_steps_per_train_step == 1.0 and g.explore_steps_through(3) == 3


def test_mix_losses_get_the_split_from_resolution_not_from_check_config():
    from trinity.plugins import get_component

    config = resolve_config(
        Config(
            model={"model_path": "m", "max_model_len": 64},
            algorithm={"algorithm_type": "mix", "sample_strategy_args": {"expert_data_ratio": 0.25}},
            buffer={
                "batch_size": 2,
                "train_batch_size": 18,
                **TASKSETS,
                "trainer_input": {"auxiliary_buffers": {"sft_dataset": {"path": "sft.jsonl"}}},
            },
        )
    )
    args = config.algorithm.policy_loss_fn_args
    assert (args["train_batch_size_usual"], args["train_batch_size_expert"]) == (13, 5)  # ceil(0.25 * 18)
    before = config.model_dump()
    get_component("algorithm_type", "mix").check_config(config)
    assert config.model_dump() == before  # check_config validates only


def test_mix_counts_explore_steps_by_the_rollout_share_of_a_batch():
    """Trinity-RFT's mix_vlm: train_batch_size 320 = 256 rollouts (32 tasks x 8) + 64 expert rows
    (expert_data_ratio 0.2): one explore step fills one train step, the expert rows come from the
    auxiliary buffer. Counting all 320 as rollouts would make a train step wait for 1.25 explore
    steps (and a sync_interval 1 job wait on itself)."""
    for algorithm_type, ratio, expected in (("mix_chord", 0.2, 1.0), ("mix", 0.2, 1.0), ("mix", None, 0.625)):
        sample_args = {} if ratio is None else {"expert_data_ratio": ratio}  # default ratio: 0.5
        config = resolve_config(
            Config(
                model={"model_path": "m", "max_model_len": 64},
                algorithm={"algorithm_type": algorithm_type, "sample_strategy_args": sample_args},
                buffer={
                    "batch_size": 32,
                    "train_batch_size": 320,
                    **TASKSETS,
                    "trainer_input": {"auxiliary_buffers": {"sft_dataset": {"path": "sft.jsonl"}}},
                },
            )
        )
        g = config.geometry
        assert g.experiences_per_train_step == 320 and g.rollouts_per_explore_step == 256
        assert g.explore_steps_per_train_step == expected, algorithm_type
    # An algorithm that reads its whole batch from the explorer is unchanged.
    assert resolved(train_batch_size=24).geometry.explore_steps_per_train_step == 2.0
