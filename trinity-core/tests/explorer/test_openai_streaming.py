"""Token-level streaming through the OpenAI API (``stream: true``).

Against the real tiny model (the transformers engine streams every decoding step): tokens reach
the client while the engine is still generating (made deterministic with the engine's step hook),
the streamed reply and the recorded Experience are exactly those of the same seeded call without
streaming, ``n > 1`` choices interleave, and a client that goes away mid-stream cancels its call.

Against a scripted engine that streams known replies one token at a time: incremental decoding
of characters split over several tokens, stop strings, reasoning and tool calls (valid,
malformed, none), each compared with the non-streaming answer to the same reply.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import torch

from trinity.experience import Experience
from trinity.explorer.model_wrapper import ModelWrapper
from trinity.rollout.base import (
    RolloutEngine,
    SamplingArgs,
    StreamEnd,
    TokenDelta,
    finish_point,
)
from trinity.testing.tiny_model import DEFAULT_VOCAB_CHARS, IM_END, build_tokenizer

openai = pytest.importorskip("openai")  # in trinity-core[dev]

HELLO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def _wait_until(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _by_choice(chunks):
    """{index: [choice chunk, ...]} in arrival order."""
    out = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out.setdefault(choice.index, []).append(choice)
    return out


def _joined(choices, field):
    return "".join(getattr(c.delta, field, None) or "" for c in choices)


def _without_call_ids(value):
    """``value`` with the tool calls' ``id`` (random per answer) left out."""
    if isinstance(value, dict):
        return {k: _without_call_ids(v) for k, v in value.items() if not (k == "id" and "function" in value)}
    if isinstance(value, list):
        return [_without_call_ids(v) for v in value]
    return value


def _assert_same_record(plain: Experience, streamed: Experience):
    assert torch.equal(plain.tokens, streamed.tokens)
    assert plain.prompt_length == streamed.prompt_length
    assert torch.equal(plain.logprobs, streamed.logprobs)
    assert torch.equal(plain.action_mask, streamed.action_mask)
    assert plain.response_text == streamed.response_text and plain.prompt_text == streamed.prompt_text
    assert _without_call_ids(plain.messages) == _without_call_ids(streamed.messages)
    assert _without_call_ids(plain.info) == _without_call_ids(streamed.info)


@pytest.fixture
def tiny(engine):
    model = ModelWrapper(engine, enable_history=True, name="tiny")
    yield model, model.get_openai_client()
    model.close()


# -- the transformers engine streams token by token ----------------------------------------------


def test_engine_stream_is_token_by_token_and_samples_as_without_streaming(engine):
    args = {"n": 2, "max_tokens": 10, "min_tokens": 4, "seed": 11}
    plain = engine.generate(["12+34="], **args)

    async def collect():
        return [item async for item in engine.generate_stream_async(["12+34="], **args)]

    items = asyncio.run(collect())
    assert engine.streams_tokens and isinstance(items[-1], StreamEnd)
    deltas = [item for item in items[:-1] if isinstance(item, TokenDelta)]
    assert len(deltas) == len(items) - 1
    assert all(len(d.token_ids) == 1 for d in deltas)  # one decoding step per delta
    for k, (exp, streamed) in enumerate(zip(plain, items[-1].experiences, strict=True)):
        mine = [d for d in deltas if d.index == k]
        assert [t for d in mine for t in d.token_ids] == exp.tokens[exp.prompt_length :].tolist()
        assert [lp for d in mine for lp in d.logprobs] == exp.logprobs.tolist()
        assert torch.equal(exp.tokens, streamed.tokens) and torch.equal(exp.logprobs, streamed.logprobs)
        assert exp.response_text == streamed.response_text and exp.info == streamed.info


def test_first_chunk_arrives_while_the_engine_is_still_generating(tiny, engine, monkeypatch):
    """The engine waits after its first decoding step until the client holds a token: without real
    streaming the client would get nothing before the whole sample, and the wait would time out."""
    model, client = tiny
    received = threading.Event()
    waited = []

    def hold_first_step(recorder):
        if recorder.steps == 1:
            waited.append(received.wait(timeout=30))

    monkeypatch.setattr(engine, "_on_step", hold_first_step)
    stream = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=6,
        extra_body={"min_tokens": 6},
        seed=5,
        logprobs=True,
        stream=True,
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].logprobs and not received.is_set():
            assert not waited  # still inside step 1: the rest of the sample is not sampled yet
            received.set()
    assert waited == [True]
    [exp] = model.extract_experience_from_history()
    assert exp.response_length == 6
    lps = [
        t.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert len(lps) == 6


def test_stream_equals_the_reply_and_the_record_of_the_same_call_without_streaming(tiny):
    model, client = tiny
    args = {"model": "tiny", "messages": HELLO, "n": 2, "max_tokens": 14, "seed": 21, "logprobs": True}
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert len(model.extract_experience_from_history()) == 4
    choices = _by_choice(chunks)
    assert sorted(choices) == [0, 1]
    for i, choice in enumerate(whole.choices):
        mine = choices[i]
        assert mine[0].delta.role == "assistant"
        assert _joined(mine, "content") == choice.message.content
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [choice.finish_reason]
        lps = [t.logprob for c in mine if c.logprobs for t in c.logprobs.content]
        assert lps == [t.logprob for t in choice.logprobs.content]
        assert [t.token for c in mine if c.logprobs for t in c.logprobs.content] == [
            t.token for t in choice.logprobs.content
        ]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_and_plain_calls_record_identical_experiences(tiny):
    model, client = tiny
    args = {"model": "tiny", "messages": HELLO, "n": 2, "max_tokens": 12, "seed": 4, "logprobs": True}
    whole = client.chat.completions.create(**args)
    plain = model.extract_experience_from_history()
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = model.extract_experience_from_history()
    assert len(plain) == len(streamed) == 2
    for a, b in zip(plain, streamed, strict=True):
        _assert_same_record(a, b)
    for i, exp in enumerate(streamed):  # the logprobs in the chunks are the recorded ones
        mine = _by_choice(chunks)[i]
        assert [t.logprob for c in mine if c.logprobs for t in c.logprobs.content] == exp.logprobs.tolist()
        assert _joined(mine, "content") == whole.choices[i].message.content == exp.response_text


def test_stop_string_cuts_the_stream_as_the_reply(tiny):
    model, client = tiny
    args = {"model": "tiny", "messages": HELLO, "max_tokens": 16, "seed": 9, "extra_body": {"min_tokens": 16}}
    text = client.chat.completions.create(**args).choices[0].message.content
    stop = text[5:7]  # a stop string the seeded sample is sure to produce
    whole = client.chat.completions.create(**args, stop=[stop])
    chunks = list(client.chat.completions.create(**args, stop=[stop], stream=True))
    streamed_text = _joined(_by_choice(chunks)[0], "content")
    assert streamed_text == whole.choices[0].message.content == text[: text.index(stop)]
    assert _by_choice(chunks)[0][-1].finish_reason == whole.choices[0].finish_reason == "stop"
    records = model.extract_experience_from_history()
    _assert_same_record(records[1], records[2])


def test_n_choices_interleave(tiny):
    _, client = tiny
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=HELLO,
            n=2,
            max_tokens=5,
            extra_body={"min_tokens": 5},
            seed=1,
            logprobs=True,
            stream=True,
        )
    )
    order = [c.choices[0].index for c in chunks if c.choices and c.choices[0].logprobs]
    assert sorted(order) == [0] * 5 + [1] * 5
    assert order != sorted(order)  # both samples stream side by side, step by step


def test_completions_stream_token_by_token_as_the_plain_completion(tiny):
    model, client = tiny
    args = {"model": "tiny", "prompt": ["1+1=", "ab"], "n": 2, "max_tokens": 8, "seed": 3, "logprobs": 0}
    whole = client.completions.create(**args)
    plain = model.extract_experience_from_history()
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    streamed = model.extract_experience_from_history()
    for a, b in zip(plain, streamed, strict=True):
        _assert_same_record(a, b)
    by_index = _by_choice(chunks)
    assert sorted(by_index) == [0, 1, 2, 3]
    for i, choice in enumerate(whole.choices):
        mine = by_index[i]
        assert "".join(c.text for c in mine) == choice.text
        assert mine[-1].finish_reason == choice.finish_reason
        assert [c.finish_reason for c in mine[:-1]] == [None] * (len(mine) - 1)
        parts = [c.logprobs for c in mine if c.logprobs]
        assert len(parts) == streamed[i].response_length  # one chunk per sampled token
        assert [t for p in parts for t in p.tokens] == choice.logprobs.tokens
        assert [lp for p in parts for lp in p.token_logprobs] == choice.logprobs.token_logprobs
        assert [o for p in parts for o in p.text_offset] == choice.logprobs.text_offset
    assert chunks[-1].usage == whole.usage


def test_client_going_away_cancels_the_call_and_frees_the_engine(tiny, engine, monkeypatch):
    model, _ = tiny
    closed = threading.Event()
    steps = []

    def hook(recorder):
        steps.append(recorder.steps)
        if recorder.steps == 1:  # hold the batch until the client left and the server noticed
            assert closed.wait(timeout=30)
            _wait_until(lambda: all(call.cancelled for call, _ in recorder.rows), "the call's cancellation")

    monkeypatch.setattr(engine, "_on_step", hook)
    cancelled_before, batches_before = engine.calls_cancelled, engine.batches_run
    payload = {"messages": HELLO, "max_tokens": 200, "min_tokens": 200, "seed": 2, "stream": True}
    url = f"{model.base_url}/chat/completions"
    with httpx.Client(timeout=30) as http, http.stream("POST", url, json=payload) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # one token is enough: go away
    closed.set()
    _wait_until(lambda: engine.calls_cancelled == cancelled_before + 1, "the engine to drop the call")
    _wait_until(lambda: not engine._lock.locked(), "the engine to go idle")
    assert max(steps) == 1  # stopped right after the step that saw the cancellation, not after 200
    assert engine.batches_run == batches_before + 1 and engine._queue == []
    assert model.extract_experience_from_history() == []  # the client never got the reply
    monkeypatch.undo()
    # The engine and the server serve the next request as usual.
    reply = model.get_openai_client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_queued_streamed_call_closed_before_its_batch_is_dropped(engine):
    async def main():
        stream = engine.generate_stream_async(["ab"], max_tokens=4, seed=1)
        with engine._lock:  # a batch is running: the call waits in the queue
            task = asyncio.ensure_future(stream.__anext__())
            await asyncio.to_thread(_wait_until, lambda: len(engine._queue) == 1, "the call to queue")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await stream.aclose()
        await asyncio.to_thread(_wait_until, lambda: engine._queue == [], "the queue to empty")

    before = (engine.calls_cancelled, engine.batches_run)
    asyncio.run(main())
    assert (engine.calls_cancelled, engine.batches_run) == (before[0] + 1, before[1])  # never generated


# -- a scripted engine streaming known replies token by token ----------------------------------

VOCAB = DEFAULT_VOCAB_CHARS + "é"  # "é" is two bytes: two tokens of the byte-level tokenizer
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


class TokenScriptEngine(RolloutEngine):
    """Samples the scripted replies in order (each ending with ``<|im_end|>``, cut by ``stop`` and
    ``max_tokens`` as the real engines do; token ``i`` gets logprob ``-(i + 1) / 100``) and
    streams them one token per delta, the samples of a call taking turns."""

    streams_tokens = True

    def __init__(self, replies: list[str]) -> None:
        super().__init__(build_tokenizer(VOCAB), default_args=SamplingArgs(max_tokens=500))
        self.replies = list(replies)
        self.eos = self.tokenizer.convert_tokens_to_ids(IM_END)

    def generate_tokens(self, prompts, args):
        groups = []
        for prompt in prompts:
            group = []
            for _ in range(args.n):
                text = self.replies.pop(0)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
                end, reason, response = finish_point(
                    ids[: args.max_tokens],
                    {self.eos},
                    args.stop,
                    lambda x: self.tokenizer.decode(x, skip_special_tokens=True),
                )
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

    async def generate_tokens_stream(self, prompts, args):
        experiences = [exp for group in self.generate_tokens(prompts, args) for exp in group]
        responses = [(exp.tokens[exp.prompt_length :].tolist(), exp.logprobs.tolist()) for exp in experiences]
        for step in range(max(len(ids) for ids, _ in responses)):
            for i, (ids, lps) in enumerate(responses):
                if step < len(ids):
                    await asyncio.sleep(0)
                    yield TokenDelta(i, [ids[step]], [lps[step]])
        yield StreamEnd(experiences)

    def logprobs(self, tokens, temperature=1.0):
        raise NotImplementedError

    def update_weights(self, state_dict, version):
        pass

    def load_checkpoint(self, path, version):
        pass


@pytest.fixture
def scripted():
    """``scripted(reply, **wrapper_kwargs)`` -> (wrapper, client); the reply is scripted twice
    (a plain call, then a streamed one)."""
    made = []

    def make(reply, **kwargs):
        options = {"enable_history": True, "tool_call_parser": "hermes", "enable_auto_tool_choice": True}
        model = ModelWrapper(TokenScriptEngine([reply, reply]), **{**options, **kwargs})
        made.append(model)
        return model, model.get_openai_client()

    yield make
    for model in made:
        model.close()


def _plain_and_streamed(model, client, **request):
    """The plain answer, the streamed chunks of the same reply, and both records (equal)."""
    whole = client.chat.completions.create(model="rollout", logprobs=True, **request)
    chunks = list(client.chat.completions.create(model="rollout", logprobs=True, stream=True, **request))
    plain, streamed = model.extract_experience_from_history()
    _assert_same_record(plain, streamed)
    deltas = _by_choice(chunks)[0]
    message = whole.choices[0].message
    assert _joined(deltas, "content") == (message.content or "")
    assert _joined(deltas, "reasoning_content") == (getattr(message, "reasoning_content", None) or "")
    assert deltas[-1].finish_reason == whole.choices[0].finish_reason
    lps = [t.logprob for c in deltas if c.logprobs for t in c.logprobs.content]
    assert lps == [t.logprob for t in whole.choices[0].logprobs.content] == streamed.logprobs.tolist()
    return whole, deltas


def _first(deltas, predicate):
    return next(i for i, d in enumerate(deltas) if predicate(d))


def test_characters_split_over_tokens_arrive_whole(scripted):
    model, client = scripted("café au lait")
    whole, deltas = _plain_and_streamed(model, client, messages=ASK)
    pieces = [d.delta.content for d in deltas if d.delta.content]
    assert whole.choices[0].message.content == "café au lait"
    assert len(pieces) >= 10 and "é" in pieces  # token by token, "é" once its second byte is in
    assert not any("\ufffd" in p for p in pieces)
    e_at = _first(deltas, lambda d: d.delta.content == "é")
    assert deltas[e_at - 1].delta.content is None  # the chunk of the first byte carries its logprob only


def test_stop_strings_are_held_back_until_they_cannot_start(scripted):
    model, client = scripted("abc STOP def")
    whole, deltas = _plain_and_streamed(model, client, messages=ASK, stop=["STOP"])
    assert whole.choices[0].message.content == "abc " and whole.choices[0].finish_reason == "stop"
    assert not any("S" in (d.delta.content or "") for d in deltas)


def test_valid_tool_call_text_before_streams_then_the_call(scripted):
    model, client = scripted(f"Checking now.{CALL}")
    whole, deltas = _plain_and_streamed(model, client, messages=ASK, tools=[WEATHER])
    assert whole.choices[0].finish_reason == "tool_calls"
    content = [d.delta.content for d in deltas if d.delta.content]
    assert "".join(content) == "Checking now." and len(content) > 3  # streamed, not in one piece
    assert not any("<" in c for c in content)  # the markup never shows as content
    [call_chunk] = [d for d in deltas if d.delta.tool_calls]
    [call] = call_chunk.delta.tool_calls
    expected = whole.choices[0].message.tool_calls[0]
    assert (call.index, call.function.name, call.function.arguments) == (
        0,
        "get_weather",
        expected.function.arguments,
    )
    # the text came as it was sampled, the call once complete
    assert _first(deltas, lambda d: d.delta.content) < _first(deltas, lambda d: d.delta.tool_calls)


def test_malformed_tool_call_comes_back_as_content(scripted):
    text = 'Sure.<tool_call>{"name": "get_weather", "arguments": </tool_call>'
    model, client = scripted(text)
    whole, deltas = _plain_and_streamed(model, client, messages=ASK, tools=[WEATHER])
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == "stop"
    assert not any(d.delta.tool_calls for d in deltas)
    assert model.engine.replies == []


def test_reply_without_a_call_streams_as_content(scripted):
    model, client = scripted("It is sunny in Paris.")
    whole, deltas = _plain_and_streamed(model, client, messages=ASK, tools=[WEATHER])
    assert whole.choices[0].message.content == "It is sunny in Paris."
    assert len([d for d in deltas if d.delta.content]) > 10 and not any(d.delta.tool_calls for d in deltas)


@pytest.mark.parametrize(
    ("reply", "parser", "reasoning", "content"),
    [
        ("<think>let me see</think>\nThe answer.", "qwen3", "let me see", "The answer."),
        ("still thinking</think>Done.", "deepseek_r1", "still thinking", "Done."),
        ("cut off while thin", "deepseek_r1", "cut off while thin", ""),
        ("no thinking here", "qwen3", None, "no thinking here"),
    ],
)
def test_reasoning_streams_apart_from_the_content(scripted, reply, parser, reasoning, content):
    model, client = scripted(reply, reasoning_parser=parser)
    whole, deltas = _plain_and_streamed(model, client, messages=ASK)
    message = whole.choices[0].message
    assert (getattr(message, "reasoning_content", None), message.content) == (reasoning, content)
    thoughts = [d.delta.reasoning_content for d in deltas if getattr(d.delta, "reasoning_content", None)]
    if reasoning:
        assert len(thoughts) > 3  # token by token
        assert not any("<" in t for t in thoughts)
    if reasoning and content:  # all the reasoning comes before the content
        assert _first(deltas, lambda d: d.delta.content) > max(
            i for i, d in enumerate(deltas) if getattr(d.delta, "reasoning_content", None)
        )


def test_reasoning_then_tool_call_stream(scripted):
    model, client = scripted(f"<think>need weather</think>{CALL}", reasoning_parser="qwen3")
    whole, deltas = _plain_and_streamed(model, client, messages=ASK, tools=[WEATHER])
    assert whole.choices[0].message.content is None and whole.choices[0].finish_reason == "tool_calls"
    assert [tc.function.name for d in deltas for tc in d.delta.tool_calls or []] == ["get_weather"]


def test_engines_that_cannot_stream_send_each_sample_whole(scripted):
    """The default of ``RolloutEngine``: one delta per finished sample, then the Experiences."""

    class WholeOnly(TokenScriptEngine):
        streams_tokens = False
        generate_tokens_stream = RolloutEngine.generate_tokens_stream

    engine = WholeOnly(["abc", "de"])

    async def collect():
        return [item async for item in engine.chat_stream_async(ASK, n=2)]

    first, second, end = asyncio.run(collect())
    assert (first.index, second.index) == (0, 1) and isinstance(end, StreamEnd)
    assert [first.token_ids, second.token_ids] == [
        e.tokens[e.prompt_length :].tolist() for e in end.experiences
    ]
    assert engine.tokenizer.decode(first.token_ids, skip_special_tokens=True) == "abc"
