"""Weight sync by NCCL broadcast (``synchronizer.sync_method: nccl``): GPU only, with vLLM.

Not implemented by the native stack: it needs CUDA devices on both sides and vLLM rollout
engines joined to a process group with the trainer. This module gives a clear error instead.
"""

from __future__ import annotations

from typing import Any


class NCCLUnavailableError(RuntimeError):
    """``sync_method: nccl`` was chosen where it cannot work."""


def check_nccl_available(engine_type: str | None = None) -> None:
    """Raise :class:`NCCLUnavailableError` unless CUDA and vLLM are present and the engine is vLLM."""
    import importlib.util

    import torch

    problems = []
    if not torch.cuda.is_available():
        problems.append("no CUDA device is visible")
    if importlib.util.find_spec("vllm") is None:
        problems.append("vLLM is not installed (pip install 'trinity-core[vllm]')")
    if engine_type is not None and engine_type != "vllm":
        problems.append(f"explorer.rollout_model.engine_type is {engine_type!r}, not 'vllm'")
    if problems:
        raise NCCLUnavailableError(
            "synchronizer.sync_method 'nccl' needs GPUs and vLLM engines, but "
            + "; ".join(problems)
            + ". Use sync_method 'memory' (same Ray job) or 'checkpoint' (separate processes)."
        )


class NCCLWeightSync:
    """Placeholder for the NCCL broadcast group; constructing it checks the requirements."""

    def __init__(self, *args: Any, engine_type: str | None = None, **kwargs: Any) -> None:
        check_nccl_available(engine_type)
        raise NCCLUnavailableError(
            "synchronizer.sync_method 'nccl' is not implemented by trinity-core yet; "
            "use sync_method 'memory' or 'checkpoint'"
        )


__all__ = ["NCCLUnavailableError", "NCCLWeightSync", "check_nccl_available"]
