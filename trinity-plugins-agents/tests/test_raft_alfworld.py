"""RAFT_alfworld_workflow / RAFT_reflect_alfworld_workflow, played against test_alfworld's fake
TextWorld game with scripted policies, and Trinity-RFT's two RAFT configs (stored unchanged under
upstream_configs/) loading and running on it."""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import FormatConfig, load_config
from trinity.plugins import get_component
from trinity.testing import check_component
from trinity.trainer.batch import build_batch
from trinity.workflow import Task
from trinity_agents.alfworld import AlfworldWorkflow
from trinity_agents.raft_alfworld import (
    RAFT_SYSTEM_PROMPT,
    SECOND_ATTEMPT_GUIDANCE,
    RAFTAlfworldWorkflow,
    RAFTReflectAlfworldWorkflow,
    format_raft_observation,
    parse_response,
    reward_feedback,
)
from trinity_agents.scripted import scripted_model

HERE = Path(__file__).parent
UPSTREAM = HERE / "upstream_configs"
END = "<|im_end|>"


def _load_fakes():
    # test_alfworld.py holds the fake household (tests are imported by path: --import-mode=importlib).
    spec = importlib.util.spec_from_file_location("_alfworld_fakes", HERE / "test_alfworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()
FakeTextWorldEnv, oracle_plan, SPRAY, APPLE = (
    fakes.FakeTextWorldEnv,
    fakes.oracle_plan,
    fakes.SPRAY,
    fakes.APPLE,
)
GAMES = {"spray": SPRAY, "apple": APPLE}


def reply(
    action: str, experience: str = "Explore first; carry one thing at a time.", think: str = "Next."
) -> str:
    return f"<experience>{experience}</experience>\n\n<think>{think}</think>\n\n<action>{action}</action>"


def steps_since_last_system(messages) -> int:
    """Assistant turns of the current attempt (a second attempt starts after a system message)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "system")
    return sum(m["role"] == "assistant" for m in messages[last:])


def oracle(game, fmt=reply):
    plan = oracle_plan(game)
    return lambda messages: fmt(plan[steps_since_last_system(messages)])


def random_player(seed: int):
    """In the format, commands from a vocabulary that cannot win (it never moves anything)."""
    rng = random.Random(seed)
    vocabulary = [
        "look", "inventory", "go to cabinet 1", "go to countertop 1", "go to toilet 1", "go to drawer 1",
        "open cabinet 1", "open drawer 1", "close cabinet 1", "take soapbar 1 from countertop 1",
        "take apple 1 from countertop 1", "examine toilet 1", "go to the moon",
    ]  # fmt: skip
    return lambda messages: reply(rng.choice(vocabulary))


def second_attempt(messages) -> bool:
    return sum(m["role"] == "system" for m in messages) > 1


@pytest.fixture(autouse=True)
def fake_env(monkeypatch):
    FakeTextWorldEnv.created = []
    monkeypatch.setattr(AlfworldWorkflow, "env_factory", staticmethod(FakeTextWorldEnv))
    return FakeTextWorldEnv


@pytest.fixture
def games(tmp_path):
    out = {}
    for name, game in GAMES.items():
        path = tmp_path / "json_2.1.1" / "train" / name / "trial_0" / "game.tw-pddl"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(game))
        out[name] = str(path)
    return out


def make_task(game_file, workflow=RAFTAlfworldWorkflow, is_eval=False, **workflow_args):
    return Task(
        workflow=workflow,
        raw_task={"game_file": game_file, "target": ""},
        format_args=FormatConfig(prompt_key="game_file"),
        workflow_args=workflow_args,
        is_eval=is_eval,
    )


def play(policy, game_file, workflow=RAFTAlfworldWorkflow, run=0, is_eval=False, **workflow_args):
    model = scripted_model(policy)
    wf = workflow(task=make_task(game_file, workflow, is_eval, **workflow_args), model=model)
    wf.set_repeat_times(1, run)
    return model, wf.run()


def is_placeholder(exp) -> bool:
    return exp.tokens.shape[0] == 2 and not bool(exp.action_mask.any()) and exp.reward == 0.0


# -- protocol --------------------------------------------------------------------------------


def test_parse_response_needs_all_three_blocks_in_order():
    assert parse_response(reply("go to cabinet 1", "E", "T")) == {
        "experience": "E",
        "think": "T",
        "action": "go to cabinet 1",
    }
    spaced = "<experience>\n a \n</experience> x <think> b\nc </think><action>  open drawer 1 \n</action>"
    assert parse_response(spaced) == {"experience": "a", "think": "b\nc", "action": "open drawer 1"}
    first = parse_response(reply("look") + reply("inventory"))
    assert first["action"] == "look"
    empty = {"experience": "", "think": "", "action": ""}
    for bad in (
        "<think>T</think><action>look</action>",  # no experience
        "<think>T</think><experience>E</experience><action>look</action>",  # out of order
        "<experience>E</experience><think>T</think><action>look",  # action not closed
        "go to cabinet 1",
        "",
        None,
    ):
        assert parse_response(bad) == empty, bad


def test_prompts_say_what_upstreams_say():
    for tag in ("<experience>", "<think>", "<action>"):
        assert tag in RAFT_SYSTEM_PROMPT and tag in RAFT_SYSTEM_PROMPT.split("A response looks like this:")[1]
    for command in ("go to (receptacle)", "take (object) from (receptacle)", "slice (object) with (object)"):
        assert command in RAFT_SYSTEM_PROMPT
    assert format_raft_observation("You arrive at desk 1.") == "Observation: You arrive at desk 1."
    nothing = format_raft_observation("Nothing happens.")
    assert nothing.startswith("Observation: Nothing happens. ") and "format" in nothing
    guidance = SECOND_ATTEMPT_GUIDANCE.format(reward_feedback="FEEDBACK")
    assert guidance.startswith("FEEDBACK\n\n") and "second attempt" in guidance
    assert "<experience>" in guidance and "same action" in guidance


def test_reward_feedback_branches():
    assert "completed the task in 4 steps" in reward_feedback(1.0, 4, True, 50)
    assert "only 0.500" in reward_feedback(0.5, 4, True, 50)
    assert "all 50 steps" in reward_feedback(0.0, 50, False, 50)
    assert "stopped after 3 steps" in reward_feedback(0.0, 3, False, 50)


# -- RAFT_alfworld_workflow ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["spray", "apple"])
def test_oracle_attempt_is_kept_as_one_sft_experience(games, name):
    plan = oracle_plan(GAMES[name])
    model, [exp] = play(oracle(GAMES[name]), games[name], run=2)
    [env] = FakeTextWorldEnv.created
    assert env.commands == plan and env.closed
    assert exp.reward == 1.0 and exp.eid.run == 2 and exp.eid.step == 0
    assert exp.info["raft_kept"] is True and exp.info["success"] is True and exp.info["steps"] == len(plan)
    assert exp.metrics["success"] == 1.0 and exp.metrics["raft_kept"] == 1.0
    response = exp.tokens[exp.prompt_length :]
    mask = exp.action_mask.bool()
    assert model.tokenizer.decode(response[mask].tolist()) == "".join(reply(c) + END for c in plan)
    prompt = model.tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
    assert prompt.startswith("<|im_start|>system\n" + RAFT_SYSTEM_PROMPT)
    assert "Observation: -= Welcome to TextWorld, ALFRED! =-" in prompt


def test_won_but_format_invalid_is_dropped(games):
    # Every reply plays the right action, but one lacks real <experience> text.
    plan = oracle_plan(SPRAY)

    def blank(messages):
        step = steps_since_last_system(messages)
        return reply(plan[step], experience=" " if step == 1 else "E")

    _, [exp] = play(blank, games["spray"])
    assert FakeTextWorldEnv.created[0].commands == plan
    assert is_placeholder(exp)
    assert exp.info["success"] is True and exp.info["reward"] == 1.0 and exp.info["format_valid"] is False
    assert exp.metrics["success"] == 1.0 and exp.metrics["raft_kept"] == 0.0


def test_oracle_and_random_players_score_as_expected(games):
    kept = []
    for name in games:
        _, [exp] = play(oracle(GAMES[name]), games[name])
        kept.append(exp.info["raft_kept"])
        for seed in range(4):
            _, [exp] = play(random_player(seed), games[name], max_env_steps=8)
            assert is_placeholder(exp) and exp.metrics["success"] == 0.0 and exp.info["reward"] == 0.0
            assert exp.info["steps"] <= 8
    assert kept == [True, True]


def test_three_identical_actions_end_the_attempt(games):
    model, [exp] = play(lambda m: reply("look"), games["spray"])
    [env] = FakeTextWorldEnv.created
    assert len(model.engine.calls) == 3 and env.commands == ["look", "look"]  # the third is not played
    assert exp.info["repeated_actions"] is True and exp.info["steps"] == 3 and is_placeholder(exp)
    assert env.closed


def test_malformed_replies_send_empty_actions_and_end_as_repeats(games):
    model, [exp] = play(lambda m: "I will go to cabinet 1.", games["spray"])
    [env] = FakeTextWorldEnv.created
    assert env.commands == ["", ""] and len(model.engine.calls) == 3
    shown = model.engine.calls[1]["messages"][-1]["content"]
    assert shown.startswith("Observation: Nothing happens. Check that your action")
    assert exp.info["repeated_actions"] is True and exp.info["format_valid"] is False and is_placeholder(exp)


def test_turn_limit_defaults_to_50(games):
    wf = RAFTAlfworldWorkflow(task=make_task(games["spray"]), model=scripted_model(lambda m: ""))
    assert wf.max_turns == 50
    assert RAFTAlfworldWorkflow(task=make_task(games["spray"], max_env_steps=4), model=None).max_turns == 4
    with pytest.raises(ValueError, match="step_wise does not apply"):
        RAFTAlfworldWorkflow(task=make_task(games["spray"], step_wise=True), model=None)


def test_eval_plays_once_and_reports_accuracy(games):
    _, [won] = play(oracle(SPRAY), games["spray"], is_eval=True)
    _, [lost] = play(random_player(0), games["spray"], is_eval=True, max_env_steps=5)
    assert won.metrics["accuracy"] == 1.0 and won.reward == 1.0 and not bool(won.action_mask.any())
    assert lost.metrics["accuracy"] == 0.0 and lost.reward == 0.0
    # the reflect workflow does not try twice on eval tasks
    _, [exp] = play(
        random_player(0), games["spray"], RAFTReflectAlfworldWorkflow, is_eval=True, max_env_steps=5
    )
    assert len(FakeTextWorldEnv.created) == 3 and exp.metrics["accuracy"] == 0.0


def test_raft_selection_trains_only_the_kept_rows(games):
    _, [won] = play(oracle(SPRAY), games["spray"], run=0)
    _, [lost] = play(random_player(1), games["spray"], run=1, max_env_steps=4)
    advantage_fn = get_component("advantage_fn", "raft")()
    batch, metrics = advantage_fn(build_batch([won, lost]).to_dict())
    assert metrics["kept_count"] == 1.0
    assert bool(batch["action_mask"][0].any()) and not bool(batch["action_mask"][1].any())


# -- RAFT_reflect_alfworld_workflow ----------------------------------------------------------


def test_reflect_second_attempt_learns_from_the_first(games):
    plan = oracle_plan(SPRAY)
    winner = oracle(SPRAY)
    policy = lambda m: winner(m) if second_attempt(m) else reply("look")  # noqa: E731
    model, [exp] = play(policy, games["spray"], RAFTReflectAlfworldWorkflow)
    first, second = FakeTextWorldEnv.created
    assert first.commands == ["look", "look"] and second.commands == plan and first.closed and second.closed
    # The second attempt's model calls see the first attempt, then the guidance.
    context = model.engine.calls[3]["messages"]
    assert [m["role"] for m in context[:8]] == ["system", *["user", "assistant"] * 3, "system"]
    guidance = context[7]["content"]
    assert guidance == SECOND_ATTEMPT_GUIDANCE.format(reward_feedback=reward_feedback(0.0, 3, False, 50))
    assert "stopped after 3 steps" in guidance
    # The experience is the clean second attempt: plain system prompt, its own turns only.
    assert exp.reward == 1.0 and exp.info["raft_kept"] is True
    assert exp.info["reward"] == 0.0 and exp.info["steps"] == 3
    assert exp.info["second_reward"] == 1.0 and exp.info["second_steps"] == len(plan)
    assert exp.info["improvement"] is True and exp.metrics["improvement"] == 1.0
    text = model.tokenizer.decode(exp.tokens.tolist())
    assert (
        text.startswith("<|im_start|>system\n" + RAFT_SYSTEM_PROMPT) and text.count("<|im_start|>system") == 1
    )
    assert "second attempt" not in text and "<action>look</action>" not in text
    response = exp.tokens[exp.prompt_length :]
    assert model.tokenizer.decode(response[exp.action_mask.bool()].tolist()) == "".join(
        reply(c) + END for c in plan
    )


def test_reflect_first_win_needs_no_second_attempt(games):
    _, [exp] = play(oracle(SPRAY), games["spray"], RAFTReflectAlfworldWorkflow)
    assert len(FakeTextWorldEnv.created) == 1 and exp.reward == 1.0 and exp.info["raft_kept"] is True
    # won with a blank <experience>: dropped, and no second attempt either
    plan = oracle_plan(SPRAY)
    blank = lambda m: reply(plan[steps_since_last_system(m)], experience=" ")  # noqa: E731
    _, [exp] = play(blank, games["spray"], RAFTReflectAlfworldWorkflow)
    assert len(FakeTextWorldEnv.created) == 2 and is_placeholder(exp)
    assert exp.info["success"] is True and exp.info["format_valid"] is False


def test_reflect_both_lost_is_a_placeholder_with_both_attempts_metrics(games):
    _, [exp] = play(lambda m: reply("look"), games["spray"], RAFTReflectAlfworldWorkflow, max_env_steps=6)
    first, second = FakeTextWorldEnv.created
    # Only first attempts end on repeats (as Trinity-RFT): the second plays all 6 turns.
    assert len(first.commands) == 2 and len(second.commands) == 6
    assert is_placeholder(exp) and exp.info["raft_kept"] is False
    assert (
        exp.info["second_steps"] == 6
        and exp.info["second_reward"] == 0.0
        and exp.info["improvement"] is False
    )
    assert exp.metrics["second_steps"] == 6.0 and exp.metrics["steps"] == 3.0


def test_reflect_first_out_of_turns_gets_the_step_limit_feedback(games):
    alternate = lambda m: reply(["look", "inventory"][steps_since_last_system(m) % 2])  # noqa: E731
    model, _ = play(alternate, games["spray"], RAFTReflectAlfworldWorkflow, max_env_steps=4)
    guidance = model.engine.calls[4]["messages"][9]
    assert guidance["role"] == "system" and "all 4 steps" in guidance["content"]


def test_reflect_second_win_out_of_format_is_dropped(games):
    plan = oracle_plan(SPRAY)
    policy = lambda m: (  # noqa: E731
        reply(plan[steps_since_last_system(m)], experience=" ") if second_attempt(m) else reply("look")
    )
    _, [exp] = play(policy, games["spray"], RAFTReflectAlfworldWorkflow)
    assert FakeTextWorldEnv.created[1].commands == plan
    assert is_placeholder(exp) and exp.info["second_reward"] == 1.0 and exp.info["format_valid"] is False


def test_reflect_second_attempt_failure_keeps_the_first_attempts_metrics(games, monkeypatch, caplog):
    made = []

    def flaky(game_file):
        made.append(game_file)
        if len(made) == 2:
            raise RuntimeError("the game server went away")
        return FakeTextWorldEnv(game_file)

    monkeypatch.setattr(AlfworldWorkflow, "env_factory", staticmethod(flaky))
    with caplog.at_level(logging.WARNING, logger="trinity_agents.raft_alfworld"):
        _, [exp] = play(lambda m: reply("look"), games["spray"], RAFTReflectAlfworldWorkflow)
    assert is_placeholder(exp) and exp.info["second_attempt_failed"] is True
    assert "went away" in exp.info["error"] and exp.metrics["steps"] == 3.0
    assert "second attempt" in caplog.text and "went away" in caplog.text


def test_reflect_record_dir(games, tmp_path):
    winner = oracle(SPRAY)
    policy = lambda m: winner(m) if second_attempt(m) else reply("look")  # noqa: E731
    play(policy, games["spray"], RAFTReflectAlfworldWorkflow, record_dir=str(tmp_path / "rec"))
    play(
        lambda m: reply("look"), games["spray"], RAFTReflectAlfworldWorkflow, record_dir=str(tmp_path / "rec")
    )
    [kept] = (tmp_path / "rec" / "sft_data").iterdir()
    [dropped] = (tmp_path / "rec" / "non_sft_data").iterdir()
    record = json.loads(kept.read_text())
    assert record["kept_for_sft"] is True and record["game_file"] == games["spray"]
    assert record["first_exploration"]["steps"] == 3 and record["second_exploration"]["success"] is True
    assert record["training_data"][0] == {"role": "system", "content": RAFT_SYSTEM_PROMPT}
    assert json.loads(dropped.read_text())["kept_for_sft"] is False
    # without record_dir nothing is written (Trinity-RFT always writes to the working directory)
    with pytest.raises(ValueError, match="record_dir"):
        RAFTReflectAlfworldWorkflow(task=make_task(games["spray"], record_dir=3), model=None)


def test_workflow_classes_conform_and_are_registered():
    for name, cls in (
        ("RAFT_alfworld_workflow", RAFTAlfworldWorkflow),
        ("RAFT_reflect_alfworld_workflow", RAFTReflectAlfworldWorkflow),
    ):
        check_component("workflow", cls)
        assert get_component("workflow", name) is cls
        assert cls.is_async and cls.can_reset and not cls.can_repeat


# -- Trinity-RFT's example configs, unchanged ------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path, games):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the dry run checks the folder
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(model))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    data = tmp_path / "alfworld_data"
    data.mkdir()
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(data))
    missing = str(tmp_path / "not-downloaded" / "game.tw-pddl")
    for split, rows in (("train", [games["spray"], missing, games["apple"]]), ("test", [games["apple"]])):
        (data / f"{split}.jsonl").write_text(
            "".join(json.dumps({"game_file": g, "target": ""}) + "\n" for g in rows)
        )
    return games


@pytest.mark.parametrize(
    ("name", "workflow"),
    [
        ("RAFT_alfworld_7B.yaml", RAFTAlfworldWorkflow),
        ("RAFT_reflect_alfworld_7B.yaml", RAFTReflectAlfworldWorkflow),
    ],
)
def test_upstream_configs_load_and_run(upstream_env, name, workflow):
    config = load_config(UPSTREAM / name)
    assert config.algorithm.algorithm_type == "raft" and config.algorithm.repeat_times == 1
    inputs = config.buffer.explorer_input
    [train], [evals] = inputs.tasksets, inputs.eval_tasksets
    assert get_component("workflow", train.default_workflow_type) is workflow
    reader = TasksetReader(train, config.buffer)
    assert len(reader) == 2 and sum(reader.skipped.values()) == 1  # the missing game file
    for task in reader.read_batch(2):
        assert task.workflow is workflow and task.rollout_args.top_k == 25
        game = json.loads(Path(task.task_desc).read_text())
        model = scripted_model(oracle(game))
        [exp] = task.to_workflow(model).run()
        assert exp.reward == 1.0 and exp.info["raft_kept"] is True
        sampled = model.engine.calls[0]["args"]
        assert (sampled.temperature, sampled.top_k, sampled.top_p) == (0.85, 25, 0.95)
    [task] = TasksetReader(evals, config.buffer).read_batch(1)
    assert task.is_eval and task.workflow is workflow
    [exp] = task.to_workflow(scripted_model(oracle(APPLE))).run()
    assert exp.metrics["accuracy"] == 1.0


def test_upstream_configs_pass_the_dry_run(upstream_env, tmp_path):
    # `trinity run --dry-run`, the real loader and checks, for both files in one process.
    script = (
        "from trinity.cli import cli\n"
        "for name in ('RAFT_alfworld_7B.yaml', 'RAFT_reflect_alfworld_7B.yaml'):\n"
        "    try:\n"
        f"        cli(['run', '--config', {str(UPSTREAM)!r} + '/' + name, '--dry-run'])\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, exc.code\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "default_workflow_type: RAFT_alfworld_workflow" in out.stdout
    assert "default_workflow_type: RAFT_reflect_alfworld_workflow" in out.stdout
    assert "algorithm_type: raft" in out.stdout
