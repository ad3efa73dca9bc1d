"""The vLLM adapter's request/response mapping, CPU defaults and start-failure reporting, on
objects shaped like vLLM's (no vLLM here; the real engine runs in
``test_vllm_engine_real.py``, ``nox -s vllm``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trinity.config import InferenceModelConfig
from trinity.rollout.base import SamplingArgs
from trinity.rollout.vllm_engine import (
    VLLM_API,
    prompt_logprobs_to_tensor,
    request_output_to_experiences,
    sampling_params_kwargs,
)
from trinity.rollout.vllm_start import CPU_KV_CACHE_BYTES, OutputTail, engine_kwargs, start_failure_line


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
    assert "rollout_args" not in a.info  # nothing said, nothing recorded
    applied = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "logprobs_renormalised": True}
    for exp in request_output_to_experiences(output, "prompt", 3, applied):
        assert exp.info["rollout_args"] == applied  # for the trainer's log-prob guard


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


def test_cpu_defaults_apply_only_where_the_config_is_silent(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kw = engine_kwargs(InferenceModelConfig(model_path="/m"), on_cpu=True)
    assert kw["enforce_eager"] is True and kw["enable_chunked_prefill"] is False
    assert "gpu_memory_utilization" not in kw and kw["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert kw["distributed_executor_backend"] == "uni"
    assert set(kw) <= set(VLLM_API["AsyncEngineArgs"])

    chosen = InferenceModelConfig(
        model_path="/m", enforce_eager=False, gpu_memory_utilization=0.3, tensor_parallel_size=2
    )
    kw = engine_kwargs(chosen, on_cpu=True)
    assert kw["enforce_eager"] is False and kw["gpu_memory_utilization"] == 0.3
    assert "kv_cache_memory_bytes" not in kw and kw["distributed_executor_backend"] == "mp"
    # extra_engine_args wins over every default
    extra = InferenceModelConfig(model_path="/m", extra_engine_args={"kv_cache_memory_bytes": 5})
    assert engine_kwargs(extra, on_cpu=True)["kv_cache_memory_bytes"] == 5
    # vLLM's own variable for the CPU KV cache is left to vLLM
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert "kv_cache_memory_bytes" not in engine_kwargs(InferenceModelConfig(model_path="/m"), on_cpu=True)
    # on GPU nothing changes
    assert engine_kwargs(InferenceModelConfig(model_path="/m"))["enable_chunked_prefill"] is True


def test_chunked_prefill_asked_for_on_cpu_is_refused_with_a_warning(caplog):
    cfg = InferenceModelConfig(model_path="/m", enable_chunked_prefill=True)
    with caplog.at_level("WARNING", logger="trinity.rollout.vllm_start"):
        assert engine_kwargs(cfg, on_cpu=True)["enable_chunked_prefill"] is False
    assert "CPU Generator" not in caplog.text  # says why in the user's words
    assert "seeded requests" in caplog.text


def _tail(*lines):
    tail = object.__new__(OutputTail)  # no descriptors replaced: only the parsing is tested
    tail.lines = list(lines)
    return tail


def test_start_failure_names_the_first_real_error_printed():
    tail = _tail(
        "(EngineCore pid=7) INFO 11-27 [core.py:99] loading",
        "(EngineCore pid=7) ERROR 11-27 [core.py:1750] Traceback (most recent call last):",
        "(EngineCore pid=7) ERROR 11-27 [core.py:1750] ValueError: Available memory on node 0 "
        "(9.1/10.7 GiB) on kv cache allocation is less than requested memory for kv (9000.0 GiB).",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    )
    assert tail.root_cause() == (
        "ValueError: Available memory on node 0 (9.1/10.7 GiB) on kv cache allocation is less than "
        "requested memory for kv (9000.0 GiB)."
    )
    assert (
        _tail("RuntimeError: Engine core initialization failed. See root cause above.").root_cause() is None
    )


def test_start_failure_line_is_one_line_from_a_ray_error():
    nested = RuntimeError(
        "The actor died because of an error raised in its creation task\n  File x\n"
        "RuntimeError: vLLM engine failed to start: ValueError: head_dim 16 is not supported"
    )
    assert (
        start_failure_line(nested) == "vLLM engine failed to start: ValueError: head_dim 16 is not supported"
    )
    assert start_failure_line(RuntimeError("first\nlast line")) == "vLLM engine failed to start: last line"


class _Method:
    def __init__(self):
        self.processed = []

    def process_weights_after_loading(self, layer):
        self.processed.append(layer)


def _model(tied: bool):
    embed = torch.nn.Embedding(4, 2)
    head = torch.nn.Linear(2, 4, bias=False)
    if tied:
        head.weight = embed.weight
    head.quant_method = _Method()
    return torch.nn.ModuleDict({"model": torch.nn.ModuleDict({"embed_tokens": embed}), "lm_head": head})


def test_a_tied_head_is_processed_again_after_a_reload():
    from trinity.rollout.vllm_weights import refresh_tied_head

    tied = SimpleNamespace(**dict(_model(tied=True).named_children()))
    tied.model = SimpleNamespace(embed_tokens=tied.model["embed_tokens"])
    refresh_tied_head(tied)
    assert tied.lm_head.quant_method.processed == [tied.lm_head]
    untied = SimpleNamespace(**dict(_model(tied=False).named_children()))
    untied.model = SimpleNamespace(embed_tokens=untied.model["embed_tokens"])
    refresh_tied_head(untied)  # its own checkpoint key reloads it
    assert untied.lm_head.quant_method.processed == []


def test_shared_memory_file_holds_tied_tensors_once(tmp_path):
    from safetensors.torch import load_file

    from trinity.rollout.vllm_weights import save_safetensors

    embed = torch.randn(4, 2)
    path = save_safetensors([("embed", embed), ("head", embed), ("w", torch.ones(3))], str(tmp_path))
    loaded = load_file(path)
    assert set(loaded) == {"embed", "w"} and torch.equal(loaded["embed"], embed)


def test_importing_the_adapter_does_not_import_vllm():
    import subprocess
    import sys

    # A fresh interpreter: in `nox -s vllm` another test module imports vLLM at collection.
    code = "import sys, trinity.rollout.vllm_engine; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


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
        ("update_weights", ({"w": (torch.zeros(1).numpy(), "float32")},), "trinity_load_file"),
        ("load_checkpoint", ("/ckpt",), "trinity_load_checkpoint"),
        ("receive_weights", ([], 3), "trinity_receive_weights"),
    ],
)
def test_every_weight_change_resets_the_prefix_cache_afterwards(method, args, rpc):
    import asyncio

    from trinity.rollout.vllm_engine import VLLMEngineActor

    actor = object.__new__(VLLMEngineActor)  # no vLLM here: skip __init__, give it a recording engine
    actor.engine = _RecordingEngine()
    asyncio.run(getattr(actor, method)(*args))
    # KV blocks cached under the old weights must not serve the new model version.
    assert actor.engine.calls == [rpc, "reset_prefix_cache"]
    assert "reset_prefix_cache" in VLLM_API["AsyncLLMEngine"]
