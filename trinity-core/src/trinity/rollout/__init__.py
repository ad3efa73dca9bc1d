"""Rollout engines; see :mod:`trinity.rollout.base` for the interface.

:func:`create_engines` builds the ``engine_num`` engines of one ``InferenceModelConfig``
(the rollout model or an auxiliary model). Engines are imported only when used, so the core
never needs vLLM.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from trinity.rollout.base import RolloutEngine, SamplingArgs

if TYPE_CHECKING:
    from trinity.config import InferenceModelConfig

__all__ = ["RolloutEngine", "SamplingArgs", "create_engines", "default_sampling_args", "resolve_engine_type"]

DEFAULT_MAX_TOKENS = 1024


def resolve_engine_type(engine_type: str) -> str:
    """``auto`` is ``vllm`` when vLLM is installed and a GPU is visible, else ``transformers``;
    ``vllm_async`` is an alias of ``vllm``."""
    if engine_type == "vllm_async":
        return "vllm"
    if engine_type != "auto":
        return engine_type
    if importlib.util.find_spec("vllm") is not None:
        import torch

        if torch.cuda.is_available():
            return "vllm"
    return "transformers"


def default_sampling_args(config: InferenceModelConfig) -> SamplingArgs:
    """Engine-wide defaults from the model section (tasksets' ``rollout_args`` override them)."""
    return SamplingArgs().updated(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_tokens=config.max_response_tokens or DEFAULT_MAX_TOKENS,
        min_tokens=config.min_response_tokens or None,
    )


def create_engines(config: InferenceModelConfig, **engine_kwargs: Any) -> list[RolloutEngine]:
    """``config.engine_num`` engines serving ``config.model_path``."""
    if not config.model_path:
        raise ValueError("explorer model has no model_path: set model.model_path (or the auxiliary model's)")
    kind = resolve_engine_type(config.engine_type)
    if kind == "transformers":
        from trinity.rollout.transformers_engine import TransformersEngine

        return [
            TransformersEngine(
                config.model_path,
                dtype=config.dtype,
                seed=config.seed + i,
                chat_template=config.chat_template,
                enable_thinking=config.enable_thinking,
                max_prompt_tokens=config.max_prompt_tokens,
                max_model_len=config.max_model_len,
                enable_prompt_truncation=config.enable_prompt_truncation is not False,
                default_args=default_sampling_args(config),
                trust_remote_code=config.trust_remote_code,
                lean_decoding=not config.enforce_eager,
                **engine_kwargs,
            )
            for i in range(config.engine_num)
        ]
    if kind == "vllm":
        from trinity.rollout.vllm_engine import create_vllm_engines

        return create_vllm_engines(config, default_sampling_args(config), **engine_kwargs)
    raise ValueError(f"unknown engine_type {config.engine_type!r}; use auto, vllm or transformers")
