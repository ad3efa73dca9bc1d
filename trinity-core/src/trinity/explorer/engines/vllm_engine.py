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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.explorer.engines.base import FINISH_LENGTH, FINISH_STOP, RolloutEngine, SamplingArgs

if TYPE_CHECKING:
    import torch

    from trinity.config import InferenceModelConfig
    from trinity.experience import Experience
    from trinity.sync.broadcast import WeightReceiver
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
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "dtype",
        "seed",
        "max_model_len",
        "enforce_eager",
        "enable_prefix_caching",
        "trust_remote_code",
        "distributed_executor_backend",
        "worker_extension_cls",
        "logprobs_mode",
    ],
    "AsyncLLMEngine": ["from_engine_args", "generate", "collective_rpc", "reset_prefix_cache", "shutdown"],
    # Attributes of the GPU worker that WeightUpdateExtension (mixed into it) reads.
    "Worker": ["rank", "device", "model_runner"],
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
    """Mixed into vLLM's GPU workers (``worker_extension_cls``): in-place weight loading.

    The ``trinity_*_weight_group`` / ``trinity_receive_weights`` methods make each worker a rank
    of the trainer's weight-sync group (``sync_method: nccl``; rank = the engine's offset + the
    worker's ``rank``) through a :class:`~trinity.sync.broadcast.WeightReceiver`. They use only ``self.rank``, ``self.device`` and
    ``self.model_runner.model.load_weights`` of the worker; vLLM itself cannot run without a GPU,
    so they are tested with a stand-in ``model_runner`` and the names are checked by
    ``nox -s vllm_api``.
    """

    #: Bytes of received tensors given to ``load_weights`` at once.
    trinity_load_batch_bytes = 256 << 20

    def trinity_load_weights(self, named_tensors: list[tuple[str, Any]]) -> None:
        self.model_runner.model.load_weights(weights=named_tensors)  # type: ignore[attr-defined]

    def trinity_load_checkpoint(self, path: str) -> None:
        import glob
        import os

        from safetensors.torch import load_file

        for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            self.model_runner.model.load_weights(weights=load_file(file).items())  # type: ignore[attr-defined]

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
        self.trinity_weight_receiver.receive(
            metas, version, self.trinity_load_weights, batch_bytes=self.trinity_load_batch_bytes
        )

    def trinity_close_weight_group(self) -> None:
        self.trinity_weight_receiver.close()


class VLLMEngineActor:
    """Holds one ``AsyncLLMEngine`` (run as a Ray actor; methods return plain Python)."""

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        import vllm

        engine_kwargs = {"worker_extension_cls": f"{__name__}.WeightUpdateExtension", **engine_kwargs}
        self.engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**engine_kwargs))
        self._ids = itertools.count()

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

    async def update_weights(self, named_tensors: list[tuple[str, Any]]) -> None:
        await self.engine.collective_rpc("trinity_load_weights", args=(named_tensors,))
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
        self.engine.shutdown()


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

        ray.get(self.actor.update_weights.remote([(k, v.cpu()) for k, v in state_dict.items()]))
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


def engine_kwargs(config: InferenceModelConfig) -> dict[str, Any]:
    """``vllm.AsyncEngineArgs`` keyword arguments for an ``InferenceModelConfig``."""
    return {
        "model": config.model_path,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "dtype": config.dtype,
        "seed": config.seed,
        "max_model_len": config.max_model_len,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": config.enable_prefix_caching,
        "trust_remote_code": config.trust_remote_code,
        "distributed_executor_backend": "ray" if config.tensor_parallel_size > 1 else "uni",
        "logprobs_mode": "processed_logprobs",
        **config.extra_engine_args,
    }


def create_vllm_engines(config: InferenceModelConfig, default_args: SamplingArgs) -> list[VLLMEngine]:
    """``engine_num`` vLLM actors, each on a placement group of ``tensor_parallel_size`` GPUs."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model_path, trust_remote_code=config.trust_remote_code)
    tp = config.tensor_parallel_size
    actor_cls = ray.remote(VLLMEngineActor)
    engines = []
    for _ in range(config.engine_num):
        group = placement_group([{"GPU": 1, "CPU": 1}] * tp, strategy="STRICT_PACK")
        ray.get(group.ready())
        actor = actor_cls.options(
            # With tp == 1 the actor itself drives the GPU; with tp > 1 vLLM starts Ray workers
            # inside the group (captured child tasks), so the actor takes no GPU of its own.
            num_gpus=1 if tp == 1 else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group,
                placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True,
            ),
        ).remote(engine_kwargs(config))
        engines.append(
            VLLMEngine(
                actor,
                tokenizer,
                chat_template=config.chat_template,
                enable_thinking=config.enable_thinking,
                max_prompt_tokens=config.max_prompt_tokens,
                default_args=default_args,
            )
        )
        # ModelWrapper.seed_calls mixes the engine's seed into per-task request seeds.
        engines[-1].seed = config.seed
    return engines
