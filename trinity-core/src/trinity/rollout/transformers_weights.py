"""Weight loading of the ``transformers`` engine (see :mod:`.transformers_engine`): a state dict
in memory (:meth:`WeightLoading.update_weights`), a broadcast from the trainer
(``sync_method: nccl``) or a checkpoint folder, each copied into the model's tensors on the
engine's compute thread under its lock. A sync may carry LoRA adapters instead of weights
(``<module>.lora_A.weight`` / ``.lora_B.weight``): they are folded into the base weights of the
model's folder (:mod:`trinity.sync.lora_weights`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.sync.broadcast import WeightReceiver, parse_metas
from trinity.sync.group import describe_device
from trinity.sync.lora_weights import AdapterMerger, is_adapter_name, split_adapter_weights

if TYPE_CHECKING:
    import threading

    import torch

    from trinity.sync.group import GroupSpec
else:
    torch = lazy_import("torch")


class WeightLoading:
    """The weight side of :class:`~.transformers_engine.TransformersEngine` (it sets
    ``_weight_receiver`` and provides ``model``, ``device``, ``dtype``, ``_lock`` and
    ``_on_compute_thread``)."""

    model: Any
    device: str
    dtype: Any
    _lock: threading.Lock
    _model_version: int
    _weight_receiver: WeightReceiver
    _on_compute_thread: Callable[..., Any]
    _adapter_merger: AdapterMerger | None = None

    def _merge_adapters(self, adapters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full weights of the adapted modules: base (from the model's folder) + B @ A."""
        if self._adapter_merger is None:
            self._adapter_merger = AdapterMerger(self.model.name_or_path, self.dtype)
        return self._adapter_merger.merge(adapters, self.device)

    def _named_targets(self) -> dict[str, torch.Tensor]:
        own = dict(self.model.named_parameters(remove_duplicate=False))  # tied weights keep both names
        own.update(dict(self.model.named_buffers(remove_duplicate=False)))
        return own

    @staticmethod
    def _check_names(own: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        """Why weights with these names and shapes cannot be loaded, or ``None``."""
        unknown = sorted(set(shapes) - set(own))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            return (
                f"{len(unknown)} name(s) not in the rollout model: {shown} "
                f"(expected names like {next(iter(own))!r})"
            )
        for name, shape in shapes.items():
            if tuple(own[name].shape) != tuple(shape):
                return f"{name} has shape {tuple(shape)}, the model expects {tuple(own[name].shape)}"
        return None

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        state_dict, adapters = split_adapter_weights(state_dict)
        if adapters:
            state_dict.update(self._on_compute_thread(self._merge_adapters, adapters))
        own = self._named_targets()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise KeyError(
                f"update_weights: {len(unknown)} name(s) not in the rollout model: {shown} "
                f"(expected names like {next(iter(own))!r})"
            )
        for name, value in state_dict.items():
            if own[name].shape != value.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(value.shape)}, the model expects {tuple(own[name].shape)}"
                )

        with self._lock:
            self._on_compute_thread(self._copy_weights, own, list(state_dict.items()))
            self._model_version = version

    # -- broadcast weight sync (sync_method nccl) -------------------------------------------

    def weight_sync_devices(self) -> list[str]:
        """One rank, on this engine's device."""
        return [describe_device(self.device)]

    def init_weight_group(self, spec: GroupSpec, rank_offset: int) -> None:
        self._weight_receiver.join(spec, rank_offset, self.device)

    @torch.no_grad()
    def receive_weights(self, metas: list[Any], version: int) -> None:
        """Receive a broadcast into the model's parameters (names as in its ``state_dict``)."""
        metas = parse_metas(metas)
        own = self._named_targets()
        shapes = {name: m.shape for m in metas for name in m.names if not is_adapter_name(name)}
        problem = self._check_names(own, shapes)
        adapters: dict[str, torch.Tensor] = {}

        def load(batch: list[tuple[str, torch.Tensor]]) -> None:
            # Adapter halves are small: kept until all have arrived, then merged.
            adapters.update((name, value.clone()) for name, value in batch if is_adapter_name(name))
            plain = [(name, value) for name, value in batch if not is_adapter_name(name)]
            self._on_compute_thread(self._copy_weights, own, plain)

        with self._lock:
            self._weight_receiver.receive(metas, version, load, problem=problem)
            if adapters:
                merged = self._on_compute_thread(self._merge_adapters, adapters)
                self._on_compute_thread(self._copy_weights, own, list(merged.items()))
            self._model_version = version

    @staticmethod
    @torch.no_grad()
    def _copy_weights(own: Mapping[str, torch.Tensor], batch: list[tuple[str, torch.Tensor]]) -> None:
        """Copies each ``(name, value)`` of ``batch`` into the model's tensor of that name (on
        the compute thread: grad mode is per thread)."""
        for name, value in batch:
            target = own[name]
            target.copy_(value.to(device=target.device, dtype=target.dtype))

    def close_weight_group(self) -> None:
        self._weight_receiver.close()

    def load_checkpoint(self, path: str | Path, version: int) -> None:
        from trinity.multimodal import auto_model_class

        model_class = auto_model_class(path)  # AutoModelForImageTextToText for a Qwen2-VL
        loaded = self._on_compute_thread(lambda: model_class.from_pretrained(path, dtype=self.dtype))
        self.update_weights(loaded.state_dict(), version)
