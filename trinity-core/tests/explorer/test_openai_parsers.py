"""Tool-call and reasoning parsers of the OpenAI API, and the config keys that choose them."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trinity.config.sections.explorer import REASONING_PARSERS, TOOL_CALL_PARSERS, InferenceModelConfig
from trinity.serving.openai_api import reasoning, tool_parsers
from trinity.serving.openai_api.reasoning import parse_deepseek_r1, parse_qwen3
from trinity.serving.openai_api.tool_parsers import parse_hermes, parse_llama3_json


def _calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


# -- hermes ----------------------------------------------------------------------------------


def test_hermes_one_valid_call_with_text_before():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parsed = parse_hermes(text)
    assert parsed.content == "Let me look."
    assert _calls(parsed) == [("get_weather", {"city": "Paris"})]
    assert parsed.error is None
    call = parsed.tool_calls[0].to_openai()
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_hermes_multiple_calls_get_distinct_ids_and_keep_non_ascii():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"q": "caf\u00e9"}}</tool_call>\n'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.content is None
    assert _calls(parsed) == [("a", {"x": 1}), ("b", {"q": "caf\u00e9"}), ("c", {})]
    assert "caf\u00e9" in parsed.tool_calls[1].arguments  # not \\u-escaped
    assert len({c.id for c in parsed.tool_calls}) == 3


def test_hermes_no_call_is_plain_content():
    parsed = parse_hermes("The answer is 4.")
    assert (parsed.content, parsed.tool_calls, parsed.error) == ("The answer is 4.", [], None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {"x": 1}}</tool_call>', "no 'name'"),
        ('<tool_call>["a", 1]</tool_call>', "expected a JSON object"),
        ('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', "not an object"),
        # one good call and one bad: all or nothing
        ('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": </tool_call>', "tool call 2"),
    ],
)
def test_hermes_malformed_call_returns_the_text_and_says_why(text, why):
    parsed = parse_hermes(text)
    assert parsed.tool_calls == []
    assert parsed.content == text
    assert why in parsed.error


def test_hermes_unclosed_final_block_and_string_arguments():
    parsed = parse_hermes('ok <tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}')
    assert parsed.content == "ok"
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", '{"a": 2}')]


# -- llama3_json -----------------------------------------------------------------------------


def test_llama3_json_calls():
    parsed = parse_llama3_json(
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    )
    assert parsed.content is None
    assert _calls(parsed) == [("f", {"a": 1}), ("g", {})]
    assert parse_llama3_json("plain words").tool_calls == []
    bad = parse_llama3_json('{"name": "f", "parameters": {"a": ')
    assert bad.tool_calls == [] and "not valid JSON" in bad.error and bad.content.startswith("{")


# -- reasoning -------------------------------------------------------------------------------


def test_qwen3_reasoning():
    assert parse_qwen3("<think>\n2+2 is 4\n</think>\n\nIt is 4.") == ("2+2 is 4", "It is 4.")
    assert parse_qwen3("2+2 is 4</think>It is 4.") == ("2+2 is 4", "It is 4.")  # template opened it
    assert parse_qwen3("<think>still thinking") == ("still thinking", "")  # cut off
    assert parse_qwen3("It is 4.") == (None, "It is 4.")  # thinking off


def test_deepseek_r1_reasoning():
    assert parse_deepseek_r1("hmm</think>4") == ("hmm", "4")
    assert parse_deepseek_r1("still thinking") == ("still thinking", "")


# -- names and config ------------------------------------------------------------------------


def test_config_lists_are_the_parser_registries():
    assert set(TOOL_CALL_PARSERS) == set(tool_parsers.TOOL_CALL_PARSERS)
    assert set(REASONING_PARSERS) == set(reasoning.REASONING_PARSERS)


def test_config_validates_parser_names():
    config = InferenceModelConfig(
        tool_call_parser="Hermes", reasoning_parser="qwen3", enable_auto_tool_choice=True
    )
    assert (config.tool_call_parser, config.reasoning_parser) == ("hermes", "qwen3")
    with pytest.raises(ValidationError, match=r"tool_call_parser[\s\S]*'qwen3_coder'.*hermes, llama3_json"):
        InferenceModelConfig(tool_call_parser="qwen3_coder")
    with pytest.raises(ValidationError, match=r"reasoning_parser[\s\S]*deepseek_r1, qwen3"):
        InferenceModelConfig(reasoning_parser="r1")
    with pytest.raises(ValidationError, match="enable_auto_tool_choice needs a tool_call_parser"):
        InferenceModelConfig(enable_auto_tool_choice=True)


def test_model_wrapper_rejects_unknown_parser_names():
    from trinity.explorer.model_wrapper import ModelWrapper

    with pytest.raises(ValueError, match=r"unknown tool_call_parser 'xml'.*hermes"):
        ModelWrapper(engine=None, tool_call_parser="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown reasoning_parser"):
        ModelWrapper(engine=None, reasoning_parser="nope")  # type: ignore[arg-type]
