"""End to end: every algorithm type added for Trinity-RFT 0.6 parity trains through `trinity run`.

One job, one Ray start, one stage per algorithm type (tiny model, two training steps each): each
stage starts from the previous stage's weights, so "its weights changed" compares its last
checkpoint with the previous stage's. Rewards come from ``varied_reward`` (a test plugin) so
rollout groups have a spread and every group-baseline algorithm gets a gradient; the step-wise
algorithms run the two-turn ``step_arith`` workflow, the distillation ones the math plugin's
``on_policy_distill_math_workflow`` with the untrained model as teacher. The last stage,
``agentscope_react``, trains ``multi_step_grpo`` on an AgentScope ReAct agent (trinity-plugins-agents)
that reaches the model only through the explorer's OpenAI API server, from the calls it recorded;
``frozen_lake`` trains it on FrozenLake episodes (``MultiTurnWorkflow``, step-wise).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, write_job

from .conftest import PLUGINS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Algorithm types run here, in stage order. (The stage names are the algorithm types.)
RL = ["topr", "sapo", "sppo", "rec", "grpo_verl", "raft", "mix_chord", "m2po", "rollout_correction"]
STEP_WISE = ["multi_step_grpo", "gigpo"]
DISTILL = ["on_policy_distill", "jsd"]
AGENTS = ["agentscope_react", "frozen_lake"]
STAGES = [*RL, *STEP_WISE, *DISTILL, "cpt", *AGENTS]
#: Stages not named after their algorithm type.
ALGORITHM = {
    "agentscope_react": "multi_step_grpo",
    "frozen_lake": "multi_step_grpo",
    "rollout_correction": "grpo",
}
#: Stages whose off-policy machinery logs metrics of its own (checked finite on both steps).
OFF_POLICY_METRICS = {"m2po": "actor/m2po/", "rollout_correction": "rollout_corr/"}


#: What every stage shares (each stage's own keys: ``_stage``).
def _base(root: Path) -> dict:
    return tiny_job(
        root,
        name="algos",
        mode="both",
        # The agent stage's system prompt and tool schemas: ~1,500 tokens.
        model={"max_prompt_tokens": 4096},
        buffer={
            "total_steps": 2,
            "explorer_input": {"default_reward_fn_type": "varied_reward"},
            "trainer_input": {"experience_buffer": {"storage_type": "queue", "path": None}},
        },
        explorer={"eval_interval": 100},
        synchronizer={"sync_method": "memory", "sync_interval": 1},
        trainer={"save_interval": 2},
    )


def _stage(name: str, root: Path) -> dict:
    """The stage's keys: the algorithm type plus what it needs to run and to learn something."""
    algorithm: dict = {
        "algorithm_type": ALGORITHM.get(name, name),
        "repeat_times": 2,
        "optimizer": {"lr": 1e-3},
    }
    stage: dict = {"stage_name": name, "algorithm": algorithm}
    if name in ("topr", "sapo", "rec", "grpo_verl", "multi_step_grpo", "gigpo", *AGENTS):
        algorithm["entropy_loss_fn_args"] = {"entropy_coef": 0.01}
    if name == "raft":
        # varied_reward gives 0, 0.5 or 1: keep the rollouts that scored at least 0.5.
        algorithm["advantage_fn_args"] = {"reward_threshold": 0.5}
    if name == "mix_chord":
        algorithm["sample_strategy_args"] = {"expert_data_ratio": 0.5}
        algorithm["policy_loss_fn_args"] = {"mu_warmup_steps": 1, "mu_decay_steps": 1, "mu_peak": 0.5}
        stage["buffer"] = {
            "trainer_input": {
                "auxiliary_buffers": {
                    "sft_dataset": {
                        "name": "expert",
                        "storage_type": "file",
                        "schema_type": "sft",
                        "path": str(root / "expert"),
                        "format": {"prompt_type": "messages", "messages_key": "messages"},
                    }
                }
            }
        }
    if name == "m2po":
        # M2PO's ratio is against the policy that sampled the rollouts.
        stage["trainer"] = {"use_rollout_logprobs": True}
    if name == "rollout_correction":
        # GRPO with veRL's token-level truncated importance weights and token rejection.
        algorithm["rollout_correction"] = {
            "rollout_is": "token",
            "rollout_is_threshold": 2.0,
            "rollout_rs": "token_k1",
            "rollout_rs_threshold": 2.0,
        }
    if name in STEP_WISE:
        # Two turns per episode: the training batch's upper bound is 2 x batch_size x repeat_times.
        stage["buffer"] = {"train_batch_size": 8, "explorer_input": {"default_workflow_type": "step_arith"}}
    if name in DISTILL:
        stage["buffer"] = {"explorer_input": {"default_workflow_type": "on_policy_distill_math_workflow"}}
        # The teacher: the untrained model, while the student has trained for several stages.
        stage["explorer"] = {
            "auxiliary_models": [
                {"model_path": str(root / "model"), "engine_type": "transformers", "dtype": "float32"}
            ]
        }
    if name == "agentscope_react":
        # With structured output and no tool call from the untrained model, an episode is
        # max_iters model calls plus the one asking for the final answer: several Experiences.
        stage["buffer"] = {
            "train_batch_size": 64,
            "explorer_input": {
                "default_workflow_type": "agentscope_react_math_workflow",
                "taskset": {"workflow_args": {"max_iters": 2}},
            },
        }
        stage["explorer"] = {
            "rollout_model": {
                "enable_openai_api": True,
                "enable_history": True,
                "tool_call_parser": "hermes",
                "enable_auto_tool_choice": True,
            }
        }
    if name == "frozen_lake":
        # The math model cannot write a move (no backtick in its vocabulary): every episode
        # runs its two turns, reward 0; the entropy term still trains.
        args = {"compact": True, "agent_max_steps": 2, "env_max_steps": 3, "step_wise": True}
        stage["buffer"] = {
            "train_batch_size": 64,
            "explorer_input": {
                "default_workflow_type": "frozen_lake_workflow",
                "taskset": {"path": str(root / "frozen_lake"), "workflow_args": args},
            },
        }
    if name == "cpt":
        stage["mode"] = "train"
        stage["buffer"] = {
            "trainer_input": {
                "experience_buffer": {
                    "name": "corpus",
                    "storage_type": "file",
                    "path": str(root / "corpus"),
                    "format": {"text_key": "text"},
                }
            }
        }
    return stage


def _write_data(root: Path) -> None:
    (root / "expert").mkdir()
    with (root / "expert" / "train.jsonl").open("w") as f:
        for a in range(8):
            messages = [
                {"role": "user", "content": f"{a}+1="},
                {"role": "assistant", "content": f"<think>{a}+1</think><answer>{a + 1}</answer>"},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    from trinity_agents.tasks import main as agent_tasks

    agent_tasks(
        ["frozen_lake", str(root / "frozen_lake"), "--train", "8", "--test", "2", "--map-max-size", "3"]
    )
    (root / "corpus").mkdir()
    with (root / "corpus" / "train.jsonl").open("w") as f:
        for a in range(8):
            f.write(json.dumps({"text": f"{a} plus {a} is {2 * a}."}) + "\n")


@pytest.fixture(scope="module")
def job(tmp_path_factory, math_job, trinity_run) -> Path:
    root = math_job(tmp_path_factory.mktemp("algos"), train=32, test=4)
    _write_data(root)
    config = {**_base(root), "stages": [_stage(name, root) for name in STAGES]}
    trinity_run(write_job(root / "job.yaml", config), "--plugin-dir", str(PLUGINS))
    return root


def _weights(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.mark.parametrize("index", range(len(STAGES)), ids=STAGES)
def test_each_algorithm_type_trains_finite_and_changes_the_weights(job, index):
    import torch

    from trinity.monitor.tensorboard import read_scalars

    name = STAGES[index]
    stage_dir = job / "ckpt" / "e2e" / "algos" / name
    assert (stage_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    scalars = read_scalars(stage_dir / "monitor" / "tensorboard" / "trainer")
    losses = [value for _, value in scalars["actor/loss"]]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), losses
    before = _weights(job / "model") if index == 0 else _weights(_last_checkpoint(STAGES[index - 1], job))
    after = _weights(stage_dir / "global_step_2")
    diffs = [(after[k] - before[k]).abs().max().item() for k in after if after[k].dtype.is_floating_point]
    assert max(diffs) > 0, f"stage {name}: training did not change the weights"
    assert all(torch.isfinite(t).all() for t in after.values())


def test_a_stage_runs_its_roles_in_the_previous_stages_processes(job):
    """A stage's explorer and trainer serve the next stage that runs the same role, restarted in
    place (:mod:`trinity.stage_actors`); ``cpt`` trains alone, so the stage after it starts a
    new explorer. The weights each stage starts from are checked above."""
    algos = job / "ckpt" / "e2e" / "algos"
    for role in ("explorer", "trainer"):
        pids: set[str] = set()  # the processes a run of consecutive stages had
        for previous, name in zip([None, *STAGES], STAGES):
            log = algos / name / "log" / f"{role}.log"
            ran_before = previous is not None and (algos / previous / "log" / f"{role}.log").is_file()
            restarted = (
                re.findall(r"restarted in place: process (\d+)", log.read_text()) if log.is_file() else []
            )
            assert len(restarted) == (1 if ran_before and log.is_file() else 0), (role, name, restarted)
            pids = pids | set(restarted) if restarted else set()
            assert len(pids) <= 1, (role, name, pids)


def _last_checkpoint(stage: str, job: Path) -> Path:
    return job / "ckpt" / "e2e" / "algos" / stage / "global_step_2"


@pytest.mark.parametrize(("name", "prefix"), OFF_POLICY_METRICS.items(), ids=list(OFF_POLICY_METRICS))
def test_off_policy_stages_log_their_metrics_finite(job, name, prefix):
    from trinity.monitor.tensorboard import read_scalars

    scalars = read_scalars(job / "ckpt" / "e2e" / "algos" / name / "monitor" / "tensorboard" / "trainer")
    logged = {
        tag: [value for _, value in points] for tag, points in scalars.items() if tag.startswith(prefix)
    }
    assert logged, f"{name}: no {prefix} metrics were logged (tags: {sorted(scalars)})"
    bad = {
        tag: values
        for tag, values in logged.items()
        if len(values) != 2 or not all(map(math.isfinite, values))
    }
    assert not bad, f"{name}: metrics not finite on both steps: {bad}"


def test_step_wise_stages_trained_on_two_step_trajectories(job):
    from trinity.monitor.tensorboard import read_scalars

    for name in STEP_WISE:
        scalars = read_scalars(job / "ckpt" / "e2e" / "algos" / name / "monitor" / "tensorboard" / "trainer")
        sizes = [value for _, value in scalars["trainer/num_experiences"]]
        episodes = [value for _, value in scalars["training/num_trajectories"]]
        # 2 tasks x 2 runs per step, each run two turns: twice as many experiences as episodes.
        assert episodes == [4.0, 4.0] and sizes == [8.0, 8.0], (name, sizes, episodes)


def test_distillation_stages_saw_the_teachers_logprobs(job):
    from trinity.monitor.tensorboard import read_scalars

    for name in DISTILL:
        scalars = read_scalars(job / "ckpt" / "e2e" / "algos" / name / "monitor" / "tensorboard" / "trainer")
        advantage = {tag for tag in scalars if tag.startswith("advantage/")}
        assert advantage, f"{name}: no advantage metrics were logged"


def test_frozen_lake_stage_trained_on_every_turn(job):
    from trinity.monitor.tensorboard import read_scalars

    stage_dir = job / "ckpt" / "e2e" / "algos" / "frozen_lake" / "monitor" / "tensorboard"
    trainer = read_scalars(stage_dir / "trainer")
    # 2 tasks x 2 runs per step, two turns each (no valid move ends an episode early).
    assert [v for _, v in trainer["training/num_trajectories"]] == [4.0, 4.0]
    assert [v for _, v in trainer["trainer/num_experiences"]] == [8.0, 8.0]


def test_agent_stage_trained_on_the_calls_its_openai_api_recorded(job):
    from trinity.monitor.tensorboard import read_scalars

    stage_dir = job / "ckpt" / "e2e" / "algos" / "agentscope_react" / "monitor" / "tensorboard"
    trainer = read_scalars(stage_dir / "trainer")
    sizes = [value for _, value in trainer["trainer/num_experiences"]]
    episodes = [value for _, value in trainer["training/num_trajectories"]]
    # 2 tasks x 2 runs per step; every episode is several recorded model calls.
    assert episodes == [4.0, 4.0] and all(s > e for s, e in zip(sizes, episodes)), (sizes, episodes)
    explorer = read_scalars(stage_dir / "explorer")
    calls = [value for _, value in explorer["rollout/model_calls"]]
    assert len(calls) == 2 and all(c >= 2 for c in calls), calls
    assert [value for _, value in explorer["rollout/failed_tasks"]] == [0.0, 0.0]
