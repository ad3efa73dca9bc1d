"""sciworld_workflow on ScienceWorld's real simulator (the `sciworld` extra, on Java).

One simulator (one Java VM) serves the module: the workflow's ``env_factory`` hands it out and its
``close_factory`` leaves it running, so each episode costs a task load (a fraction of a second)
rather than a VM start; the real start and close are tested once, and no VM outlives the module.
The simulator's own gold path is the oracle policy; a seeded player picking among the actions the
simulator lists as valid is the random one.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from trinity.buffer.taskset import TasksetReader
from trinity.config import FormatConfig, load_config
from trinity.plugins import get_component, install_hint
from trinity.testing import check_component
from trinity.workflow import Task
from trinity_agents import sciworld
from trinity_agents.multi_turn import Episode, Turn
from trinity_agents.sciworld import (
    SYSTEM_PROMPT,
    TRAIN_TASK_NAMES,
    UNKNOWN_ACTION,
    SciWorldWorkflow,
    close_sciworld_env,
    format_observation,
    make_sciworld_env,
    missing_packages,
    task_config_of,
    write_sciworld_data,
)
from trinity_agents.scripted import scripted_model

UPSTREAM = Path(__file__).parent / "upstream_configs"
needs_simulator = pytest.mark.skipif(
    shutil.which("java") is None, reason="ScienceWorld's simulator needs Java (.ci/run installs it)"
)


def _java_children() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "java" in p.name()
    }


@pytest.fixture(scope="module")
def simulator():
    pytest.importorskip("scienceworld", reason="the `sciworld` extra is not installed (it is optional)")
    if shutil.which("java") is None:
        pytest.skip("ScienceWorld's simulator needs Java (.ci/run installs it)")
    before = _java_children()
    env = make_sciworld_env()
    yield env
    close_sciworld_env(env)
    assert _java_children() <= before, "a ScienceWorld VM outlived the tests"


@pytest.fixture
def shared(monkeypatch, simulator):
    """The module's simulator as every episode's environment (closing it is left to the module)."""
    monkeypatch.setattr(SciWorldWorkflow, "env_factory", staticmethod(lambda jar_path: simulator))
    monkeypatch.setattr(SciWorldWorkflow, "close_factory", staticmethod(lambda env: None))
    return simulator


def make_task(task_name: str, var_num: int = 0, jar_path: str | None = None, **workflow_args) -> Task:
    desc = json.dumps({"task_name": task_name, "var_num": var_num, "jar_path": jar_path})
    return Task(
        workflow=SciWorldWorkflow,
        raw_task={"task_desc": desc, "targe": ""},
        format_args=FormatConfig(prompt_key="task_desc"),
        workflow_args=workflow_args,
    )


def play(policy, task: Task):
    model = scripted_model(policy)
    [exp] = task.to_workflow(model).run()
    return model, exp


def gold_and_start_score(env, task_name: str, var_num: int) -> tuple[list[str], int]:
    """The simulator's gold path of a task and the score its reset already gives."""
    env.load(task_name, var_num, "easy", generateGoldPath=True)
    gold = list(env.get_gold_action_sequence())
    _, infos = env.reset()
    return gold, int(infos["score"])


def replay(actions: list[str], then: str = "<action>look around</action>"):
    def policy(messages):
        step = sum(m["role"] == "assistant" for m in messages)
        return f"<think>step {step}</think><action>{actions[step]}</action>" if step < len(actions) else then

    return policy


def random_player(env, seed: int):
    rng = random.Random(seed)
    return lambda messages: (
        f"<action>{rng.choice(sorted(env.get_valid_action_object_combinations()))}</action>"
    )


# -- protocol, without the simulator ---------------------------------------------------------


def test_rows_are_read_as_trinity_rft_writes_them(tmp_path):
    row = {"task_desc": json.dumps({"task_name": "boil", "var_num": 3, "jar_path": "/x.jar"}), "targe": ""}
    assert task_config_of(row, "task_desc") == {"task_name": "boil", "var_num": 3, "jar_path": "/x.jar"}
    assert task_config_of({"other": {"task_name": "melt", "var_num": 0}}, "other")["jar_path"] is None
    fmt = FormatConfig(prompt_key="task_desc")
    assert "does not exist: /x.jar" in SciWorldWorkflow.row_problem(row, fmt)
    for bad, message in (
        ({"task_desc": "{not json"}, "not JSON text"),
        ({"task_desc": json.dumps({"var_num": 1})}, "no task_name"),
        ({"task_desc": json.dumps({"task_name": "boil", "var_num": -1})}, "var_num"),
        ({"prompt": "hi"}, "no task under 'task_desc'"),
    ):
        assert message in SciWorldWorkflow.row_problem(bad, fmt)
    assert (
        SciWorldWorkflow.row_problem({"task_desc": json.dumps({"task_name": "boil", "var_num": 0})}, fmt)
        is None
    )
    with pytest.raises(ValueError, match="task 0 of taskset"):
        SciWorldWorkflow(task=Task(raw_task={"task_desc": "[]"}), model=scripted_model(lambda m: ""))


def test_reward_is_the_highest_running_sum_at_least_zero():
    # Trinity-RFT's: cumulative step rewards, the best point of the episode, never below 0.
    wf = SciWorldWorkflow(task=make_task("boil"), model=scripted_model(lambda m: ""))

    def episode(*rewards):
        return Episode(turns=[Turn(i, "", "", "", None, reward=r) for i, r in enumerate(rewards)])

    assert wf.episode_reward(episode(0.3, -0.1, 0.5, -1.0)) == pytest.approx(0.7)
    assert wf.episode_reward(episode(0.25, 0.75)) == pytest.approx(1.0)
    assert wf.episode_reward(episode(-0.08, 0.1)) == pytest.approx(0.02)
    assert wf.episode_reward(episode(-1.0)) == 0.0


def test_workflow_conforms_and_is_registered_without_importing_the_simulator():
    check_component("workflow", SciWorldWorkflow)
    assert SciWorldWorkflow.is_async and SciWorldWorkflow.can_reset and not SciWorldWorkflow.can_repeat
    assert get_component("workflow", "sciworld_workflow") is SciWorldWorkflow
    assert format_observation("You see a sink.") == "Observation: \nYou see a sink."
    assert "<action>" in SYSTEM_PROMPT and "focus on OBJ" in SYSTEM_PROMPT
    script = (
        "import sys\n"
        "from trinity.plugins import get_component\n"
        "get_component('workflow', 'sciworld_workflow')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scienceworld', 'py4j')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("[]")


def test_missing_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "scienceworld", None)  # import fails, installed or not
    with pytest.raises(ImportError) as info:
        SciWorldWorkflow(task=make_task("boil"), model=scripted_model(lambda m: "")).run()
    assert str(info.value) == missing_packages() and "\n" not in str(info.value)
    assert install_hint("trinity-plugins-agents", extra="sciworld") in str(info.value)
    with pytest.raises(ImportError, match="sciworld"):
        write_sciworld_data("/nonexistent")


def test_missing_java_or_jar_is_one_line(monkeypatch, tmp_path):
    pytest.importorskip("scienceworld", reason="the `sciworld` extra is not installed (it is optional)")
    with pytest.raises(FileNotFoundError, match=r"no\.jar' does not exist"):
        make_sciworld_env(str(tmp_path / "no.jar"))
    monkeypatch.setattr(sciworld.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="default-jre-headless"):
        make_sciworld_env()


# -- the real simulator ----------------------------------------------------------------------


@needs_simulator
@pytest.mark.parametrize(("task_name", "var_num"), [("lifespan-longest-lived", 0), ("find-plant", 2)])
def test_oracle_solves_the_task_with_trinity_rfts_reward(shared, task_name, var_num):
    gold, start_score = gold_and_start_score(shared, task_name, var_num)
    model, exp = play(replay(gold), make_task(task_name, var_num))
    assert exp.info["success"] is True and exp.info["score"] == 100 and exp.info["env_done"] == 1
    # As Trinity-RFT: the points the reset's "look around" scored are not counted.
    assert exp.reward == pytest.approx((100 - start_score) / 100)
    assert exp.info["golden_rounds"] == len(gold) and exp.info["task_name"] == task_name
    assert exp.info["env_rounds"] == exp.info["env_steps"] - 1 and exp.info["env_steps"] <= len(gold)
    assert exp.info["invalid_actions"] == exp.info["malformed_actions"] == 0
    first = model.engine.calls[0]["messages"]
    assert first[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert first[1]["content"].startswith(
        f"Observation: \nTask Description: {shared.get_task_description()}\n"
    )
    assert "This room is called" in first[1]["content"]


@needs_simulator
def test_random_player_scores_low(shared):
    # The oracle solves these (see above; 0.92-1.0); a player picking among the actions the
    # simulator lists as valid (some of whose long object names its parser then rejects) does not.
    tasks = [("lifespan-longest-lived", 1), ("find-plant", 0), ("use-thermometer", 0), ("power-component", 0)]
    rewards, successes = [], 0
    for i, (name, var) in enumerate(tasks):
        _, exp = play(random_player(shared, seed=i), make_task(name, var, max_env_steps=8))
        rewards.append(exp.reward)
        successes += exp.info["success"]
    print("random player's rewards:", rewards)
    assert successes == 0 and sum(rewards) / len(tasks) < 0.3, rewards


@needs_simulator
def test_failing_the_task_ends_the_episode_and_keeps_the_best_score(shared):
    # Focusing on the wrong thing fails a task: the simulator ends it with a negative score; the
    # reward is the progress made before, as Trinity-RFT counts it.
    gold, _ = gold_and_start_score(shared, "find-plant", 0)
    shared.load("find-plant", 0, "easy")
    shared.reset()
    progress = sum(shared.step(a)[1] for a in gold[:3])
    _, exp = play(replay([*gold[:3], "focus on air"]), make_task("find-plant", 0))
    assert exp.info["env_done"] == 1 and exp.info["terminate_reason"] == "done" and exp.info["env_steps"] == 4
    assert exp.info["score"] < 0 and exp.info["success"] is False
    assert exp.reward == pytest.approx(max(progress, 0) / 100) and progress > 0


@needs_simulator
def test_a_reply_without_an_action_is_sent_as_upstream_does_and_counted(shared, monkeypatch):
    sent = []
    real_step = shared.step
    monkeypatch.setattr(shared, "step", lambda action: sent.append(action) or real_step(action))
    replies = iter(
        ["I am not sure what to do.", "<action>dance with the thermometer</action>", "<action>look around"]
    )
    model, exp = play(lambda m: next(replies), make_task("use-thermometer", 0, max_env_steps=3))
    # As Trinity-RFT: "" goes to the simulator, which answers that it knows no such action; the
    # text of an unclosed <action> block is sent as it is.
    assert sent == ["look around", "", "dance with the thermometer", "look around"]  # reset() looks first
    prompts = [call["messages"][-1]["content"] for call in model.engine.calls]
    assert prompts[1] == prompts[2] == format_observation(UNKNOWN_ACTION) and len(prompts) == 3
    assert exp.info["malformed_actions"] == 1 and exp.info["invalid_actions"] == 2
    assert exp.info["env_done"] == 0 and exp.info["terminate_reason"] == "max_turns" and exp.reward == 0.0
    assert exp.info["step_rewards"] == [0.0, 0.0, 0.0]


@needs_simulator
def test_step_wise_gives_one_experience_per_model_call(shared):
    gold, _ = gold_and_start_score(shared, "lifespan-longest-lived", 0)
    exps = (
        make_task("lifespan-longest-lived", 0, step_wise=True).to_workflow(scripted_model(replay(gold))).run()
    )
    assert [e.eid.step for e in exps] == list(range(len(exps))) and len(exps) > 1
    assert {e.reward for e in exps} == {1.0} and exps[-1].info["success"] is True


@needs_simulator
def test_the_real_factory_starts_and_closes_a_vm(simulator):
    before = _java_children()
    _, exp = play(replay(["look around"]), make_task("find-animal", 0, max_env_steps=1))
    assert exp.info["env_steps"] == 1 and exp.info["golden_rounds"] > 0
    assert _java_children() <= before  # the episode's own VM is gone


@needs_simulator
def test_data_writer_reads_tasks_and_variations_from_the_simulator(simulator, tmp_path):
    counts = write_sciworld_data(tmp_path / "a", percentage=0.05, env=simulator)
    variations = {n: simulator.get_max_variations(n) for n in simulator.get_task_names()}
    rows = {
        s: [json.loads(x) for x in (tmp_path / "a" / f"{s}.jsonl").read_text().splitlines()] for s in counts
    }
    from scienceworld.constants import JAR_PATH

    tasks = {s: [json.loads(r["task_desc"]) for r in rs] for s, rs in rows.items()}
    assert all(set(r) == {"task_desc", "targe"} and r["targe"] == "" for rs in rows.values() for r in rs)
    assert {t["jar_path"] for ts in tasks.values() for t in ts} == {JAR_PATH}
    for split, names in (("train", set(TRAIN_TASK_NAMES)), ("test", set(variations) - set(TRAIN_TASK_NAMES))):
        expected = {(n, v) for n in names for v in range(int(variations[n] * 0.05))}
        assert {(t["task_name"], t["var_num"]) for t in tasks[split]} == expected
        assert counts[split] == len(expected) == len(tasks[split])
    info = json.loads((tmp_path / "a" / "dataset_dict.json").read_text())
    assert info["splits"]["train"]["num_examples"] == counts["train"]
    # Seeded: the same seed writes the same files; another seed shuffles otherwise.
    write_sciworld_data(tmp_path / "b", percentage=0.05, env=simulator)
    write_sciworld_data(tmp_path / "c", percentage=0.05, env=simulator, seed=1)
    train = [(tmp_path / d / "train.jsonl").read_text() for d in "abc"]
    assert train[0] == train[1] != train[2]


@needs_simulator
def test_tasks_cli_starts_its_own_simulator_and_stops_it(simulator, tmp_path, capsys):
    from trinity_agents.tasks import main

    before = _java_children()
    main(["sciworld", str(tmp_path / "data"), "--percentage", "0.02"])
    assert "train and" in capsys.readouterr().out and (tmp_path / "data" / "test.jsonl").is_file()
    assert _java_children() <= before


# -- Trinity-RFT's example config, unchanged -------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.chdir(tmp_path)  # its taskset path is relative: examples/grpo_sciworld/sciworld_data
    return tmp_path


@needs_simulator
def test_upstream_config_loads_unchanged_and_runs_the_written_rows(upstream_env, shared):
    write_sciworld_data(
        upstream_env / "examples" / "grpo_sciworld" / "sciworld_data", percentage=0.02, env=shared
    )
    config = load_config(UPSTREAM / "sciworld.yaml")
    assert config.algorithm.algorithm_type == "grpo" and config.algorithm.repeat_times == 8
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is SciWorldWorkflow
    assert taskset.format.prompt_key == "task_desc"
    reader = TasksetReader(taskset, config.buffer)
    assert sum(reader.skipped.values()) == 0
    tasks = reader.read_batch(len(reader))
    assert {t.workflow for t in tasks} == {SciWorldWorkflow} and {t.repeat_times for t in tasks} == {8}
    configs = [json.loads(t.task_desc) for t in tasks]
    assert {c["task_name"] for c in configs} <= set(TRAIN_TASK_NAMES)  # the train split
    # The config's turn limit is Trinity-RFT's 30: play the first task whose gold path fits in it.
    for candidate, config in zip(tasks, configs):
        gold, start_score = gold_and_start_score(shared, config["task_name"], config["var_num"])
        if len(gold) <= 30:
            task = candidate
            break
    _, exp = play(replay(gold), task)
    assert exp.info["success"] is True and exp.reward == pytest.approx((100 - start_score) / 100)
    assert exp.info["task_name"] == config["task_name"] and exp.info["var_num"] == config["var_num"]
