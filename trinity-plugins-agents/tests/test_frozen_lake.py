"""frozen_lake_workflow: maps drawn by seed, the text protocol, and whole episodes with scripted
policies (an oracle that always reaches the goal, a random walker that mostly does not)."""

from __future__ import annotations

import statistics

import pytest

from trinity.testing import check_component
from trinity.workflow import Task
from trinity_agents.agents import frozen_lake_oracle, frozen_lake_random
from trinity_agents.frozen_lake import (
    SYSTEM_PROMPT,
    FrozenLakeWorkflow,
    check_map,
    compact_grid,
    format_observation,
    generate_random_map,
    oracle_action,
    parse_action,
    parse_grid,
    render,
    shortest_path_length,
)
from trinity_agents.scripted import scripted_model
from trinity_agents.tasks import frozen_lake_rows


def make_task(row=None, **workflow_args):
    row = {"seed": 1, "size": 4, "p": 0.8} if row is None else row
    return Task(workflow=FrozenLakeWorkflow, raw_task=row, workflow_args=workflow_args)


def play(policy, row=None, **workflow_args):
    model = scripted_model(policy)
    return model, FrozenLakeWorkflow(task=make_task(row, **workflow_args), model=model).run()


# -- maps ------------------------------------------------------------------------------------


def test_maps_are_drawn_by_seed():
    # Pinned: gymnasium's seeded generator (PCG64) draws the same map for the same row anywhere.
    assert generate_random_map(4, 0.8, seed=0, max_steps=8) == (["FFGS", "HHFF", "FHHF", "HFFF"], (0, 2))
    assert generate_random_map(4, 0.8, seed=42, max_steps=8) == (["FFSF", "FHFF", "FFFH", "GHFF"], (3, 0))
    assert generate_random_map(3, 0.9, seed=7, max_steps=1) == (["FFF", "SFH", "GFH"], (2, 0))
    assert generate_random_map(5, 0.7, 3, 8) == generate_random_map(5, 0.7, 3, 8)
    maps = {tuple(generate_random_map(5, 0.7, seed, 8)[0]) for seed in range(20)}
    assert len(maps) == 20


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6])
def test_every_map_is_solvable_within_max_steps(size):
    for seed in range(30):
        for max_steps in (1, 3, 8):
            rows, goal = generate_random_map(size, 0.6, seed, max_steps)
            assert len(rows) == size and all(len(r) == size for r in rows)
            flat = "".join(rows)
            assert flat.count("S") == 1 and flat.count("G") == 1 and set(flat) <= set("SFHG")
            assert rows[goal[0]][goal[1]] == "G"
            assert 1 <= shortest_path_length(rows) <= max_steps


def test_shortest_path_goes_around_holes():
    assert shortest_path_length(["SHG", "FFF"]) == 4
    assert shortest_path_length(["SHG", "HFF"]) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 1}, "size must be at least 2"),
        ({"p": 0}, "p .* must be in"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_bad_map_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_random_map(**{"size": 4, "p": 0.8, "seed": 0, "max_steps": 5, **kwargs})


def test_fixed_maps_are_checked():
    assert check_map(("SF", "HG")) == ["SF", "HG"]
    for bad in (["SF", "FF"], ["SG", "G"], ["SX", "FG"], "SFFG", []):
        with pytest.raises(ValueError, match=r"workflow_args\.desc"):
            check_map(bad)


# -- the text protocol -----------------------------------------------------------------------


def test_render_and_parse_the_grid():
    desc = ["SFH", "FFG"]
    grid = render(desc, (0, 0))
    assert grid == " P \t _ \t O \t\n _ \t _ \t G \t"
    assert parse_grid(grid) == [["P", "_", "O"], ["_", "_", "G"]]
    assert render(desc, (0, 2)).split("\n")[0] == " _ \t _ \t X \t"  # in the hole
    assert render(desc, (1, 2)).split("\n")[1] == " _ \t _ \t √ \t"  # on the goal
    message = format_observation(grid, 0, 10, False)
    assert parse_grid(message) == parse_grid(grid)  # the grid is found inside a message


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("```Up```", "Up"),
        ("I go down. ```down```", "Down"),
        ("``` LEFT ```", "Left"),
        ("```\nRight\n```", "Right"),
        ("First ```Up```, no: ```Left```", "Left"),  # the last block counts
        ("```1```", "Left"),
        ("```2```", "Down"),
        ("```3```", "Right"),
        ("```4```", "Up"),
        ("```5```", None),
        ("```jump```", None),
        ("```Up Down```", None),
        ("Up", None),
        ("``````", None),
        ("", None),
    ],
)
def test_parse_action(reply, action):
    assert parse_action(reply) == action


def test_observation_messages():
    grid = render(["SF", "FG"], (0, 0))
    first = format_observation(grid, 0, 10, False)
    assert first.startswith("Current Observation (0): \n" + grid + "\n")
    assert first.endswith("The maximum number of steps remaining is 10.")
    assert "invalid" not in first
    again = format_observation(grid, 3, 7, True)
    assert again.startswith("Current Observation (3):") and "Your last response was invalid" in again
    assert "```Up```" in SYSTEM_PROMPT and "Up | Down | Left | Right" in SYSTEM_PROMPT


def test_oracle_action_is_a_shortest_safe_first_move():
    assert oracle_action(render(["SHG", "FFF"], (0, 0))) == "Down"
    assert oracle_action(render(["SFG"], (0, 0))) == "Right"
    assert oracle_action(render(["SHG", "HFF"], (0, 0))) is None


# -- episodes --------------------------------------------------------------------------------


def test_workflow_conforms_and_reads_upstream_args():
    check_component("workflow", FrozenLakeWorkflow)
    workflow = FrozenLakeWorkflow(
        task=make_task(
            {"seed": "7", "size": 3.0, "p": "0.9"}, env_max_steps=1, agent_max_steps=4, is_slippery=True
        ),
        model=scripted_model(frozen_lake_oracle),
    )
    assert (workflow.seed, workflow.size, workflow.p) == (7, 3, 0.9)
    assert workflow.desc == ["FFF", "SFH", "GFH"] and workflow.max_turns == 4 and workflow.is_slippery
    assert not workflow.step_wise


def test_the_oracle_always_reaches_the_goal():
    rows = frozen_lake_rows(20, seed=3)
    rewards = []
    for row in rows:
        _model, [exp] = play(frozen_lake_oracle, row)
        rewards.append(exp.reward)
        assert exp.info["success"] and exp.info["terminate_reason"] == "done"
        assert exp.info["env_steps"] == shortest_path_length(
            generate_random_map(row["size"], row["p"], row["seed"], 8)[0]
        )
        assert exp.info["invalid_actions"] == 0 and exp.info["test_score"] == 1.0
    assert rewards == [1.0] * 20


def test_a_random_walker_mostly_fails():
    rewards = []
    for i, row in enumerate(frozen_lake_rows(20, seed=3)):
        _, [exp] = play(frozen_lake_random(i), row)
        rewards.append(exp.reward)
        assert exp.reward in (0.0, 1.0)
        assert exp.info["success"] == (exp.reward == 1.0)
    assert statistics.fmean(rewards) < 0.5 and 0.0 in rewards


def test_falling_into_a_hole_ends_the_episode_with_zero():
    _model, [exp] = play(lambda m: "```Right```", desc=["SH", "FG"])
    assert exp.reward == 0.0 and exp.info["env_done"] == 1 and not exp.info["success"]
    assert exp.info["env_steps"] == 1 and exp.info["terminate_reason"] == "done"


def test_invalid_replies_keep_the_player_and_are_reported():
    replies = iter(["no idea", "```Down```", "```Right```"])
    model, [exp] = play(lambda m: next(replies), desc=["SH", "FG"])
    assert exp.reward == 1.0 and exp.info["env_steps"] == 3 and exp.info["invalid_actions"] == 1
    users = [m["content"] for m in model.engine.calls[-1]["messages"] if m["role"] == "user"]
    assert [u.split(":")[0] for u in users] == [
        "Current Observation (0)",
        "Current Observation (1)",
        "Current Observation (2)",
    ]
    assert "invalid" not in users[0] and "Your last response was invalid" in users[1]
    assert "Your last response was invalid" not in users[2]  # the move worked
    assert [u.rsplit(" ", 1)[1] for u in users] == ["10.", "9.", "8."]


def test_agent_max_steps_bounds_the_turns():
    _model, [exp] = play(lambda m: "```Up```", desc=["FG", "SF"], agent_max_steps=3)  # Up: G is not above S
    assert exp.info["env_steps"] == 3 and exp.info["terminate_reason"] == "max_turns" and exp.reward == 0.0


def test_compact_protocol_shows_the_bare_grid_without_a_system_prompt():
    replies = iter(["no idea", "```Down```", "```Right```"])
    model, [exp] = play(lambda m: next(replies), desc=["SH", "FG"], compact=True)
    assert exp.reward == 1.0 and exp.info["env_steps"] == 3 and exp.info["invalid_actions"] == 1
    messages = model.engine.calls[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["PO\n_G", "PO\n_G", "_O\nPG"]
    assert compact_grid(render(["SH", "FG"], (1, 0))) == "_O\nPG"
    # format.system_prompt still sets one; the oracle plays the compact grid as well
    task = make_task({"seed": 11, "size": 5, "p": 0.8}, compact="true")
    task.format_args.system_prompt = "Walk to G."
    model = scripted_model(lambda m: f"```{oracle_action(render_padded(m[-1]['content']))}```")
    [exp] = FrozenLakeWorkflow(task=task, model=model).run()
    assert exp.reward == 1.0 and model.engine.calls[0]["messages"][0] == {
        "role": "system",
        "content": "Walk to G.",
    }
    with pytest.raises(ValueError, match="compact must be true or false"):
        FrozenLakeWorkflow(task=make_task(compact="maybe"), model=model)


def render_padded(compact: str) -> str:
    """A compact grid in the padded form ``oracle_action`` reads."""
    return "\n".join("".join(f" {c} \t" for c in line) for line in compact.split("\n"))


def test_step_wise_episode_for_gigpo():
    row = {"seed": 11, "size": 5, "p": 0.8}
    _model, exps = play(frozen_lake_oracle, row, step_wise=True)
    n = exps[-1].info["env_steps"]
    assert n >= 2 and [e.eid.step for e in exps] == list(range(n))
    assert [e.reward for e in exps] == [1.0] * n
    assert [e.info["step_reward"] for e in exps] == [0.0] * (n - 1) + [1.0]
    for exp in exps:
        assert exp.action_mask.shape == (exp.tokens.shape[0] - exp.prompt_length,) and exp.action_mask.all()
    # the state hash is the grid: another episode of the same task shares its first state
    _, other = play(frozen_lake_random(0), row, step_wise=True)
    assert other[0].info["env_state_hash"] == exps[0].info["env_state_hash"]
    assert len({e.info["env_state_hash"] for e in exps}) == n


def test_slippery_ice_is_reproducible_per_run():
    row = {"seed": 5, "size": 5, "p": 0.9}
    outcomes = []
    for _ in range(2):
        _, [exp] = play(frozen_lake_oracle, row, is_slippery=True, agent_max_steps=6)
        outcomes.append((exp.reward, exp.info["env_steps"], exp.info["step_rewards"]))
    assert outcomes[0] == outcomes[1]


def test_concatenated_episode_masks_only_the_replies():
    model, [exp] = play(frozen_lake_oracle, {"seed": 11, "size": 5, "p": 0.8})
    tokenizer = model.tokenizer
    response = exp.tokens[exp.prompt_length :]
    masked = tokenizer.decode(response[exp.action_mask].tolist())
    assert (
        masked.count("<|im_end|>") == exp.info["env_steps"]
        and masked.count("```") == 2 * exp.info["env_steps"]
    )
    assert "Current Observation" not in masked
    assert (
        tokenizer.decode(response[~exp.action_mask].tolist()).count("Current Observation")
        == exp.info["env_steps"] - 1
    )


def test_bad_frozen_lake_args_are_reported():
    workflow = FrozenLakeWorkflow(
        task=make_task(is_slippery="false"), model=scripted_model(frozen_lake_oracle)
    )
    assert workflow.is_slippery is False
    for args, message in (
        ({"env_max_steps": 0}, "env_max_steps must be an integer"),
        ({"is_slippery": "sometimes"}, "is_slippery must be true or false"),
        ({"agent_max_steps": -2}, "agent_max_steps must be an integer"),
        ({"desc": ["SS", "GG"]}, "desc must be"),
    ):
        with pytest.raises(ValueError, match=message):
            FrozenLakeWorkflow(task=make_task(**args), model=scripted_model(frozen_lake_oracle))
    with pytest.raises(ValueError, match="seed, size and p must be numbers"):
        FrozenLakeWorkflow(task=make_task({"seed": "x"}), model=scripted_model(frozen_lake_oracle))
