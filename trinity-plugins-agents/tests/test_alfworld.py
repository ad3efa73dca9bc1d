"""alfworld_workflow / step_wise_alfworld_workflow, played against a fake TextWorld game.

The real games need the `alfworld` extra and `alfworld-download` (network), so the tests swap
``AlfworldWorkflow.env_factory`` for :class:`FakeTextWorldEnv`: a small household (receptacles,
some closed, objects in them) with TextWorld's gym API, admissible commands, ``Nothing happens.``
for anything else, and ``won`` once the goal object is in the goal receptacle. A scripted oracle
wins every game; a seeded random player does not. Trinity-RFT's two ALFWorld example configs,
stored unchanged under upstream_configs/, load and run on it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trinity.buffer.taskset import TasksetReader
from trinity.config import FormatConfig, load_config
from trinity.plugins import get_component, install_hint
from trinity.testing import check_component
from trinity.trainer.batch import build_batch
from trinity.workflow import Task
from trinity_agents import alfworld
from trinity_agents.alfworld import (
    SYSTEM_PROMPT,
    AlfworldWorkflow,
    StepWiseAlfworldWorkflow,
    format_observation,
    make_alfworld_env,
    missing_packages,
    parse_action,
)
from trinity_agents.scripted import scripted_model

UPSTREAM = Path(__file__).parent / "upstream_configs"
END = "<|im_end|>"

# -- a fake TextWorld game -------------------------------------------------------------------

SPRAY = {
    "task": "put some spraybottle on toilet",
    "receptacles": {
        "cabinet 1": {"openable": True, "items": ["cloth 1", "spraybottle 2"]},
        "countertop 1": {"items": ["soapbar 1"]},
        "sinkbasin 1": {"items": []},
        "toilet 1": {"items": ["soapbottle 1"]},
    },
    "goal": ["spraybottle", "toilet 1"],
}
APPLE = {
    "task": "put an apple in drawer",
    "receptacles": {
        "countertop 1": {"items": ["apple 1", "knife 1"]},
        "drawer 1": {"openable": True, "items": []},
        "fridge 1": {"openable": True, "items": ["egg 1"]},
    },
    "goal": ["apple", "drawer"],
}


class FakeTextWorldEnv:
    """TextWorld's gym API over a JSON game file shaped like SPRAY / APPLE."""

    created: list[FakeTextWorldEnv] = []

    def __init__(self, game_file: str) -> None:
        self.game = json.loads(Path(game_file).read_text())
        self.commands: list[str] = []
        self.closed = False
        FakeTextWorldEnv.created.append(self)

    # state
    def _reset_state(self) -> None:
        self.at = None
        self.holding = None
        self.opened: set[str] = set()
        self.items = {r: list(spec["items"]) for r, spec in self.game["receptacles"].items()}

    def _openable(self, r: str) -> bool:
        return bool(self.game["receptacles"][r].get("openable"))

    def _won(self) -> bool:
        kind, target = self.game["goal"]
        return any(
            r.split()[0] == target.split()[0]
            and (r == target or " " not in target)
            and any(i.split()[0] == kind for i in items)
            for r, items in self.items.items()
        )

    def admissible(self) -> list[str]:
        out = ["inventory", "look"]
        out += [f"go to {r}" for r in self.items if r != self.at]
        if self.at is not None:
            r = self.at
            out.append(f"examine {r}")
            if self._openable(r):
                out.append(f"close {r}" if r in self.opened else f"open {r}")
            if not self._openable(r) or r in self.opened:
                if self.holding is None:
                    out += [f"take {i} from {r}" for i in self.items[r]]
                else:
                    out.append(f"move {self.holding} to {r}")
        return sorted(out)

    def _infos(self) -> dict:
        inventory = (
            f"You are carrying: a {self.holding}." if self.holding else "You are not carrying anything."
        )
        return {
            "admissible_commands": self.admissible(),
            "inventory": inventory,
            "description": "You are in the middle of a room.",
            "won": self._won(),
        }

    def _contents(self, r: str) -> str:
        things = ", ".join(f"a {i}" for i in self.items[r]) or "nothing"
        return things

    # gym API
    def reset(self):
        self._reset_state()
        seen = ", a ".join(self.items)
        text = (
            "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
            f"around you, you see a {seen}.\n\nYour task is to: {self.game['task']}."
        )
        return text, self._infos()

    def step(self, command: str):
        self.commands.append(command)
        if command not in self.admissible():
            text = "Nothing happens."
        elif command.startswith("go to "):
            self.at = r = command[len("go to ") :]
            if self._openable(r) and r not in self.opened:
                text = f"You arrive at {r}. The {r} is closed."
            else:
                text = f"You arrive at {r}. On the {r}, you see {self._contents(r)}."
        elif command.startswith("open "):
            self.opened.add(self.at)
            text = f"You open the {self.at}. The {self.at} is open. In it, you see {self._contents(self.at)}."
        elif command.startswith("close "):
            self.opened.discard(self.at)
            text = f"You close the {self.at}."
        elif command.startswith("take "):
            item = command[len("take ") :].split(" from ")[0]
            self.items[self.at].remove(item)
            self.holding = item
            text = f"You pick up the {item} from the {self.at}."
        elif command.startswith("move "):
            self.items[self.at].append(self.holding)
            text = f"You move the {self.holding} to the {self.at}."
            self.holding = None
        elif command == "inventory":
            text = self._infos()["inventory"]
        else:
            text = "You are in the middle of a room."
        won = self._won()
        return text, 1 if won else 0, won, self._infos()

    def close(self) -> None:
        self.closed = True


def oracle_plan(game: dict) -> list[str]:
    """The shortest winning command sequence of a fake game."""
    kind, target = game["goal"]
    source = next(r for r, s in game["receptacles"].items() for i in s["items"] if i.split()[0] == kind)
    item = next(i for i in game["receptacles"][source]["items"] if i.split()[0] == kind)
    dest = next(r for r in game["receptacles"] if r == target or r.split()[0] == target)
    plan = [f"go to {source}"]
    plan += [f"open {source}"] if game["receptacles"][source].get("openable") else []
    plan += [f"take {item} from {source}", f"go to {dest}"]
    plan += [f"open {dest}"] if game["receptacles"][dest].get("openable") else []
    return [*plan, f"move {item} to {dest}"]


def oracle(game: dict):
    plan = oracle_plan(game)

    def policy(messages):
        step = sum(m["role"] == "assistant" for m in messages)
        return f"<think>Step {step} of my plan.</think><action>{plan[step]}</action>"

    return policy


def random_player(seed: int):
    """Seeded: commands from a fixed vocabulary (some never valid), sometimes badly formatted."""
    rng = random.Random(seed)
    vocabulary = [
        "look", "inventory", "go to cabinet 1", "go to countertop 1", "go to toilet 1",
        "go to drawer 1", "open cabinet 1", "open drawer 1", "close cabinet 1",
        "take soapbar 1 from countertop 1", "take apple 1 from countertop 1", "examine toilet 1",
        "go to the moon", "sing",
    ]  # fmt: skip

    def policy(messages):
        command = rng.choice(vocabulary)
        if rng.random() < 0.2:
            return f"I will {command}."  # no <action> block
        return f"<think>Maybe this.</think><action>{command}</action>"

    return policy


@pytest.fixture(autouse=True)
def fake_env(monkeypatch):
    FakeTextWorldEnv.created = []
    monkeypatch.setattr(AlfworldWorkflow, "env_factory", staticmethod(FakeTextWorldEnv))
    return FakeTextWorldEnv


@pytest.fixture
def games(tmp_path):
    out = {}
    for name, game in (("spray", SPRAY), ("apple", APPLE)):
        path = tmp_path / "json_2.1.1" / "train" / name / "trial_0" / "game.tw-pddl"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(game))
        out[name] = str(path)
    return out


def make_task(game_file, workflow=AlfworldWorkflow, prompt_key="game_file", **workflow_args):
    return Task(
        workflow=workflow,
        raw_task={"game_file": game_file, "target": ""},
        format_args=FormatConfig(prompt_key=prompt_key),
        workflow_args=workflow_args,
    )


def play(policy, game_file, workflow=AlfworldWorkflow, run=0, **workflow_args):
    model = scripted_model(policy)
    wf = workflow(task=make_task(game_file, workflow, **workflow_args), model=model)
    wf.set_repeat_times(1, run)
    return model, wf.run()


# -- protocol --------------------------------------------------------------------------------


def test_parse_action_reads_the_first_action_block():
    assert parse_action("<think>hm</think><action>go to cabinet 1</action>") == "go to cabinet 1"
    assert parse_action("<action> open drawer 1 \n</action> and <action>look</action>") == "open drawer 1"
    assert parse_action("<think>x</think><action>take apple 1 from countertop 1") == (
        "take apple 1 from countertop 1"  # unclosed: up to the end, as Trinity-RFT
    )
    assert parse_action("go to cabinet 1") == ""
    assert parse_action("") == "" and parse_action(None) == ""


def test_observation_message():
    assert format_observation("You arrive at sinkbasin 1.") == "Observation: You arrive at sinkbasin 1."
    nothing = format_observation("Nothing happens.")
    assert nothing.startswith("Observation: Nothing happens. ") and "<action>" in nothing
    listed = format_observation("Hi.", ["go to desk 1", "look"])
    assert listed == "Observation: Hi.\nAdmissible commands: go to desk 1, look"
    assert "<think>" in SYSTEM_PROMPT and "<action>" in SYSTEM_PROMPT
    for command in ("go to (receptacle)", "take (object) from (receptacle)", "move (object) to (receptacle)"):
        assert command in SYSTEM_PROMPT


def test_fake_game_oracle_and_plans_are_sound(games):
    # The fake environment itself: the plan is admissible step by step and wins only at the end.
    for name in games:
        env = FakeTextWorldEnv(games[name])
        _, infos = env.reset()
        plan = oracle_plan(json.loads(Path(games[name]).read_text()))
        for i, command in enumerate(plan):
            assert command in infos["admissible_commands"], (name, command)
            _, score, done, infos = env.step(command)
            assert done == (i == len(plan) - 1) and score == int(done) and infos["won"] == done


# -- episodes --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["spray", "apple"])
def test_oracle_wins_one_concatenated_experience(games, name):
    model, [exp] = play(oracle(json.loads(Path(games[name]).read_text())), games[name])
    plan = oracle_plan(json.loads(Path(games[name]).read_text()))
    [env] = FakeTextWorldEnv.created
    assert env.commands == plan and env.closed
    assert exp.reward == 1.0 and exp.eid.step == 0
    assert exp.info["won"] is True and exp.info["env_done"] == 1 and exp.info["terminate_reason"] == "done"
    assert exp.info["env_steps"] == len(plan) and exp.info["invalid_actions"] == 0
    assert exp.info["step_rewards"] == [0.0] * (len(plan) - 1) + [1.0]
    assert exp.info["game_file"] == games[name] and exp.metrics["won"] == 1.0
    # action_mask: exactly the model's replies (each closed by its end-of-turn token)
    tokenizer = model.tokenizer
    response = exp.tokens[exp.prompt_length :]
    mask = exp.action_mask.bool()
    replies = [f"<think>Step {i} of my plan.</think><action>{c}</action>" for i, c in enumerate(plan)]
    assert tokenizer.decode(response[mask].tolist()) == "".join(r + END for r in replies)
    unmasked = tokenizer.decode(response[~mask].tolist())
    assert unmasked.count("<|im_start|>user\nObservation: ") == len(plan) - 1
    assert "<action>" not in unmasked
    prompt = tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
    assert prompt.startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
    assert "Observation: -= Welcome to TextWorld, ALFRED! =-" in prompt and "Your task is to:" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_random_player_does_not_win(games):
    rewards = []
    for seed in range(6):
        for name in games:
            _, [exp] = play(random_player(seed), games[name], max_env_steps=8)
            rewards.append(exp.reward)
            assert exp.info["terminate_reason"] == "max_turns" and exp.info["env_steps"] == 8
            assert exp.info["env_done"] == 0 and exp.info["won"] is False
            assert exp.info["step_rewards"] == [0.0] * 7 + [-0.1]  # unfinished: -0.1
    assert rewards == [-0.1] * 12
    # its invalid commands are counted and answered with the reminder
    model, [exp] = play(random_player(0), games["spray"], max_env_steps=8)
    assert exp.info["invalid_actions"] > 0
    shown = [m["content"] for call in model.engine.calls for m in call["messages"] if m["role"] == "user"]
    assert any(s.startswith("Observation: Nothing happens. That action had no effect") for s in shown)
    assert all(env.closed for env in FakeTextWorldEnv.created)


def test_step_wise_one_experience_per_model_call(games):
    game = json.loads(Path(games["spray"]).read_text())
    plan = oracle_plan(game)
    model, exps = play(oracle(game), games["spray"], StepWiseAlfworldWorkflow, run=3)
    assert len(exps) == len(plan) == len(model.engine.calls)
    assert [e.eid.step for e in exps] == list(range(len(plan)))
    assert {e.eid.run for e in exps} == {3}
    assert [e.reward for e in exps] == [1.0] * len(plan)  # the episode reward on every step
    assert [e.info["step_reward"] for e in exps] == [0.0] * (len(plan) - 1) + [1.0]
    assert [e.info["action"] for e in exps] == plan and all(e.info["action_valid"] for e in exps)
    assert len({e.info["env_state_hash"] for e in exps}) == len(plan)
    assert exps[-1].info["terminate_reason"] == "done" and "terminate_reason" not in exps[0].info
    for exp in exps:
        assert (
            bool(exp.action_mask.all())
            and exp.action_mask.shape[0] == exp.tokens.shape[0] - exp.prompt_length
        )
    # The same class is either shape: step_wise switches it, for both names.
    _, [one] = play(oracle(game), games["spray"], StepWiseAlfworldWorkflow, step_wise=False)
    _, many = play(oracle(game), games["spray"], AlfworldWorkflow, step_wise=True)
    assert one.reward == 1.0 and len(many) == len(plan)


def test_history_recorded_for_upstreams_enable_history_is_emptied(games):
    # Trinity-RFT's step-wise config sets enable_history; the calls must not pile up there.
    game = json.loads(Path(games["spray"]).read_text())
    model = scripted_model(oracle(game), wrapper_kwargs={"enable_history": True})
    for run in range(2):
        wf = StepWiseAlfworldWorkflow(task=make_task(games["spray"]), model=model)
        wf.set_repeat_times(1, run)
        assert len(wf.run()) == 5
        assert model.extract_experience_from_history() == []
    model.chat([{"role": "user", "content": "hi"}])
    assert len(model.extract_experience_from_history()) == 1  # it is recording


def test_state_hash_tells_apart_states_with_the_same_text(games):
    # "Nothing happens." in two different places is two states (GiGPO's anchors).
    _, exps = play(
        lambda m: ["<action>sing</action>", "<action>go to toilet 1</action>", "<action>sing</action>"][
            sum(x["role"] == "assistant" for x in m)
        ],
        games["spray"],
        StepWiseAlfworldWorkflow,
        max_env_steps=3,
    )
    assert [e.info["action_valid"] for e in exps] == [False, True, False]
    assert exps[0].info["env_state_hash"] != exps[2].info["env_state_hash"]
    assert [e.reward for e in exps] == [-0.1] * 3


def test_multi_step_grpo_broadcasts_the_episode_advantage_to_every_step(games):
    game = json.loads(Path(games["spray"]).read_text())
    episodes = []
    for run, policy in enumerate([oracle(game), random_player(1), oracle(game), random_player(2)]):
        _, exps = play(policy, games["spray"], StepWiseAlfworldWorkflow, run=run, max_env_steps=6)
        episodes.append(exps)
    assert [len(e) for e in episodes] == [5, 6, 5, 6]
    rows = [exp for episode in episodes for exp in episode]
    algorithm = get_component("algorithm_type", "multi_step_grpo")
    advantage_fn = get_component("advantage_fn", algorithm.default_config()["advantage_fn"])()
    batch, _ = advantage_fn(build_batch(rows).to_dict())
    advantages = batch["advantages"]
    mask = batch["action_mask"].bool()
    per_row = []
    for i in range(len(rows)):
        values = advantages[i][mask[i]]
        assert torch.allclose(values, values[0].expand_as(values))  # one value per step
        per_row.append(float(values[0]))
    offsets = [0, 5, 11, 16, 22]
    per_episode = [per_row[a:b] for a, b in itertools.pairwise(offsets)]
    for values in per_episode:
        assert max(values) - min(values) < 1e-6  # broadcast over the episode's steps
    won, lost = per_episode[0][0], per_episode[1][0]
    assert won > 0 > lost and abs(won + lost) < 1e-5
    assert per_episode[2][0] == pytest.approx(won) and per_episode[3][0] == pytest.approx(lost)


def test_turn_limit_aliases_and_admissible_commands(games):
    game = json.loads(Path(games["spray"]).read_text())
    model, [exp] = play(oracle(game), games["spray"], max_turns=2, show_admissible_commands=True)
    assert exp.info["env_steps"] == 2 and exp.reward == -0.1
    first = model.engine.calls[0]["messages"][-1]["content"]
    assert "\nAdmissible commands: go to cabinet 1, go to countertop 1," in first
    model, _ = play(oracle(game), games["spray"], max_env_steps=1)
    assert len(model.engine.calls) == 1
    model, _ = play(oracle(game), games["spray"])
    assert "Admissible commands" not in model.engine.calls[0]["messages"][-1]["content"]


def test_rows_and_game_files(games, tmp_path):
    fmt = FormatConfig(prompt_key="game_file")
    assert AlfworldWorkflow.row_problem({"game_file": games["spray"], "target": ""}, fmt) is None
    # the prompt_key column first, else game_file
    assert AlfworldWorkflow.row_problem({"game_file": games["spray"]}, FormatConfig()) is None
    assert "no game file" in AlfworldWorkflow.row_problem({"target": ""}, fmt)
    assert "no game file" in AlfworldWorkflow.row_problem({"game_file": 3}, fmt)
    missing = str(tmp_path / "nowhere" / "game.tw-pddl")
    assert "does not exist" in AlfworldWorkflow.row_problem({"game_file": missing}, fmt)
    with pytest.raises(ValueError, match="no game file under 'game_file'"):
        AlfworldWorkflow(task=make_task(None), model=scripted_model(lambda m: ""))
    # the instance is reused across tasks (can_reset)
    game = json.loads(Path(games["apple"]).read_text())
    wf = AlfworldWorkflow(task=make_task(games["spray"]), model=scripted_model(oracle(game)))
    wf.reset(make_task(games["apple"]))
    [exp] = wf.run()
    assert exp.reward == 1.0 and exp.info["game_file"] == games["apple"]


def test_workflow_classes_conform():
    for cls in (AlfworldWorkflow, StepWiseAlfworldWorkflow):
        check_component("workflow", cls)
        assert cls.is_async and cls.can_reset and not cls.can_repeat
    assert not AlfworldWorkflow.default_step_wise and StepWiseAlfworldWorkflow.default_step_wise


# -- without the extra -----------------------------------------------------------------------


def test_missing_packages_fail_with_one_line_naming_the_extra(games, monkeypatch):
    monkeypatch.setattr(AlfworldWorkflow, "env_factory", staticmethod(make_alfworld_env))
    for name in ("textworld", "textworld.gym", "textworld.gym.envs", "alfworld"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, installed or not
    with pytest.raises(ImportError) as info:
        AlfworldWorkflow(task=make_task(games["spray"]), model=scripted_model(lambda m: "")).run()
    message = str(info.value)
    assert message == missing_packages() and "\n" not in message
    assert install_hint("trinity-plugins-agents", extra="alfworld") in message
    assert "trinity-plugins-agents[alfworld]'" in message and "alfworld-download" in message


def test_real_factory_builds_textworlds_gym_env(monkeypatch, games, tmp_path):
    # Stand-ins for textworld / alfworld record how the factory calls their API.
    import types

    calls = {}
    textworld = types.ModuleType("textworld")
    textworld.EnvInfos = lambda **kw: ("EnvInfos", kw)
    envs = types.ModuleType("textworld.gym.envs")
    envs.TextworldGymEnv = lambda *a, **kw: calls.setdefault("env", (a, kw))
    tw_env = types.ModuleType("alfworld.agents.environment.alfred_tw_env")
    tw_env.AlfredDemangler = demangler = type("AlfredDemangler", (), {})
    modules = {
        "textworld": textworld,
        "textworld.gym": types.ModuleType("textworld.gym"),
        "textworld.gym.envs": envs,
        "alfworld": types.ModuleType("alfworld"),
        "alfworld.agents": types.ModuleType("alfworld.agents"),
        "alfworld.agents.environment": types.ModuleType("alfworld.agents.environment"),
        "alfworld.agents.environment.alfred_tw_env": tw_env,
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    make_alfworld_env(games["spray"])
    args, kwargs = calls["env"]
    assert args[0] == [games["spray"]] and kwargs["wrappers"] == [demangler]
    assert kwargs["max_episode_steps"] is None
    assert args[1] == (
        "EnvInfos",
        {"description": True, "inventory": True, "admissible_commands": True, "won": True},
    )
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        make_alfworld_env(str(tmp_path / "missing" / "game.tw-pddl"))


def test_registered_and_dry_run_without_the_extra(tmp_path):
    assert get_component("workflow", "alfworld_workflow") is AlfworldWorkflow
    assert get_component("workflow", "step_wise_alfworld_workflow") is StepWiseAlfworldWorkflow
    # In a fresh process: registration and `trinity run --dry-run` of Trinity-RFT's config import
    # neither alfworld nor textworld (here they are not even installed).
    script = (
        "import sys\n"
        "from trinity.cli import cli\n"
        "from trinity.plugins import get_component\n"
        "get_component('workflow', 'step_wise_alfworld_workflow')\n"
        "try:\n"
        f"    cli(['run', '--config', {str(UPSTREAM / 'grpo_alfworld_general_multi_step.yaml')!r}, '--dry-run'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('alfworld', 'textworld', 'spacy'))\n"
        "print('HEAVY', heavy)\n"
    )
    # The dry run checks the model folder and the taskset (a path relative to where it starts).
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "examples" / "grpo_alfworld" / "alfworld_data").mkdir(parents=True)
    env = {**os.environ, "TRINITY_MODEL_PATH": str(tmp_path / "m"), "TRINITY_CHECKPOINT_ROOT_DIR": "/tmp/c"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "default_workflow_type: step_wise_alfworld_workflow" in out.stdout
    assert out.stdout.strip().endswith("HEAVY []")
    assert alfworld.__name__ == "trinity_agents.alfworld"


# -- Trinity-RFT's example configs, unchanged ------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path, games):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    # Their taskset path is the relative literal examples/grpo_alfworld/alfworld_data, rows as
    # get_alfworld_data.py writes them (absolute game_file paths, an empty target).
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "examples" / "grpo_alfworld" / "alfworld_data"
    data.mkdir(parents=True)
    rows = [games["spray"], games["apple"], str(tmp_path / "not-downloaded" / "game.tw-pddl")]
    (data / "train.jsonl").write_text(
        "".join(json.dumps({"game_file": g, "target": ""}) + "\n" for g in rows)
    )
    return games


@pytest.mark.parametrize(
    ("name", "workflow", "algorithm", "step_wise"),
    [
        ("grpo_alfworld.yaml", AlfworldWorkflow, "grpo", False),
        ("grpo_alfworld_general_multi_step.yaml", StepWiseAlfworldWorkflow, "multi_step_grpo", True),
    ],
)
def test_upstream_configs_load_and_run(upstream_env, name, workflow, algorithm, step_wise):
    config = load_config(UPSTREAM / name)
    assert config.algorithm.algorithm_type == algorithm
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is workflow
    assert taskset.format.prompt_key == "game_file"
    reader = TasksetReader(taskset, config.buffer)
    assert len(reader) == 2 and sum(reader.skipped.values()) == 1  # the missing game file
    assert "does not exist" in " | ".join(reader.skipped)
    tasks = reader.read_batch(2)
    assert [t.task_desc for t in tasks] == [upstream_env["spray"], upstream_env["apple"]]
    for task in tasks:
        assert task.workflow is workflow and task.repeat_times == config.algorithm.repeat_times
        game = json.loads(Path(task.task_desc).read_text())
        exps = task.to_workflow(scripted_model(oracle(game))).run()
        assert len(exps) == (len(oracle_plan(game)) if step_wise else 1)
        assert {e.reward for e in exps} == {1.0}
    if step_wise:
        assert taskset.workflow_args["max_env_steps"] == 30
        assert workflow(task=tasks[0], model=scripted_model(lambda m: "")).max_turns == 30


# -- the real packages, when the extra is installed ------------------------------------------

TINY_PROBLEM = """(define (problem tiny_spray)
    (:domain alfred)
    (:objects
        agent1 - agent
        loc_bar_start loc_bar_cab loc_bar_toilet - location
        Cabinet_bar_01 Toilet_bar_01 - receptacle
        SprayBottle_bar_01 Cloth_bar_01 - object
        CabinetType ToiletType - rtype
        SprayBottleType ClothType - otype
    )
    (:init
        (atLocation agent1 loc_bar_start)
        (receptacleAtLocation Cabinet_bar_01 loc_bar_cab)
        (receptacleAtLocation Toilet_bar_01 loc_bar_toilet)
        (receptacleType Cabinet_bar_01 CabinetType)
        (receptacleType Toilet_bar_01 ToiletType)
        (objectType SprayBottle_bar_01 SprayBottleType)
        (objectType Cloth_bar_01 ClothType)
        (openable Cabinet_bar_01)
        (inReceptacle SprayBottle_bar_01 Cabinet_bar_01)
        (inReceptacle Cloth_bar_01 Cabinet_bar_01)
        (objectAtLocation SprayBottle_bar_01 loc_bar_cab)
        (objectAtLocation Cloth_bar_01 loc_bar_cab)
        (pickupable SprayBottle_bar_01)
        (pickupable Cloth_bar_01)
        (canContain ToiletType SprayBottleType)
        (canContain CabinetType SprayBottleType)
        (canContain CabinetType ClothType)
    )
    (:goal (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r)
        (objectType ?o SprayBottleType) (receptacleType ?r ToiletType)))))
)"""


def test_a_hand_made_game_on_the_real_packages(monkeypatch, tmp_path):
    pytest.importorskip("alfworld", reason="the `alfworld` extra is not installed (it is optional)")
    pytest.importorskip("textworld", reason="the `alfworld` extra is not installed (it is optional)")
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    game = {  # a game.tw-pddl as alfworld-generate writes it, with ALFWorld's domain and grammar
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": Path(ALFRED_TWL2_PATH)
        .read_text()
        .replace("UNKNOWN GOAL", "put some spraybottle on toilet"),
        "pddl_problem": TINY_PROBLEM,
        "solvable": True,
    }
    path = tmp_path / "game.tw-pddl"
    path.write_text(json.dumps(game))
    monkeypatch.setattr(AlfworldWorkflow, "env_factory", staticmethod(make_alfworld_env))
    plan = [c.replace("spraybottle 2", "spraybottle 1") for c in oracle_plan(SPRAY)]  # demangled ids
    policy = lambda m: f"<action>{plan[sum(x['role'] == 'assistant' for x in m)]}</action>"  # noqa: E731
    model, [exp] = play(policy, str(path))
    first = model.engine.calls[0]["messages"][-1]["content"]
    assert first.startswith("Observation: -= Welcome to TextWorld, ALFRED! =-") and "cabinet 1" in first
    assert exp.reward == 1.0 and exp.info["won"] is True and exp.info["env_steps"] == len(plan)
    _, [exp] = play(lambda m: "<action>sing</action>", str(path), max_env_steps=2)
    assert exp.reward == -0.1 and exp.info["invalid_actions"] == 2
