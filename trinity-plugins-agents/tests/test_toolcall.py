"""toolcall_workflow: the reward's structured comparison, the prompt, and whole rollouts on the
generated ToolACE-format taskset with scripted policies."""

from __future__ import annotations

import json

import pytest

from trinity.config import GenerationConfig
from trinity.testing import check_component
from trinity.workflow import Task
from trinity_agents.agents import toolcall_oracle, toolcall_random
from trinity_agents.scripted import scripted_model
from trinity_agents.tasks import TOOLS, toolcall_rows
from trinity_agents.toolcall import (
    ToolCallWorkflow,
    build_messages,
    extract_tool_calls,
    format_tools,
    load_calls,
    score_tool_calls,
    toolcall_reward,
)

GOLD = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "set_timer", "arguments": {"minutes": 5}},
]


def reply(calls, think="<think>ok</think>"):
    body = calls if isinstance(calls, str) else json.dumps(calls)
    return f"{think} <tool_call>{body}</tool_call>"


# -- the reward ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "reward", "name_match", "reason"),
    [
        (reply(GOLD), 1.0, True, ""),
        (reply(GOLD[::-1]), 1.0, True, ""),  # order is free
        (
            reply([{"arguments": {"unit": "celsius", "city": "Paris"}, "name": "get_weather"}, GOLD[1]]),
            1.0,
            True,
            "",
        ),
        (reply([GOLD[0], {"name": "set_timer", "arguments": {"minutes": 6}}]), 0.0, True, "wrong arguments"),
        (
            reply([GOLD[0], {"name": "set_timer", "arguments": {"minutes": "5"}}]),
            0.0,
            True,
            "wrong arguments",
        ),
        (
            reply([GOLD[0], {"name": "set_timer", "arguments": {"minutes": 5, "x": 1}}]),
            0.0,
            True,
            "wrong arguments",
        ),
        (
            reply([GOLD[0], {"name": "stock_price", "arguments": {"minutes": 5}}]),
            0.0,
            False,
            "wrong functions",
        ),
        (reply([*GOLD, GOLD[1]]), 0.0, False, "wrong functions"),  # an extra call
        (reply(GOLD[:1]), 0.0, False, "wrong functions"),  # a missing call
        (reply([]), 0.0, False, "wrong functions"),
        (reply('[{"name": "get_weather", "arguments": {'), 0.0, False, "no parsable"),  # malformed JSON
        (reply("42"), 0.0, False, "no parsable"),
        ("<think>ok</think> get_weather(city='Paris')", 0.0, False, "no parsable"),  # no block
        (reply(GOLD, think=""), 0.0, False, "exactly one <think>"),
        (reply(GOLD, think="<think>a</think><think>b</think>"), 0.0, False, "exactly one <think>"),
        (f"<tool_call>{json.dumps(GOLD)}</tool_call><think>late</think>", 0.0, False, "must come before"),
        (reply([{"name": "get_weather"}, GOLD[1]]), 0.0, False, "name and arguments"),
        (reply(["get_weather", GOLD[1]]), 0.0, False, "name and arguments"),
    ],
)
def test_reward_cases(response, reward, name_match, reason):
    score = score_tool_calls(response, json.dumps(GOLD))
    assert (score.reward, score.name_match) == (reward, name_match)
    assert reason in score.reason and (reason == "") == (score.reward == 1.0)
    assert toolcall_reward(response, GOLD) == reward


def test_reward_reads_the_last_block_and_lenient_json_forms():
    one = GOLD[:1]
    assert toolcall_reward(reply(GOLD[0]), one) == 1.0  # a single object, not a list
    assert toolcall_reward(reply(json.dumps(json.dumps(one))), one) == 1.0  # JSON text in JSON
    two_blocks = (
        f"<think>x</think><tool_call>{json.dumps(GOLD)}</tool_call> <tool_call>{json.dumps(one)}</tool_call>"
    )
    assert toolcall_reward(two_blocks, one) == 1.0 and toolcall_reward(two_blocks, GOLD) == 0.0
    assert toolcall_reward(reply([]), []) == 1.0  # no call expected, none made
    assert toolcall_reward("<think>x</think> nothing to call", []) == 0.0  # the block is required
    assert extract_tool_calls("<tool_call>\n[ ]\n</tool_call>") == []
    assert extract_tool_calls("nothing") is None
    assert score_tool_calls(reply(GOLD), GOLD).format_ok
    assert not score_tool_calls(reply(GOLD, think=""), GOLD).format_ok


def test_gold_answers_must_be_calls():
    assert load_calls('{"name": "a", "arguments": {}}') == [{"name": "a", "arguments": {}}]
    for bad in ("not json", '[{"arguments": {}}]', "3"):
        with pytest.raises(ValueError, match="answer"):
            load_calls(bad)


# -- the prompt ------------------------------------------------------------------------------


def test_prompt_from_a_toolace_row():
    row = {
        "raw_system": "SYSTEM.\n",
        "tools": json.dumps(TOOLS[:2]),
        "conversations": [
            {"from": "human", "value": "Weather in Oslo?"},
            {
                "from": "function_call",
                "value": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
            },
            {"from": "observation", "value": '{"temp": 3}'},
            {"from": "gpt", "value": "It is 3 degrees."},
            {"from": "user", "value": "And convert 3 USD to EUR."},
        ],
        "answer": "[]",
    }
    messages = build_messages(row)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("SYSTEM.\n# Tools")
    assert f"<tools>\n{format_tools(TOOLS[:2])}\n</tools>" in system
    assert [json.loads(line)["function"]["name"] for line in format_tools(TOOLS[:2]).splitlines()] == [
        "get_weather",
        "convert_currency",
    ]
    assert "<think>" in system and "<tool_call>" in system
    assert (
        messages[2]["content"]
        == '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>'
    )
    # tools as a list (before Trinity-RFT's JSON encoding), or the dialogue as JSON text, give
    # the same prompt
    assert build_messages({**row, "tools": TOOLS[:2]}) == messages
    assert build_messages({**row, "conversations": json.dumps(row["conversations"])}) == messages
    with pytest.raises(ValueError, match="unknown 'from'"):
        build_messages({**row, "conversations": [{"from": "narrator", "value": "x"}]})


# -- the generated taskset and rollouts ------------------------------------------------------


def test_generated_rows_have_upstreams_format():
    rows = toolcall_rows(200, seed=0)
    assert rows == toolcall_rows(200, seed=0) and rows != toolcall_rows(200, seed=1)
    kinds = set()
    for row in rows:
        assert set(row) == {"raw_system", "tools", "conversations", "answer", "id"}
        tools, answer = json.loads(row["tools"]), json.loads(row["answer"])
        assert {c["name"] for c in answer} <= {t["name"] for t in tools}
        assert row["conversations"][-1]["from"] == "user"
        assert row["id"] == (
            "toolace_multiple_turn" if len(row["conversations"]) >= 2 else "toolace_single_turn"
        )
        kinds.add((len(answer), len({c["name"] for c in answer}), len(row["conversations"])))
    assert {(1, 1, 1), (2, 2, 1), (2, 1, 1)} <= kinds and any(k[2] == 5 for k in kinds)


def make_task(row, repeat_times=1):
    return Task(workflow=ToolCallWorkflow, raw_task=row, repeat_times=repeat_times)


def test_workflow_conforms():
    check_component("workflow", ToolCallWorkflow)
    assert ToolCallWorkflow.can_repeat and ToolCallWorkflow.can_reset and ToolCallWorkflow.is_async


def test_oracle_scores_one_and_random_scores_zero():
    for i, row in enumerate(toolcall_rows(40, seed=5)):
        [good] = ToolCallWorkflow(
            task=make_task(row), model=scripted_model(toolcall_oracle(row["answer"]))
        ).run()
        [bad] = ToolCallWorkflow(task=make_task(row), model=scripted_model(toolcall_random(i))).run()
        assert (good.reward, good.metrics["accuracy"], good.metrics["format_ok"]) == (1.0, 1.0, 1.0)
        assert (bad.reward, bad.metrics["accuracy"], bad.metrics["format_ok"]) == (0.0, 0.0, 1.0)


def test_repeats_are_one_call_with_n_and_numbered_runs():
    row = toolcall_rows(1, seed=2)[0]
    task = make_task(row, repeat_times=4)
    task.rollout_args = GenerationConfig(temperature=0.7)
    model = scripted_model(toolcall_oracle(row["answer"]))
    workflow = ToolCallWorkflow(task=task, model=model)
    workflow.set_repeat_times(4, 8)
    exps = workflow.run()
    [call] = model.engine.calls
    assert (call["args"].n, call["args"].temperature) == (4, 0.7)
    assert [e.eid.run for e in exps] == [8, 9, 10, 11] and {e.eid.step for e in exps} == {0}
    for exp in exps:
        assert exp.reward == 1.0 and exp.info["reason"] == ""
        assert exp.logprobs.shape == (exp.tokens.shape[0] - exp.prompt_length,)
    assert call["messages"] == build_messages(row)


def test_reset_switches_task_and_missing_answer_is_an_error():
    rows = toolcall_rows(2, seed=4)
    workflow = ToolCallWorkflow(
        task=make_task(rows[0]), model=scripted_model(toolcall_oracle(rows[1]["answer"]))
    )
    workflow.reset(make_task(rows[1]))
    [exp] = workflow.run()
    assert exp.reward == 1.0
    with pytest.raises(ValueError, match="no 'answer' column"):
        workflow.reset(make_task({k: v for k, v in rows[0].items() if k != "answer"}))
