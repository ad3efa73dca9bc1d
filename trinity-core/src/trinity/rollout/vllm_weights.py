"""Weight loading of the ``vllm`` engine: :class:`WeightUpdateExtension`, which vLLM mixes into
its workers (``worker_extension_cls``), and the shared-memory safetensors file that carries a
state dict to them (``memory`` sync). Imports no vLLM."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.sync.broadcast import WeightReceiver


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
    :func:`refresh_tied_head`).
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
        refresh_tied_head(self.model_runner.model)  # type: ignore[attr-defined]

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


def refresh_tied_head(model: Any) -> None:
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


def shared_memory_dir() -> str:
    """A fresh folder in ``/dev/shm`` (RAM-backed where it exists), else in the temp dir."""
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="trinity-vllm-weights-", dir=base)


def save_safetensors(named_tensors: Iterable[tuple[str, Any]], folder: str) -> str:
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
