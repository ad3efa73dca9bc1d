"""The vLLM adapter's request/response mapping, on objects shaped like vLLM's (no vLLM here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trinity.config import InferenceModelConfig
from trinity.explorer.engines.base import SamplingArgs
from trinity.explorer.engines.vllm_engine import (
    VLLM_API,
    engine_kwargs,
    prompt_logprobs_to_tensor,
    request_output_to_experiences,
    sampling_params_kwargs,
)


def _lp(value):
    return SimpleNamespace(logprob=value, rank=1, decoded_token="?")


def test_sampling_params_mapping():
    kw = sampling_params_kwargs(
        SamplingArgs(n=4, temperature=0.7, top_k=0, max_tokens=9, stop=["\n\n"], seed=3)
    )
    assert kw["n"] == 4 and kw["temperature"] == 0.7 and kw["max_tokens"] == 9 and kw["seed"] == 3
    assert kw["top_k"] == -1  # vLLM's "off"
    assert kw["stop"] == ["\n\n"] and kw["logprobs"] == 0
    assert sampling_params_kwargs(SamplingArgs())["stop"] is None
    assert set(kw) <= set(VLLM_API["SamplingParams"])


def test_request_output_to_experiences():
    output = SimpleNamespace(
        prompt_token_ids=[5, 6, 7],
        finished=True,
        outputs=[
            SimpleNamespace(
                token_ids=[8, 9],
                text="hi",
                # the sampled token plus a top-1 alternative
                logprobs=[{8: _lp(-0.5), 1: _lp(-0.1)}, {9: _lp(-1.5)}],
                finish_reason="stop",
            ),
            SimpleNamespace(token_ids=[4], text="x", logprobs=[{4: _lp(-2.0)}], finish_reason="length"),
        ],
    )
    a, b = request_output_to_experiences(output, "prompt", model_version=3)
    assert a.tokens.tolist() == [5, 6, 7, 8, 9] and a.prompt_length == 3
    torch.testing.assert_close(a.logprobs, torch.tensor([-0.5, -1.5]))
    assert (a.response_text, a.info["finish_reason"], a.model_version, a.prompt_text) == (
        "hi",
        "stop",
        3,
        "prompt",
    )
    assert b.info["finish_reason"] == "length" and b.logprobs.tolist() == [-2.0]


def test_missing_logprobs_are_an_error():
    output = SimpleNamespace(
        prompt_token_ids=[1],
        outputs=[SimpleNamespace(token_ids=[2, 3], text="", logprobs=None, finish_reason="stop")],
    )
    with pytest.raises(ValueError, match="logprobs=0"):
        request_output_to_experiences(output, "", 0)
    output.outputs[0].logprobs = [{7: _lp(-1.0)}, {3: _lp(-1.0)}]
    with pytest.raises(ValueError, match="sampled token 2"):
        request_output_to_experiences(output, "", 0)


def test_prompt_logprobs_mapping():
    tokens = [1, 2, 3]
    values = prompt_logprobs_to_tensor([None, {2: _lp(-0.25), 9: _lp(-0.1)}, {3: _lp(-3.0)}], tokens)
    torch.testing.assert_close(values, torch.tensor([-0.25, -3.0]))
    with pytest.raises(ValueError, match="2 prompt logprobs for 3"):
        prompt_logprobs_to_tensor([None, {2: _lp(0.0)}], tokens)


def test_engine_kwargs_from_config():
    cfg = InferenceModelConfig(
        model_path="/m",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        extra_engine_args={"max_num_seqs": 8},
    )
    kw = engine_kwargs(cfg)
    assert kw["model"] == "/m" and kw["tensor_parallel_size"] == 2 and kw["gpu_memory_utilization"] == 0.5
    assert kw["distributed_executor_backend"] == "ray" and kw["max_num_seqs"] == 8
    assert set(kw) - {"max_num_seqs"} <= set(VLLM_API["AsyncEngineArgs"])


def test_importing_the_adapter_does_not_import_vllm():
    import sys

    assert "vllm" not in sys.modules


class _RecordingEngine:
    """Stands in for ``AsyncLLMEngine``: records collective_rpc and prefix-cache resets in order."""

    def __init__(self):
        self.calls: list[str] = []

    async def collective_rpc(self, method, args=()):
        self.calls.append(method)
        return []

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True


@pytest.mark.parametrize(
    ("method", "args", "rpc"),
    [
        ("update_weights", ([("w", torch.zeros(1))],), "trinity_load_weights"),
        ("load_checkpoint", ("/ckpt",), "trinity_load_checkpoint"),
        ("receive_weights", ([], 3), "trinity_receive_weights"),
    ],
)
def test_every_weight_change_resets_the_prefix_cache_afterwards(method, args, rpc):
    import asyncio

    from trinity.explorer.engines.vllm_engine import VLLMEngineActor

    actor = object.__new__(VLLMEngineActor)  # no vLLM here: skip __init__, give it a recording engine
    actor.engine = _RecordingEngine()
    asyncio.run(getattr(actor, method)(*args))
    # KV blocks cached under the old weights must not serve the new model version.
    assert actor.engine.calls == [rpc, "reset_prefix_cache"]
    assert "reset_prefix_cache" in VLLM_API["AsyncLLMEngine"]
