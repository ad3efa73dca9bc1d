"""The token limits (``max_model_len``, ``max_prompt_tokens``, ``enable_prompt_truncation``) and
the served model names, held by the real transformers engine, the model wrapper and the OpenAI
API with the real ``openai`` client (the vLLM engine shares the same code path: its real CPU
build is checked in ``test_vllm_engine_real.py``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import pytest

from trinity.explorer.model_wrapper import ModelWrapper
from trinity.rollout.base import PROMPT_TRUNCATED, PromptTooLong

openai = pytest.importorskip("openai")  # in trinity-core[dev]

HELLO = [{"role": "user", "content": "Say hello."}]


@contextlib.contextmanager
def limits(engine, **values):
    """The session's engine with other limits for one test."""
    names = ("max_model_len", "max_prompt_tokens", "enable_prompt_truncation")
    before = {n: getattr(engine, n) for n in names}
    for name, value in values.items():
        assert name in names
        setattr(engine, name, value)
    try:
        yield engine
    finally:
        for name, value in before.items():
            setattr(engine, name, value)


def _prompt_len(engine, messages):
    return len(engine.encode(engine.apply_chat_template(messages)))


# -- the engine ------------------------------------------------------------------------------


def test_no_response_runs_past_max_model_len(engine):
    n = _prompt_len(engine, HELLO)
    with limits(engine, max_model_len=n + 3):
        exps = engine.chat(HELLO, n=3, max_tokens=40, min_tokens=40, seed=1)
    assert [e.tokens.shape[0] for e in exps] == [n + 3] * 3
    assert {e.info["finish_reason"] for e in exps} == {"length"}
    # Without a limit the same call runs to its max_tokens.
    assert engine.chat(HELLO, max_tokens=10, min_tokens=10, seed=1)[0].tokens.shape[0] == n + 10


def test_a_prompt_over_max_prompt_tokens_is_masked_not_sampled(engine):
    long = [{"role": "user", "content": "1+2+3+4+5+6+7+8+9 " * 8}]
    n = _prompt_len(engine, long)
    batches = engine.batches_run
    with limits(engine, max_prompt_tokens=n - 1, max_model_len=n + 16):
        exps = engine.chat(long, n=2, max_tokens=8)
        assert engine.batches_run == batches  # nothing was sampled
        # A short prompt in the same call is sampled as usual (prompt-major order kept).
        mixed = engine.generate([engine.apply_chat_template(long), "1+1="], n=2, max_tokens=4, seed=2)
    for exp in exps:
        assert exp.info["truncate_status"] == PROMPT_TRUNCATED and exp.info["prompt_tokens"] == n
        assert exp.prompt_length == n - 1 and exp.tokens.shape[0] == n
        assert exp.action_mask.tolist() == [False] and exp.logprobs.tolist() == [0.0]
    assert [e.info.get("truncate_status") for e in mixed] == [PROMPT_TRUNCATED] * 2 + [None] * 2
    assert mixed[2].prompt_text.startswith("1+1=")


def test_without_prompt_truncation_a_long_prompt_is_sampled_while_it_fits(engine):
    long = [{"role": "user", "content": "1+2+3+4+5+6+7+8+9 " * 8}]
    n = _prompt_len(engine, long)
    with limits(engine, max_prompt_tokens=8, max_model_len=n + 2, enable_prompt_truncation=False):
        [exp] = engine.chat(long, max_tokens=8, min_tokens=8, seed=0)
        assert exp.prompt_length == n and exp.tokens.shape[0] == n + 2
        with (
            pytest.raises(PromptTooLong, match=rf"maximum context length is {n} tokens.*has {n} input"),
            limits(engine, max_model_len=n),
        ):
            engine.chat(long, max_tokens=8)


# -- the wrapper: what workflows read --------------------------------------------------------


def test_the_wrapper_exposes_the_limits_and_cuts_conversations_at_max_model_len(engine):
    model = ModelWrapper(engine)
    conversation = [*HELLO, {"role": "assistant", "content": "Hello! " * 20}]
    full = model.convert_messages_to_experience(conversation)
    with limits(engine, max_model_len=full.prompt_length + 5, max_prompt_tokens=full.prompt_length):
        assert (model.max_model_len, model.max_prompt_tokens) == (full.prompt_length + 5, full.prompt_length)
        assert model.max_response_tokens == engine.default_args.max_tokens
        cut = model.convert_messages_to_experience(conversation)
        assert (
            cut.tokens.shape[0] == full.prompt_length + 5
            and cut.info["truncate_status"] == "response_truncated"
        )
        assert cut.tokens.tolist() == full.tokens[: full.prompt_length + 5].tolist()
        assert cut.action_mask.shape == cut.logprobs.shape == (5,)
    with limits(engine, max_prompt_tokens=full.prompt_length - 1):
        masked = model.convert_messages_to_experience(conversation)
        assert masked.info["truncate_status"] == PROMPT_TRUNCATED and not masked.action_mask.any()


# -- the OpenAI API --------------------------------------------------------------------------


@pytest.fixture
def served(engine):
    model = ModelWrapper(engine, name="policy", model_path="/models/tiny", aliases=["any"])
    try:
        yield model, model.get_openai_client(timeout=60)
    finally:
        model.close()


def test_the_api_refuses_a_prompt_past_max_model_len_in_vllms_words(served, engine):
    _, client = served
    n = _prompt_len(engine, HELLO)
    with limits(engine, max_model_len=n):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="policy", messages=HELLO)
        assert err.value.code == "context_length_exceeded"
        assert f"maximum context length is {n} tokens. However, your request has {n} input tokens" in str(
            err.value
        )
    with limits(engine, max_model_len=n + 4, max_prompt_tokens=2):
        # Only max_model_len limits the API's prompts; without max_tokens the reply is capped.
        reply = client.chat.completions.create(model="policy", messages=HELLO, extra_body={"min_tokens": 30})
        assert reply.usage.prompt_tokens == n and reply.usage.completion_tokens == 4
        assert reply.choices[0].finish_reason == "length"
        # An explicit max_tokens past the room is refused, as vLLM's server does.
        with pytest.raises(openai.BadRequestError, match=rf"too large: 5\. .* \(5 > {n + 4} - {n}\)"):
            client.chat.completions.create(model="policy", messages=HELLO, max_tokens=5)
        with pytest.raises(openai.BadRequestError, match=r"context_length|maximum context length"):
            client.completions.create(model="policy", prompt="1+2=" * 40, stream=True)


def test_an_oversized_request_does_not_hold_up_the_others(served, engine):
    """1 MB of content against max_model_len 256: refused at once, and a one-line request sent
    beside it is answered within seconds (before: no answer within 60 s for either)."""
    _, client = served
    huge = [{"role": "user", "content": "x" * 1_000_000}]
    with limits(engine, max_model_len=256), concurrent.futures.ThreadPoolExecutor(2) as pool:

        def timed(messages, **kwargs):
            start = time.monotonic()
            try:
                return client.chat.completions.create(
                    model="policy", messages=messages, **kwargs
                ), time.monotonic() - start
            except openai.APIStatusError as exc:
                return exc, time.monotonic() - start

        big = pool.submit(timed, huge)
        small = pool.submit(timed, HELLO, max_tokens=4)
        (refused, big_s), (answer, small_s) = big.result(), small.result()
    assert isinstance(refused, openai.BadRequestError) and refused.code == "context_length_exceeded"
    assert answer.choices[0].message.content is not None
    print(f"oversized refused in {big_s:.2f} s, small answered in {small_s:.2f} s")
    assert big_s < 30 and small_s < 30, (big_s, small_s)


def test_only_served_model_names_are_answered(served):
    model, client = served
    assert model.served_model_names == ["policy", "/models/tiny", "any"]
    for name in ("policy", "/models/tiny", "any"):  # its name, its path (Trinity-RFT's clients), an alias
        assert client.chat.completions.create(model=name, messages=HELLO, max_tokens=2).model == "policy"
    for call in (
        lambda: client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2),
        lambda: client.completions.create(model="no-such-model", prompt="1+1=", max_tokens=2),
        lambda: client.models.retrieve("no-such-model"),
    ):
        with pytest.raises(openai.NotFoundError, match=r"`no-such-model` does not exist.*'policy'") as err:
            call()
        assert err.value.code == "model_not_found"
    assert client.models.retrieve("any").id == "policy"


def test_the_wildcard_alias_answers_any_name(engine):
    model = ModelWrapper(engine, aliases=["*"])
    try:
        reply = model.get_openai_client().chat.completions.create(
            model="whatever", messages=HELLO, max_tokens=2
        )
        assert reply.model == "rollout"
    finally:
        model.close()


def test_the_step_metrics_count_what_the_limits_touched(engine):
    from trinity.explorer.explorer import rollout_metrics

    model = ModelWrapper(engine)
    long = [{"role": "user", "content": "1+2+3+4+5+6+7+8+9 " * 8}]
    conversation = [*HELLO, {"role": "assistant", "content": "Hello! " * 20}]
    n = _prompt_len(engine, long)
    with limits(engine, max_prompt_tokens=n - 1, max_model_len=n + 4):
        exps = [*model.chat(long, n=2, max_tokens=4), *model.chat(HELLO, max_tokens=4)]
        exps.append(model.convert_messages_to_experience(conversation))
    metrics = rollout_metrics(exps, 1.0)
    assert metrics["rollout/prompt_truncated_experiences"] == 2.0
    assert metrics["rollout/response_truncated_experiences"] == 1.0
