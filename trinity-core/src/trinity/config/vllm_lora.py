"""vLLM's LoRA engine arguments, derived from ``model.lora_configs`` at config resolution."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config.sections.model import ModelConfig

# The ranks vLLM's max_lora_rank accepts (vllm.config.lora.MaxLoRARanks, 0.11 to 0.32; 0.32 also takes 1).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_kwargs(m: ModelConfig) -> dict[str, Any]:
    """vLLM's LoRA engine arguments for the adapter of ``model.lora_configs`` (as Trinity-RFT
    derives them): one adapter slot, ``max_lora_rank`` the adapter's rank rounded up to a rank
    vLLM accepts, and the model section's ``max_cpu_loras`` / ``fully_sharded_loras``."""
    rank = max(cfg.lora_rank for cfg in m.lora_configs)
    kwargs: dict[str, Any] = {
        "max_loras": len(m.lora_configs),
        "max_lora_rank": next((r for r in VLLM_LORA_RANKS if r >= rank), rank),
    }
    if m.max_cpu_loras is not None:
        kwargs["max_cpu_loras"] = m.max_cpu_loras
    if m.fully_sharded_loras:
        kwargs["fully_sharded_loras"] = True
    return kwargs
