"""Tool calls, reasoning, streaming and history through the OpenAI API.

A scripted engine "samples" known replies (tool-call markup included) token by token, so the
tests know exactly which tokens the model generated and check that the history holds exactly
those, with their logprobs and a mask over exactly the assistant's tokens. The tests against the
real tiny model (tools reaching its chat template) are at the end.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import torch

from trinity.experience import Experience
from trinity.explorer.model_wrapper import ModelWrapper
from trinity.rollout.base import RolloutEngine, SamplingArgs, finish_point
from trinity.testing.tiny_model import IM_END, build_tokenizer

openai = pytest.importorskip("openai")  # in trinity-core[dev]

# ChatML with tools in the system prompt and hermes-style calls, as Qwen's templates render them.
TOOL_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' -%}{{ messages[0]['content'] + '\n\n' }}{%- endif -%}"
    "{{ '<tools>' }}{%- for tool in tools -%}{{ '\n' + (tool | tojson) }}{%- endfor -%}"
    "{{ '\n</tools><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' + message['content'] }}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{{ '<tool_call>' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson) + '</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


class ScriptedEngine(RolloutEngine):
    """Samples the scripted replies in order, each ending with ``<|im_end|>`` (EOS); token
    ``i`` of a reply gets logprob ``-(i + 1) / 100``. ``sampled`` keeps every response's ids."""

    def __init__(self, replies: list[str], chat_template: str | None = TOOL_TEMPLATE) -> None:
        super().__init__(
            build_tokenizer(), chat_template=chat_template, default_args=SamplingArgs(max_tokens=500)
        )
        self.replies = list(replies)
        self.sampled: list[list[int]] = []
        self.seeds: list[int | None] = []
        self.eos = self.tokenizer.convert_tokens_to_ids(IM_END)
        self._lock = threading.Lock()

    def generate_tokens(self, prompts, args):
        def decode(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        groups = []
        for prompt in prompts:
            group = []
            for _ in range(args.n):
                with self._lock:
                    text = self.replies.pop(0)  # IndexError when the script is over: an engine failure
                    ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
                    end, reason, response = finish_point(
                        ids[: args.max_tokens], {self.eos}, args.stop, decode
                    )
                    self.sampled.append(ids[:end])
                    self.seeds.append(args.seed)
                group.append(
                    Experience(
                        tokens=torch.tensor(prompt + ids[:end]),
                        prompt_length=len(prompt),
                        logprobs=-torch.arange(1, end + 1, dtype=torch.float32) / 100,
                        prompt_text=self.tokenizer.decode(prompt),
                        response_text=response,
                        info={"finish_reason": reason},
                    )
                )
            groups.append(group)
        return groups

    def logprobs(self, tokens, temperature=1.0):
        raise NotImplementedError

    def update_weights(self, state_dict, version):
        pass

    def load_checkpoint(self, path, version):
        pass


def _wrapper(replies, **kwargs):
    options = {"enable_history": True, "tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    options.update(kwargs)
    engine = kwargs.pop("engine", None) or ScriptedEngine(replies)
    options.pop("engine", None)
    return ModelWrapper(engine, **options)


@pytest.fixture
def served():
    """``served(replies, **wrapper_kwargs)`` -> (wrapper, sync client); servers stop afterwards."""
    made = []

    def make(replies, **kwargs):
        model = _wrapper(replies, **kwargs)
        made.append(model)
        return model, model.get_openai_client()

    yield make
    for model in made:
        model.close()


def _check_record(exp, engine, k, messages, tools=None):
    """``exp`` holds exactly what the engine sampled (k-th sample) after the templated prompt."""
    tok = engine.tokenizer
    prompt = engine.encode(engine.apply_chat_template(messages, tools))
    assert exp.tokens[: exp.prompt_length].tolist() == prompt
    assert exp.tokens[exp.prompt_length :].tolist() == engine.sampled[k]
    assert exp.action_mask.dtype == torch.bool
    assert exp.action_mask.tolist() == [True] * len(engine.sampled[k])
    torch.testing.assert_close(exp.logprobs, -torch.arange(1, len(engine.sampled[k]) + 1).float() / 100)
    assert tok.decode(engine.sampled[k]).endswith(IM_END)


# -- tool calls ------------------------------------------------------------------------------


def test_tool_call_is_parsed_and_recorded_exactly(served):
    model, client = served([f"Checking.{CALL}"])
    completion = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER], logprobs=True)
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name) == ("function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # logprobs cover every generated token, the tool-call markup and EOS included
    assert "".join(t.token for t in choice.logprobs.content) == f"Checking.{CALL}{IM_END}"

    [exp] = model.extract_experience_from_history()
    _check_record(exp, model.engine, 0, ASK, [WEATHER])
    assert WEATHER["function"]["description"] in exp.prompt_text  # the tools reached the template
    assert exp.info["tool_calls"] == [call.model_dump()]
    assert exp.info["tools"] == [WEATHER]
    assert exp.messages[:-1] == ASK
    assert exp.messages[-1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"id": call.id, "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }  # fmt: skip


def test_multiple_calls_none_and_malformed(served):
    two = CALL + '\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>'
    model, client = served([two, "It is sunny.", broken])

    first = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER], tool_choice="auto")
    calls = first.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert first.choices[0].message.content is None and len({c.id for c in calls}) == 2

    plain = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
    assert plain.choices[0].message.tool_calls is None
    assert (plain.choices[0].message.content, plain.choices[0].finish_reason) == ("It is sunny.", "stop")

    bad = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
    assert bad.choices[0].message.tool_calls is None
    assert bad.choices[0].message.content == broken  # the agent sees what the model wrote
    assert bad.choices[0].finish_reason == "stop"

    history = model.extract_experience_from_history()
    assert len(history) == 3
    for k, exp in enumerate(history):
        _check_record(exp, model.engine, k, ASK, [WEATHER])
    assert len(history[0].info["tool_calls"]) == 2
    assert "tool_calls" not in history[1].info and "tool_call_error" not in history[1].info
    assert "not valid JSON" in history[2].info["tool_call_error"]


def test_n_samples_each_parsed_and_recorded(served):
    model, client = served([CALL, "no tools needed"])
    completion = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER], n=2, seed=5)
    assert [c.finish_reason for c in completion.choices] == ["tool_calls", "stop"]
    assert completion.usage.completion_tokens == sum(len(s) for s in model.engine.sampled)
    history = model.extract_experience_from_history()
    for k, exp in enumerate(history):
        _check_record(exp, model.engine, k, ASK, [WEATHER])
    assert model.engine.seeds == [5, 5]  # one call: the engine derives each row's seed from it


def test_tool_results_go_back_into_the_template(served):
    model, client = served([CALL, "Sunny, 21 C."])
    first = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
    reply = first.choices[0].message
    follow_up = [
        *ASK,
        reply.model_dump(exclude_none=True),  # arguments as JSON text, as agents send them back
        {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "sunny, 21"},
    ]
    second = client.chat.completions.create(model="rollout", messages=follow_up, tools=[WEATHER])
    assert second.choices[0].message.content == "Sunny, 21 C."
    turn1, turn2 = model.extract_experience_from_history()
    # The call is rendered with its arguments as an object (not JSON text quoted again), so the
    # second prompt holds the first reply's tokens as the model generated them.
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>" in turn2.prompt_text
    assert "<tool_response>sunny, 21</tool_response>" in turn2.prompt_text
    generated = model.engine.tokenizer.decode(turn1.tokens[turn1.prompt_length :].tolist())
    assert generated in turn2.prompt_text
    assert turn2.messages[:-1] == [*ASK, turn1.messages[-1] | {"content": ""}, follow_up[-1]]


def test_required_and_named_tool_choice_parse_without_auto(served):
    _, client = served([CALL, CALL], enable_auto_tool_choice=False)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        completion = client.chat.completions.create(
            model="rollout", messages=ASK, tools=[WEATHER], tool_choice=choice
        )
        assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError, match="enable_auto_tool_choice") as err:
        client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
    assert err.value.body["param"] == "tool_choice"


def test_tool_choice_none_renders_and_parses_no_tools(served):
    model, client = served([CALL])
    completion = client.chat.completions.create(
        model="rollout", messages=ASK, tools=[WEATHER], tool_choice="none"
    )
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content == CALL
    [exp] = model.extract_experience_from_history()
    _check_record(exp, model.engine, 0, ASK)
    assert "<tools>" not in exp.prompt_text and "tools" not in exp.info


def test_reasoning_then_tool_call(served):
    model, client = served([f"<think>need weather</think>\n{CALL}"], reasoning_parser="qwen3")
    completion = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
    message = completion.choices[0].message
    assert message.reasoning_content == "need weather"
    assert message.content is None and message.tool_calls[0].function.name == "get_weather"
    [exp] = model.extract_experience_from_history()
    _check_record(exp, model.engine, 0, ASK, [WEATHER])  # the thinking tokens are recorded too
    assert exp.messages[-1]["reasoning_content"] == "need weather"


# -- streaming -------------------------------------------------------------------------------


def test_streamed_tool_calls_and_reasoning_assemble(served):
    text = f"<think>hm</think>Let me check.{CALL}"
    model, client = served([text, text], reasoning_parser="qwen3")
    whole = client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER], logprobs=True)
    chunks = list(
        client.chat.completions.create(
            model="rollout", messages=ASK, tools=[WEATHER], logprobs=True, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "hm"
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content == "Let me check."
    [call] = [tc for d in deltas for tc in d.tool_calls or []]
    assert (call.index, call.function.name, call.function.arguments) == (
        0, "get_weather", whole.choices[0].message.tool_calls[0].function.arguments,
    )  # fmt: skip
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    streamed_lps = [
        t.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert streamed_lps == [t.logprob for t in whole.choices[0].logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    first, second = model.extract_experience_from_history()
    assert torch.equal(first.tokens, second.tokens)  # a streamed call is recorded like any other
    _check_record(second, model.engine, 1, ASK, [WEATHER])


def test_stream_is_server_sent_events(served):
    model, _ = served(["hello"])
    with httpx.Client() as http:
        response = http.post(f"{model.base_url}/chat/completions", json={"messages": ASK, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


# -- async client ----------------------------------------------------------------------------


def test_async_client_concurrent_calls_and_stream():
    replies = [f"{CALL}" if i % 2 else f"answer {i}" for i in range(8)] + ["streamed"]
    model = _wrapper(replies)

    async def main():
        client = model.get_openai_async_client()
        try:
            many = await asyncio.gather(
                *(
                    client.chat.completions.create(model="rollout", messages=ASK, tools=[WEATHER])
                    for _ in range(8)
                )
            )
            stream = await client.chat.completions.create(model="rollout", messages=ASK, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return many, text
        finally:
            await client.close()

    try:
        many, text = asyncio.run(main())
        assert text == "streamed"
        assert sum(bool(c.choices[0].message.tool_calls) for c in many) == 4
        history = model.extract_experience_from_history()
        assert len(history) == 9
        # each record's response is one of the sampled ones, whole, masked as the assistant's
        assert sorted(e.tokens[e.prompt_length :].tolist() for e in history) == sorted(model.engine.sampled)
        assert all(e.action_mask.all() and e.action_mask.numel() == e.response_length for e in history)
    finally:
        model.close()


# -- errors ----------------------------------------------------------------------------------


def _post(base_url, path, payload, **kwargs):
    with httpx.Client(timeout=30) as http:
        if isinstance(payload, (bytes, str)):
            return http.post(
                f"{base_url}{path}", content=payload, headers={"Content-Type": "application/json"}
            )
        return http.post(f"{base_url}{path}", json=payload, **kwargs)


def _error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("payload", "param", "words"),
    [
        (b'{"messages": [', None, "not valid JSON"),
        ({"messages": []}, "messages", "at least 1"),
        ({}, "messages", "Field required"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "'user'"),
        ({"messages": ASK, "n": 0}, "n", "greater than or equal to 1"),
        ({"messages": ASK, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"messages": ASK, "max_completion_tokens": -1}, "max_completion_tokens", "greater than"),
        ({"messages": ASK, "temperature": "hot"}, "temperature", "number"),
        ({"messages": ASK, "top_p": 0}, "top_p", "greater than 0"),
        ({"messages": ASK, "logprobs": True, "top_logprobs": 3}, "top_logprobs", "sampled token"),
        ({"messages": ASK, "presence_penalty": 0.5}, None, "presence_penalty"),
        ({"messages": ASK, "logit_bias": {"5": 1.0}}, None, "logit_bias"),
        ({"messages": ASK, "response_format": {"type": "json_object"}}, "response_format", "constrained"),
        ({"messages": ASK, "tool_choice": "auto"}, "tool_choice", "only allowed when tools"),
        ({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "not among the tools"),
        ({"messages": ASK, "tools": [{"type": "function", "function": {}}]}, "tools.0.function.name", "required"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages.0.content", "only text content parts"),
        ({"messages": ASK, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "may not set"),
    ],
)  # fmt: skip
def test_bad_chat_requests_get_openai_shaped_400s(served, payload, param, words):
    model, _ = served([])
    error = _error(_post(model.base_url, "/chat/completions", payload), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    assert model.extract_experience_from_history() == []  # nothing was sampled


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({}, "prompt"),
        ({"prompt": []}, "non-empty"),
        ({"prompt": "a", "logprobs": 2}, "logprobs: 0"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
    ],
)
def test_bad_completion_requests_get_400s(served, payload, words):
    model, _ = served([])
    assert words in _error(_post(model.base_url, "/completions", payload), 400)["message"]


def test_routes_template_and_engine_failures_are_openai_shaped(served):
    model, client = served([])  # the script is empty: sampling fails
    base = model.base_url
    with httpx.Client(timeout=30) as http:
        assert _error(http.get(f"{base}/nowhere"), 404)["code"] == "not_found"
        assert "POST /v1/chat/completions" in _error(http.get(f"{base}/chat/completions"), 405)["message"]
        assert _error(http.get(f"{base}/models/other"), 404)["code"] == "model_not_found"
        assert http.get(f"{base}/models/rollout").json()["id"] == "rollout"
    failed = _error(_post(base, "/chat/completions", {"messages": ASK}), 500)
    assert failed["type"] == "server_error" and "IndexError" in failed["message"]
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="rollout", messages=ASK)  # no retry, no hang

    strict = ScriptedEngine([], chat_template="{{ raise_exception('roles must alternate') }}")
    model2, _ = served([], engine=strict)
    error = _error(_post(model2.base_url, "/chat/completions", {"messages": ASK}), 400)
    assert "roles must alternate" in error["message"]


# -- completions -----------------------------------------------------------------------------


def test_completions_record_exactly_and_stream(served):
    model, client = served(["abc", "de", "fgh", "ij"])
    out = client.completions.create(model="rollout", prompt=["1+1=", "2+2="], n=2, logprobs=0, max_tokens=8)
    assert [c.text for c in out.choices] == ["abc", "de", "fgh", "ij"]
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].logprobs.tokens == ["a", "b", "c", IM_END]
    assert out.choices[0].logprobs.text_offset == [0, 1, 2, 3]
    history = model.extract_experience_from_history()
    tok = model.engine.tokenizer
    for k, exp in enumerate(history):
        assert exp.tokens[: exp.prompt_length].tolist() == tok(["1+1=", "2+2="][k // 2])["input_ids"]
        assert exp.tokens[exp.prompt_length :].tolist() == model.engine.sampled[k]
        assert exp.action_mask.all() and exp.action_mask.numel() == exp.response_length
    assert out.usage.prompt_tokens == 8

    model.engine.replies = ["xyz"]
    stream = client.completions.create(model="rollout", prompt="go", stream=True)
    chunks = list(stream)
    assert (
        "".join(c.choices[0].text for c in chunks) == "xyz" and chunks[-1].choices[0].finish_reason == "stop"
    )


# -- the real tiny model -----------------------------------------------------------------------


def test_tools_reach_the_real_models_template_and_the_record_is_the_sample(tiny_model_path):
    from trinity.rollout.transformers_engine import TransformersEngine

    engine = TransformersEngine(
        tiny_model_path, dtype="float32", device="cpu", seed=0, chat_template=TOOL_TEMPLATE
    )
    model = ModelWrapper(engine, enable_history=True, tool_call_parser="hermes", enable_auto_tool_choice=True)
    try:
        client = model.get_openai_client()
        reply = client.chat.completions.create(
            model="rollout", messages=ASK, tools=[WEATHER], max_tokens=12, seed=3, logprobs=True
        )
        [exp] = model.extract_experience_from_history()
        [direct] = engine.chat(ASK, tools=[WEATHER], max_tokens=12, seed=3)
        [wrapped] = model.chat(ASK, tools=[WEATHER], max_tokens=12, seed=3)
        assert torch.equal(wrapped.tokens, direct.tokens)
        model.extract_experience_from_history()
        assert WEATHER["function"]["description"] in exp.prompt_text
        assert torch.equal(exp.tokens, direct.tokens)
        torch.testing.assert_close(exp.logprobs, direct.logprobs)
        assert exp.action_mask.tolist() == [True] * exp.response_length
        # the logprobs are those of the sampled tokens under the current weights
        rescored = engine.logprobs(exp.tokens.tolist())[exp.prompt_length - 1 :]
        torch.testing.assert_close(exp.logprobs, rescored, atol=1e-4, rtol=1e-4)
        text = "".join(t.token for t in reply.choices[0].logprobs.content)
        assert text.removesuffix(IM_END) == reply.choices[0].message.content
    finally:
        model.close()
