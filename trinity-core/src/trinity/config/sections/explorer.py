"""The ``explorer`` section: rollout engines, auxiliary models and workflow runners."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from trinity.config.sections.base import F, Section, check_choice, derived, lower_alias
from trinity.config.sections.model import ExternalModelConfig

EngineType = Literal["auto", "vllm", "vllm_async", "transformers"]
# What vLLM and the transformers engine accept (`half` = float16, `float` = float32).
ENGINE_DTYPES: tuple[str, ...] = (
    "auto",
    "bfloat16",
    "float16",
    "float32",
    "bf16",
    "fp16",
    "fp32",
    "half",
    "float",
)
MAX_PORT = 65535
# The parsers of the built-in OpenAI API (trinity.serving.openai_api.tool_parsers / .reasoning;
# a test keeps these lists equal to theirs).
TOOL_CALL_PARSERS: tuple[str, ...] = ("hermes", "llama3_json")
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3")


def _parser_choice(value: Any, choices: tuple[str, ...]) -> Any:
    try:
        return check_choice(value, choices)
    except ValueError as exc:
        raise ValueError(f"{exc} (the parsers of the built-in OpenAI API server)") from None


class InferenceModelConfig(Section):
    """An inference engine group: the rollout model or an auxiliary model (e.g. a judge)."""

    model_path: str | None = F(
        None, "Model to serve; for the rollout model it is set from `model.model_path`."
    )
    name: str | None = F(None, "Name workflows use to find an auxiliary model.")
    trust_remote_code: bool = F(False, "Allow custom modelling code shipped with the model.")
    engine_type: EngineType = F(
        "auto",
        "`vllm` (GPU), `transformers` (anywhere) or `auto` (vllm when installed and a GPU is visible).",
    )
    engine_num: int = F(1, "Number of engines.", ge=1)
    tensor_parallel_size: int = F(1, "Tensor-parallel degree of each engine.", ge=1)
    data_parallel_size: int = F(1, "Data-parallel degree of each engine.", ge=1)
    pipeline_parallel_size: int = F(1, "Pipeline-parallel degree of each engine.", ge=1)
    enable_expert_parallel: bool = F(
        False, "Expert parallelism for MoE models (vLLM). Has no effect in this version."
    )
    gpu_per_engine: int = derived(0, "tensor * data * pipeline parallel size.")
    extra_engine_args: dict[str, Any] = F({}, "Extra keyword arguments for the engine constructor.")
    use_v1: bool = F(True, "Use the vLLM V1 engine. Has no effect in this version.")
    enforce_eager: bool = F(
        False,
        "Disable CUDA graphs and torch.compile (vLLM; on vLLM's CPU backend true unless set); with "
        "the transformers engine, decode with transformers' own forward rather than the engine's "
        "lean decoding step (Llama, Qwen2).",
    )
    enable_prefix_caching: bool = F(True, "Prefix caching (vLLM).")
    enable_chunked_prefill: bool = F(
        True, "Chunked prefill (vLLM on GPU; always off on vLLM's CPU backend, see docs/gpu.md)."
    )
    gpu_memory_utilization: float = F(
        0.9,
        "Fraction of GPU memory the engine may use (vLLM; on its CPU backend, of the machine's RAM, "
        "and unset there means a 1 GiB KV cache).",
        gt=0,
        le=1,
    )
    dtype: str = F("bfloat16", "Weight dtype of the engine (`bfloat16`, `float16`, `float32`, `auto`).")
    seed: int = F(42, "Engine seed.")
    temperature: float | None = derived(None, "Set from `model.temperature`.")
    top_p: float | None = derived(None, "Set from `model.top_p`.")
    top_k: int | None = derived(None, "Set from `model.top_k`.")
    logprobs: int | None = derived(None, "Set from `model.logprobs`.")
    max_model_len: int | None = F(
        None, "Longest sequence; for the rollout model defaults to `model.max_model_len`.", ge=1
    )
    max_prompt_tokens: int | None = F(None, "Longest prompt; defaults to `model.max_prompt_tokens`.", ge=1)
    max_response_tokens: int | None = F(
        None, "Longest response; defaults to `model.max_response_tokens`.", ge=1
    )
    min_response_tokens: int | None = F(
        None, "Shortest response; defaults to `model.min_response_tokens`.", ge=0
    )
    enable_prompt_truncation: bool | None = F(None, "Defaults to `model.enable_prompt_truncation`.")
    repetition_penalty: float | None = F(
        None, "Defaults to `model.repetition_penalty`. Has no effect in this version.", gt=0
    )
    ignore_eos: bool = F(
        False, "Keep generating past EOS (for benchmarks only). Has no effect in this version."
    )
    enable_multimodal: bool = F(False, "Accept images / videos in prompts. Has no effect in this version.")
    chat_template: str | None = F(None, "Chat template overriding the model's.")
    enable_thinking: bool | None = F(None, "Turn thinking on or off in chat templates that support it.")
    enable_history: bool = F(
        False, "Record every call's experiences in the model wrapper (extract them regularly)."
    )
    enable_openai_api: bool = F(
        False,
        "Start an OpenAI-compatible API (on 127.0.0.1, one per workflow runner) with the engines; "
        "without it a runner's API starts when its workflow first asks for `get_openai_client()` "
        "or `base_url`.",
    )
    enable_log_requests: bool = F(
        False, "Log one line per OpenAI API request (logger `trinity.serving.openai_api`, level INFO)."
    )
    base_port: int | None = F(
        None,
        "First port of the OpenAI API servers (runner k listens on base_port + k); unset or 0: free ports.",
        ge=0,
        le=MAX_PORT,
    )
    api_key: str = F("EMPTY", "API key the OpenAI API servers require as a Bearer token (`EMPTY`: none).")
    model_aliases: list[str] = F(
        [],
        "Model ids the OpenAI API answers to besides the model's name and `model_path` (e.g. `[any]`; "
        "`*`: any id). Other ids get a 404, as from OpenAI and vLLM.",
    )
    enable_auto_tool_choice: bool = F(
        False,
        "Serve `tool_choice: auto` (the default of requests with `tools`) on the OpenAI API; "
        "needs `tool_call_parser`.",
    )
    tool_call_parser: str | None = F(
        None,
        "How the OpenAI API reads tool calls in replies: `hermes` (`<tool_call>` JSON blocks, "
        "Qwen / Hermes templates) or `llama3_json`; unset: requests with tools are refused.",
    )
    reasoning_parser: str | None = F(
        None,
        "How the OpenAI API splits `<think>` reasoning off replies into `reasoning_content`: "
        "`qwen3` or `deepseek_r1` (the template opens `<think>`); unset: none.",
    )
    external_model_config: ExternalModelConfig = F(
        default_factory=ExternalModelConfig,
        doc="External OpenAI-compatible model. Has no effect in this version.",
    )
    weight_sync_buffer_size: int = F(
        1024, "Buffer size (MB) of batched NCCL weight sync. Has no effect in this version.", ge=1
    )
    enable_return_routed_experts: bool = F(
        False, "Return MoE routing decisions with each rollout. Has no effect in this version."
    )
    enable_lora: bool = derived(
        False,
        "Set from `model.lora_configs`: the rollout engine serves the trained LoRA adapter (vLLM: its "
        "LoRA support; transformers: folded into the weights).",
    )
    lora_kwargs: dict[str, Any] = derived(
        {},
        "vLLM's LoRA engine arguments, set from `model.lora_configs` (`max_lora_rank`: the adapter's rank "
        "rounded up to a rank vLLM accepts; `max_loras`: 1) and `model.max_cpu_loras` / "
        "`model.fully_sharded_loras`; keys given here win.",
    )
    rope_scaling: dict[str, Any] | None = derived(
        None, "Set from `model.rope_scaling`. Has no effect in this version."
    )
    rope_theta: float | None = derived(None, "Set from `model.rope_theta`. Has no effect in this version.")

    @field_validator("engine_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, value: Any) -> Any:
        return check_choice(value, ENGINE_DTYPES)

    @field_validator("tool_call_parser", mode="before")
    @classmethod
    def _tool_call_parser(cls, value: Any) -> Any:
        return _parser_choice(value, TOOL_CALL_PARSERS)

    @field_validator("reasoning_parser", mode="before")
    @classmethod
    def _reasoning_parser(cls, value: Any) -> Any:
        return _parser_choice(value, REASONING_PARSERS)

    @model_validator(mode="after")
    def _auto_tool_choice_needs_a_parser(self) -> InferenceModelConfig:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(
                f"enable_auto_tool_choice needs a tool_call_parser (one of: {', '.join(TOOL_CALL_PARSERS)})"
            )
        return self


class OverRolloutConfig(Section):
    """End an explore step before every task is done (long-tail control), as Trinity-RFT.

    Needs a dynamic ``synchronizer.sync_style`` (not ``fixed``). Tasks still unfinished when the
    step ends are dropped (cancelled, not carried into the next step) and counted as
    ``rollout/over_rollout/dropped_tasks`` / ``partial_tasks``; with ``partial_rollout`` the
    started ones are carried into the next step instead and resume under the weights loaded by
    then (AReaL's partial rollouts), each token keeping the model version it was sampled with.
    """

    ratio: float = F(
        0.0,
        "Fraction of a batch's tasks the explorer may leave unfinished: a step goes on once "
        "ceil((1 - ratio) * batch_size) tasks finished; 0 waits for all.",
        ge=0,
        lt=1,
    )
    wait_after_min: float = F(
        30.0, "Seconds to wait for the remaining tasks once that many finished, before dropping them.", ge=0
    )
    return_partial_tasks: bool = F(
        False,
        "Keep the completed runs of a task that is dropped, or whose attempt failed after some runs "
        "completed (instead of retrying it).",
    )
    partial_rollout: bool = F(
        False,
        "Partial rollouts (AReaL's): a task still running when the step ends is not dropped but "
        "carried into the next step; the engines stop its samples at that sync point and go on from "
        "their tokens with the new weights (transformers engine). Needs ratio > 0.",
    )
    max_staleness: int = F(
        1,
        "Partial rollouts: most model versions a carried task may lag behind the weights it would "
        "resume under (AReaL's max_head_offpolicyness, Trinity-RFT's staleness_control "
        "max_staleness); an older one is dropped and counted (rollout/partial_rollout/stale_dropped_tasks).",
        ge=0,
    )


class DynamicTimeoutConfig(Section):
    """Per-task timeout derived from observed task durations, as Trinity-RFT."""

    enable: bool = F(False, "Turn dynamic timeouts on.")
    warmup_min_steps: int = F(
        1, "Batches of succeeded tasks (warmup_min_steps * batch_size tasks) before the timeout adapts.", ge=0
    )
    ratio: float = F(
        3.0,
        "Timeout = min(max_timeout, ratio * mean seconds of the training tasks that succeeded so far).",
        gt=0,
    )


class ExplorerConfig(Section):
    """The explorer: runs workflows against the rollout model and writes experiences."""

    name: str = F("explorer", "Ray actor name of the explorer (unique).")
    runner_per_model: int = F(8, "Parallel workflow runners per rollout engine.", ge=1)
    runner_prepare_concurrency: int = F(
        128, "Most runners preparing at once. Has no effect in this version.", ge=1
    )
    runner_prepare_max_retries: int = F(
        3, "Retries of a runner that crashes while preparing. Has no effect in this version.", ge=0
    )
    max_timeout: int = F(1800, "Seconds a task may run.", ge=1)
    max_retry_times: int = F(2, "Retries of a task that fails or times out.", ge=0)
    max_consecutive_failed_steps: int = F(
        3,
        "Stop the job (exit 1) when this many explore steps in a row end with no experience "
        "(every task failed, timed out or gave none); 0 never stops.",
        ge=0,
    )
    env_vars: dict[str, str] = F({}, "Environment variables set in every workflow runner.")
    concurrent_mode: Literal["sequential", "asynchronous", "multi-threading"] = F(
        "sequential", "How a runner runs the repeats of one task. Has no effect in this version."
    )
    max_repeat_times_per_runner: int | None = F(
        None,
        "Split a task's repeats over runners in chunks of this size. Has no effect in this version.",
        ge=1,
    )
    runner_num: int | None = F(
        None, "Deprecated; use `runner_per_model`. Has no effect in this version.", ge=1
    )
    rollout_model: InferenceModelConfig = F(default_factory=InferenceModelConfig, doc="The rollout engines.")
    auxiliary_models: list[InferenceModelConfig] = F(
        [], "Extra models for workflows (judges, reward models)."
    )
    eval_interval: int = F(100, "Evaluate every this many steps.", ge=1)
    eval_on_startup: bool = F(True, "Evaluate the initial model at step 0.")
    bench_on_latest_checkpoint: bool = F(False, "In `bench` mode evaluate only the latest checkpoint.")
    proxy_port: int = F(
        8010,
        "`serve` mode: port of the OpenAI API with its feedback routes (0: any free port).",
        ge=0,
        le=MAX_PORT,
    )
    listen_address: str = F(
        "127.0.0.1",
        "`serve` mode: address the API listens on. 127.0.0.1 (this machine only) unless set; "
        "Trinity-RFT listens on 0.0.0.0 (every interface): set that to serve other machines "
        "(the API's only protection is `rollout_model.api_key`).",
    )
    service_status_check_interval: int = F(
        60,
        "`serve` mode: seconds between looks for a newer checkpoint of the train job (loaded "
        "without dropping requests) and closing of idle conversations.",
        ge=1,
    )
    min_running_model_num: int = F(
        1, "Engines kept running in serve mode. Has no effect in this version.", ge=0
    )
    db_url: str | None = F(
        None, "Database of the serve-mode history recorder. Has no effect in this version."
    )
    over_rollout: OverRolloutConfig = F(
        default_factory=OverRolloutConfig,
        doc="Long-tail control: end explore steps early; drop or (partial_rollout) carry the rest.",
    )
    dynamic_timeout: DynamicTimeoutConfig = F(
        default_factory=DynamicTimeoutConfig, doc="Dynamic timeout. Has no effect in this version."
    )
    runner_state_report_interval: int = F(
        0, "Seconds between runner state reports; 0 disables them. Has no effect in this version.", ge=0
    )
    max_inflight_batches: int = F(
        2, "Explore batches in flight at once. Has no effect in this version.", ge=1
    )
