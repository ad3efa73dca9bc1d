"""A CPU platform for veRL: its FSDP workers on CPU with gloo, where no accelerator exists.

veRL (0.9) asks a *platform* object (``verl.plugin.platform``) for everything device-specific:
the device name tensors go to, the ``torch.<device>`` module it calls (``empty_cache``,
``set_device``, ``get_rng_state``, ...), the collective backend and the Ray resource name. It
ships CUDA, NPU and ROCm platforms and, where none is available, falls back to CUDA — NCCL
process groups and ``torch.cuda`` calls that fail on a machine without a GPU. veRL's registry is
its documented extension point (``PlatformRegistry.register``, ``VERL_PLATFORM``), so this module
adds a ``trinity_cpu`` platform there. The four places where veRL 0.9 bypasses its platform are
adjusted in each CPU worker process at start-up (:func:`prepare_cpu_worker`), never in veRL's
files; ``.ci/check_verl_api.py`` checks that each of them is still what this module expects.

How it is chosen:

* here, on import: registered *after* veRL's own platforms, and auto-detection asks them first,
  so on a machine with a GPU (or an NPU) veRL's platform wins and this one is never used;
  :meth:`CpuPlatform.is_platform_available` is only true where torch sees no accelerator;
* in veRL's Ray workers: :func:`worker_env` names this module in ``VERL_USE_EXTERNAL_MODULES``
  (which ``import verl`` imports before anything asks for the platform) and sets
  ``VERL_PLATFORM``, so a worker the driver placed without GPUs runs on CPU whatever its host has.

Importing this module imports veRL; only :mod:`trinity.trainer.verl.trainer` and
:mod:`trinity.trainer.verl.workers` do.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

#: The name this platform has in veRL's registry (the value of ``VERL_PLATFORM``).
PLATFORM_NAME = "trinity_cpu"

_MODULE = __name__


def _memory_bytes() -> tuple[int, int]:
    """(available, total) bytes of this machine's memory, for veRL's ``mem_get_info`` logging."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # psutil comes with Ray; without it the numbers are only for logs
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, pages * size


class _CpuDeviceModule(ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` functions veRL calls on its device module.

    veRL calls the device module like ``torch.cuda``; ``torch.cpu`` lacks the memory and RNG
    functions. Those have a CPU meaning here: nothing is cached (``empty_cache``), the RNG is
    torch's global one, and memory statistics are 0 (veRL only logs them).
    """

    def __init__(self) -> None:
        super().__init__(f"{_MODULE}.device")

    def __getattr__(self, name: str) -> Any:
        # Streams, events, synchronize, current_device, device_count: torch.cpu has them.
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        # "Is the accelerator usable?": veRL uses it to decide whether to read GPU memory stats
        # and whether to map loaded tensors to the device; on CPU neither applies.
        return False

    @staticmethod
    def set_device(device: Any) -> None:
        # veRL selects the local rank's device; a CPU process has one device, used by every rank.
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    ipc_collect = empty_cache
    reset_peak_memory_stats = empty_cache
    reset_accumulated_memory_stats = empty_cache

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _memory_bytes()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


_DEVICE_MODULE = _CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class CpuPlatform(PlatformBase):
    """veRL's platform interface on CPU: device ``cpu``, collectives over gloo, Ray ``CPU``."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection probes veRL's platforms first; this one answers only where torch has
        # no accelerator at all, so it never takes a GPU machine's place.
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            return not accelerator.is_available()
        return not torch.cuda.is_available()

    def current_device(self) -> str:  # type: ignore[override]
        # veRL passes this straight to ``.to(...)`` / ``device=``; an index would mean "accelerator
        # number 0". ``torch.cpu.current_device()`` answers "cpu" as well.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        # veRL turns on CUDA's expandable segments; CPU allocation has no such setting.
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # veRL reads and writes it when placing workers; on CPU it names no device.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Asked only for workers placed with use_gpu=True, which the CPU path never does.
        return {}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def prepare_cpu_worker() -> None:
    """Ready a veRL worker process for CPU before veRL builds anything in it (idempotent).

    Four things in veRL 0.9 stop it without an accelerator, each fixed where it starts:

    * its process group: veRL asks for ``"cpu:gloo,<device>:<backend>"``, which on CPU names
      the device twice (``cpu:gloo,cpu:gloo``) and torch refuses it. veRL initialises the group
      only when none exists, so this initialises it first, with gloo alone, from the same
      ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` veRL's worker group sets;
    * the reference model's offload: every ``forward_only`` engine gets
      ``CPUOffloadPolicy(pin_memory=True)``. Pinned memory is page-locked host memory for fast
      copies *to a GPU*, and torch refuses to allocate it where there is none; on CPU the offload
      moves nothing, so the policy is built unpinned;
    * its engine registry: the FSDP engines (language model, value model) are registered for
      ``cuda`` and ``npu`` only, though they reach the device only through the platform. They are
      registered for ``cpu`` too, with veRL's own ``EngineRegistry.register``;
    * the critic's value model: veRL loads it with ``attn_implementation="flash_attention_2"``
      written into the call (the actor's comes from ``override_config``), which needs the
      flash-attn package and a GPU. The value model is loaded with the attention the critic's
      config asks for (SDPA on CPU, :data:`trinity.trainer.verl.config.CPU_SETTINGS`).

    Called from ``TrinityActorWorker.__init__``: the actor comes first in the colocated worker, so
    this runs before the reference model's and the critic's workers start and before any model
    is built (``init_model`` is a later call).
    """
    import torch.distributed as dist
    from verl.utils import model as verl_model
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(engine)
    if not getattr(verl_model.load_valuehead_model, "_trinity_cpu", False):
        verl_model.load_valuehead_model = _value_model_loader(verl_model.load_valuehead_model)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="gloo",
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )
    policy = transformer_impl.CPUOffloadPolicy
    if policy is None or getattr(policy, "_trinity_unpinned", False):
        return

    class UnpinnedCPUOffloadPolicy(policy):
        _trinity_unpinned = True

        def __init__(self, pin_memory: bool = False, **kwargs: Any) -> None:
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _value_model_loader(verl_loader: Any) -> Any:
    """veRL's ``load_valuehead_model`` with the attention implementation of the model's config."""

    def load_valuehead_model(
        local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool
    ) -> Any:
        from transformers import AutoModelForTokenClassification

        attn = getattr(model_config, "_attn_implementation", None) or "sdpa"
        try:
            return AutoModelForTokenClassification.from_pretrained(
                local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation=attn,
                trust_remote_code=trust_remote_code,
            )
        except (ValueError, OSError):
            # No token-classification head for this architecture: veRL's own fallback (TRL's value head).
            return verl_loader(local_path, torch_dtype, model_config, trust_remote_code)

    load_valuehead_model._trinity_cpu = True  # type: ignore[attr-defined]
    return load_valuehead_model


def worker_env() -> dict[str, str]:
    """Environment for veRL's Ray workers placed without GPUs: import this module when veRL is
    imported there, and use its platform (veRL resolves the platform once per process)."""
    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if _MODULE not in modules:
        modules.append(_MODULE)
    return {"VERL_USE_EXTERNAL_MODULES": ",".join(modules), "VERL_PLATFORM": PLATFORM_NAME}


__all__ = ["PLATFORM_NAME", "CpuPlatform", "prepare_cpu_worker", "worker_env"]
