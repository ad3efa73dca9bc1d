"""ModelWrapper: generation front, multi-turn experiences, history and the OpenAI API."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import torch

from trinity.explorer.model_wrapper import ModelWrapper, assistant_token_mask
from trinity.testing.tiny_model import CHAT_TEMPLATE, IM_END
from trinity.workflow import ModelWrapperProtocol

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4, I think"},
]


def test_implements_the_workflow_protocol(engine):
    assert isinstance(ModelWrapper(engine), ModelWrapperProtocol)


def test_convert_messages_masks_exactly_the_assistant_tokens(engine):
    model = ModelWrapper(engine)
    exp = model.convert_messages_to_experience(CONVERSATION)
    tok = engine.tokenizer
    ids = exp.tokens.tolist()
    response = ids[exp.prompt_length :]
    assert tok.decode(ids[: exp.prompt_length]).endswith("<|im_start|>assistant\n")
    assert (
        tok.decode([t for t, m in zip(response, exp.action_mask.tolist()) if m])
        == f"yo{IM_END}4, I think{IM_END}"
    )
    assert tok.decode([t for t, m in zip(response, exp.action_mask.tolist()) if not m]) == (
        "\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n\n"
    )
    # logprobs recomputed under the current weights, over the response part
    expected = engine.logprobs(ids)[exp.prompt_length - 1 :]
    torch.testing.assert_close(exp.logprobs, expected)
    assert exp.logprobs.shape == exp.action_mask.shape == (exp.response_length,)


def test_template_without_generation_markers_falls_back_to_prefix_templating(engine):
    plain = CHAT_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    ids, mask = assistant_token_mask(engine.tokenizer, CONVERSATION, plain)
    marked = engine.tokenizer.decode([t for t, m in zip(ids, mask) if m])
    # the turn's trailing newline belongs to the template's turn, so it is marked too
    assert marked == f"yo{IM_END}\n4, I think{IM_END}\n"


def test_conversation_without_assistant_is_an_error(engine):
    with pytest.raises(ValueError, match="no assistant message"):
        ModelWrapper(engine).convert_messages_to_experience(CONVERSATION[:2])


def test_history_records_chat_generate_and_async(engine):
    model = ModelWrapper(engine, enable_history=True)
    model.chat(CONVERSATION[:2], n=2, max_tokens=3, seed=0)
    model.generate(["abc"], max_tokens=2, seed=0)
    asyncio.run(model.chat_async(CONVERSATION[:2], max_tokens=2, seed=0))
    history = model.extract_experience_from_history()
    assert len(history) == 4
    assert model.extract_experience_from_history() == []
    with pytest.raises(RuntimeError, match="enable_history"):
        ModelWrapper(engine).extract_experience_from_history()


def _post(url, payload):
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def test_openai_api_over_raw_http(engine):
    model = ModelWrapper(engine, enable_history=True, name="tiny")
    try:
        base = model.openai_base_url
        assert base.startswith("http://127.0.0.1:")
        status, body = _post(
            f"{base}/chat/completions",
            {
                "model": "tiny",
                "messages": CONVERSATION[:2],
                "n": 2,
                "max_tokens": 5,
                "seed": 1,
                "logprobs": True,
            },
        )
        assert status == 200 and body["object"] == "chat.completion"
        assert len(body["choices"]) == 2
        history = model.extract_experience_from_history()
        assert [c["message"]["content"] for c in body["choices"]] == [e.response_text for e in history]
        assert body["usage"]["completion_tokens"] == sum(e.response_length for e in history)
        lps = [x["logprob"] for x in body["choices"][0]["logprobs"]["content"]]
        assert lps == pytest.approx(history[0].logprobs.tolist(), abs=1e-6)
        with urllib.request.urlopen(f"{base}/models", timeout=30) as response:
            assert json.loads(response.read())["data"][0]["id"] == "tiny"

        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"{base}/chat/completions", {"messages": []})
        assert err.value.code == 400 and "messages" in json.loads(err.value.read())["error"]["message"]
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"{base}/chat/completions", {"messages": CONVERSATION[:2], "max_tokens": 0})
        assert err.value.code == 400
    finally:
        model.close()
