"""The ``model`` section: the model being trained, its chat template and token limits."""

from __future__ import annotations

from typing import Any

from trinity.config.sections.base import F, Section, derived


class LoRAConfig(Section):
    """A LoRA adapter trained instead of the full weights (native trainer; see docs/algorithms.md, LoRA)."""

    name: str | None = F(None, "Adapter name.")
    path: str | None = F(None, "Path of existing adapter weights; empty trains a new adapter.")
    base_model_name: str | None = F(
        None, "Name of the base model the adapter belongs to. Has no effect in this version."
    )
    lora_rank: int = F(32, "LoRA rank.", ge=1)
    lora_alpha: int = F(32, "LoRA alpha.", gt=0)
    lora_dtype: str = F("auto", "Adapter dtype. Has no effect in this version.")
    target_modules: str = F(
        "all-linear",
        "Modules that get adapters: all-linear, a name or regular expression, or a comma-separated list.",
    )
    exclude_modules: str | None = F(None, "Modules that never get adapters (same forms as `target_modules`).")
    is_dummy: bool = derived(
        False, "Set automatically for a freshly initialised adapter. Has no effect in this version."
    )


class TinkerConfig(Section):
    """Training through the Tinker service (Trinity-RFT compatibility; not implemented here)."""

    enable: bool = F(False, "Use Tinker.")
    rank: int = F(16, "LoRA rank used by Tinker.", ge=1)
    seed: int | None = F(None, "Seed used by Tinker.")
    train_mlp: bool = F(True, "Train MLP layers.")
    train_attn: bool = F(True, "Train attention layers.")
    train_unembed: bool = F(True, "Train the unembedding layer.")
    base_url: str | None = F(None, "Tinker service URL.")


class ExternalModelConfig(Section):
    """An OpenAI-compatible API used as the rollout model."""

    enable: bool = F(False, "Use an external API instead of a local engine.")
    base_url_env: str = F("OPENAI_BASE_URL", "Environment variable holding the API base URL.")
    api_key_env: str = F("OPENAI_API_KEY", "Environment variable holding the API key.")
    model_name: str | None = F(None, "Model name sent to the API.")


class ModelConfig(Section):
    """The model being trained and the default generation settings of every taskset.

    Token limits follow Trinity-RFT's rules. `max_model_len` unset is `max_prompt_tokens +
    max_response_tokens` (both needed); with `max_model_len` set, a missing per-part limit is what
    the other leaves (half each when both are missing). Every engine (transformers, vLLM) holds
    them: no sequence runs past `max_model_len` (a response is cut where the prompt leaves no more
    room); a workflow's prompt over `max_prompt_tokens` is not sampled but answered with
    placeholders masked out of training (`enable_prompt_truncation`, the default; false: sampled
    while it fits `max_model_len`), and a prompt that leaves no room is an error. Workflows read the
    limits from the model wrapper (`max_model_len`, `max_prompt_tokens`, `max_response_tokens`).
    The OpenAI API applies only `max_model_len`, as vLLM does: a longer prompt, or a `max_tokens`
    past what the prompt leaves, gets a 400 (`context_length_exceeded`). The explorer's rollout
    model and auxiliary models inherit these limits unless they set their own. An auxiliary model
    whose own prompt and response limits add up to more than its `max_model_len` loads with a
    warning (Trinity-RFT checks only the trained model's): its replies stop at `max_model_len`.
    """

    model_path: str = F("", "Hugging Face id or local path of the model to train (required).")
    critic_model_path: str = F("", "Path of the critic model; defaults to `model_path`.")
    trust_remote_code: bool = F(False, "Allow custom modelling code shipped with the model.")
    custom_chat_template: str | None = F(None, "Chat template (Jinja) overriding the tokenizer's.")
    chat_template_path: str | None = F(
        None, "File holding a chat template; overrides `custom_chat_template`. Has no effect in this version."
    )
    temperature: float = F(1.0, "Default sampling temperature (a taskset's `rollout_args` wins).", ge=0)
    top_p: float = F(1.0, "Default nucleus-sampling probability.", gt=0, le=1)
    top_k: int = F(-1, "Default top-k; -1 disables it.", ge=-1)
    logprobs: int = F(0, "Number of top logprobs returned per token (0: only the chosen token).", ge=0)
    max_model_len: int | None = F(
        None,
        "Longest sequence (prompt + response), enforced by every engine and the OpenAI API; defaults to "
        "max_prompt_tokens + max_response_tokens.",
        ge=1,
    )
    max_prompt_tokens: int | None = F(
        None,
        "Longest prompt of a workflow's call; defaults to what max_model_len leaves (half when neither is set).",
        ge=1,
    )
    max_response_tokens: int | None = F(
        None, "Longest response (default max_tokens); defaults to what max_model_len leaves.", ge=1
    )
    min_response_tokens: int = F(
        0, "Shortest response in tokens (lowered to below max_response_tokens).", ge=0
    )
    enable_prompt_truncation: bool = F(
        True,
        "A workflow's prompt over `max_prompt_tokens` is not sampled: its experiences are placeholders masked "
        "out of training (false: it is sampled while it fits max_model_len).",
    )
    repetition_penalty: float = F(
        1.0, "Repetition penalty for generation. Has no effect in this version.", gt=0
    )
    enable_thinking: bool | None = F(None, "Turn thinking on or off in chat templates that support it.")
    lora_configs: list[LoRAConfig] | None = F(None, "LoRA adapters to train instead of full weights.")
    fully_sharded_loras: bool = F(
        False,
        "Shard LoRA weights across tensor-parallel ranks (vLLM serving the adapter; in its `lora_kwargs`).",
    )
    max_cpu_loras: int | None = F(
        None, "LoRA adapters kept in CPU memory (vLLM serving the adapter; in its `lora_kwargs`).", ge=1
    )
    rope_scaling: dict[str, Any] | None = F(
        None, "RoPE scaling override passed to the model config. Has no effect in this version."
    )
    rope_theta: float | None = F(
        None, "RoPE theta override passed to the model config. Has no effect in this version.", gt=0
    )
    tinker: TinkerConfig = F(
        default_factory=TinkerConfig, doc="Tinker service settings. Has no effect in this version."
    )
    external_model: ExternalModelConfig = F(
        default_factory=ExternalModelConfig,
        doc="External OpenAI-compatible model settings. Has no effect in this version.",
    )
