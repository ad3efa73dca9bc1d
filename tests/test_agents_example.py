"""The CPU agent example (examples/agents): its config loads as documented, and its task and
warm-up corpus generation gives held-out maps no train task shares and episodes the SFT reader
trains move by move. The example itself is not run here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trinity.config import load_config, stage_configs

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agents"

pytest.importorskip("trinity_agents")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("agents_example_run", EXAMPLE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_is_sft_then_step_wise_rl_on_cpu_backends(monkeypatch, tmp_path, example):
    monkeypatch.setenv("AGENTS_EXAMPLE_DIR", str(tmp_path))
    sft, rl = stage_configs(load_config(EXAMPLE / "frozen_lake.yaml"))
    assert (sft.mode, sft.algorithm.algorithm_type) == ("train", "sft")
    sft_data = sft.buffer.trainer_input.experience_buffer
    assert sft_data.path == f"{tmp_path}/data/sft"
    assert (sft_data.format.prompt_type, sft_data.format.enable_concatenated_multi_turn) == ("messages", True)
    assert (rl.mode, rl.algorithm.algorithm_type) == ("both", "gigpo")
    assert rl.explorer.eval_on_startup  # the first eval is the SFT-only model
    assert rl.explorer.rollout_model.engine_type == "transformers"
    assert rl.trainer.trainer_type == "native"
    [taskset] = rl.buffer.explorer_input.tasksets
    assert taskset.path == f"{tmp_path}/data/rl" and taskset.default_workflow_type == "frozen_lake_workflow"
    args = taskset.workflow_args
    assert args["step_wise"] is True and args["max_model_len"] == rl.model.max_model_len
    # run.py plays the warm-up corpus with the workflow_args the run uses
    assert {k: args[k] for k in example.WORKFLOW_ARGS} == example.WORKFLOW_ARGS
    # a training step holds every turn of an explore step
    assert (
        rl.buffer.train_batch_size
        >= rl.buffer.batch_size * rl.algorithm.repeat_times * args["agent_max_steps"]
    )
    evals = rl.buffer.explorer_input.eval_tasksets
    assert [t.name for t in evals] == ["heldout", "practice"]
    assert evals[0].path == f"{tmp_path}/data/heldout" and evals[0].split == "test"
    # "practice" evaluates exactly the maps RL practises, each seen several times over the stage
    assert (evals[1].path, evals[1].split) == (taskset.path, taskset.split)
    assert rl.buffer.total_steps * rl.buffer.batch_size >= 4 * example.PRACTICE_MAPS
    for t in evals:  # greedy, on the same protocol
        assert t.rollout_args.temperature == 0.0 and t.workflow_args == args


def test_tasks_and_warmup_corpus(example, tmp_path):
    from trinity.buffer.sft import ChatTokenizer, sft_experience
    from trinity.config import FormatConfig
    from trinity.testing.tiny_model import build_tokenizer
    from trinity_agents.frozen_lake import parse_action

    train, test = example.make_tasks(train=300, test=40)
    assert len(test) == 40 and 200 < len(train) < 300  # small maps repeat: the shared ones go
    assert not {example.map_key(r) for r in train} & {example.map_key(r) for r in test}
    assert (train, test) == example.make_tasks(train=300, test=40)  # deterministic

    practice = example.practice_maps(train[100:], train[:100], count=20)
    keys = [example.map_key(r) for r in practice]
    assert len(practice) == 20 and len(set(keys)) == 20  # distinct maps
    assert not set(keys) & {example.map_key(r) for r in train[:100] + test}

    corpus, walker = example.warmup_corpus(train[:30])
    assert corpus == example.warmup_corpus(train[:30])[0] and 0.3 < walker <= 1.0
    chat = ChatTokenizer(build_tokenizer())
    fmt = FormatConfig(prompt_type="messages", messages_key="messages", enable_concatenated_multi_turn=True)
    for row in corpus:
        messages = json.loads(json.dumps(row))["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
        assert all(parse_action(m["content"]) for m in messages if m["role"] == "assistant")
        assert all(set(m["content"]) <= set("P_OG\n") for m in messages if m["role"] == "user")
        exp = sft_experience(row, fmt, chat)
        trained = [t for t, keep in zip(exp.tokens[exp.prompt_length :], exp.action_mask) if keep]
        assert chat.tokenizer.decode(trained).count("```") == len(messages)  # two per move
        assert len(exp.tokens) <= 352  # fits the run's max_model_len

    # the scripted walker with no random moves is the oracle
    import random

    assert all(example.play(r, example.warmup_policy(random.Random(0), 0.0))[1] for r in test[:20])
