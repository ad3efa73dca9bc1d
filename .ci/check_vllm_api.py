"""Check that every vLLM name the ``vllm`` rollout engine uses exists in the installed vLLM.

Run by ``nox -s vllm_api`` (vLLM installed in its own environment; nothing is started, no GPU
needed). The names live in ``trinity.rollout.vllm_engine.VLLM_API``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import sys
import typing

import vllm
from vllm import outputs, sampling_params
from vllm.lora.request import LoRARequest
from vllm.v1.worker.gpu_worker import Worker

from trinity.rollout.vllm_engine import VLLM_API

try:
    from vllm.logprobs import Logprob
except ImportError:  # vLLM < 0.11 kept it in vllm.sequence
    from vllm.sequence import Logprob

CLASSES = {
    "SamplingParams": vllm.SamplingParams,
    "AsyncEngineArgs": vllm.AsyncEngineArgs,
    "AsyncLLMEngine": vllm.AsyncLLMEngine,
    "RequestOutput": outputs.RequestOutput,
    "CompletionOutput": outputs.CompletionOutput,
    "Logprob": Logprob,
    "LoRARequest": LoRARequest,
    "Worker": Worker,
}


def names_of(cls: type) -> set[str]:
    """Constructor parameters, dataclass / msgspec fields and attributes of ``cls``."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    names |= set(getattr(cls, "__struct_fields__", ()))  # msgspec.Struct (SamplingParams)
    names |= set(getattr(cls, "__annotations__", {}))
    with contextlib.suppress(TypeError, ValueError):  # some classes have no signature
        names |= set(inspect.signature(cls).parameters)
    # Instance attributes (``self.rank = ...``) set in any ``__init__`` of the class hierarchy.
    for base in inspect.getmro(cls):
        init = base.__dict__.get("__init__")
        with contextlib.suppress(TypeError, OSError):
            names |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=(?!=)", inspect.getsource(init)))
    return names


def logprobs_modes() -> list[str]:
    """The values ``AsyncEngineArgs.logprobs_mode`` accepts (a ``Literal``), or [] if unknown.

    Only this one annotation is resolved: resolving every hint of the class fails on forward
    references to names vLLM imports only for type checking.
    """
    if not dataclasses.is_dataclass(vllm.AsyncEngineArgs):
        return []
    field = {f.name: f for f in dataclasses.fields(vllm.AsyncEngineArgs)}.get("logprobs_mode")
    if field is None:
        return []
    annotation = field.type
    if isinstance(annotation, str):
        with contextlib.suppress(Exception):
            annotation = eval(annotation, vars(sys.modules[vllm.AsyncEngineArgs.__module__]))
    return [a for m in typing.get_args(annotation) for a in (typing.get_args(m) or [m])]


def main() -> int:
    missing = []
    for cls_name, wanted in VLLM_API.items():
        available = names_of(CLASSES[cls_name])
        missing += [f"{cls_name}.{n}" for n in wanted if n not in available]
    if not hasattr(sampling_params.RequestOutputKind, "FINAL_ONLY"):
        missing.append("sampling_params.RequestOutputKind.FINAL_ONLY")
    literal = logprobs_modes()
    if literal and "processed_logprobs" not in literal:
        missing.append(f"AsyncEngineArgs.logprobs_mode='processed_logprobs' (choices: {literal})")
    print(f"vLLM {vllm.__version__}: checked {sum(map(len, VLLM_API.values()))} names")
    if missing:
        print("missing in this vLLM release:\n  " + "\n  ".join(missing))
        return 1
    print("all present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
