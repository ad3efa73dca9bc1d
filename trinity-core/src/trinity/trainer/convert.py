"""``trinity convert``: a veRL FSDP checkpoint to a Hugging Face model folder.

veRL's FSDP checkpoint manager writes, per role (``global_step_N/actor``, ``.../critic``)::

    model_world_size_<W>_rank_<r>.pt    each rank's sharded state dict (r = 0 .. W-1)
    optim_..., extra_state_...           optimizer, scheduler, RNG (not needed here)
    fsdp_config.json                     {"FSDP_version": 1 | 2, "world_size": W}
    huggingface/                         config.json, tokenizer files (and generation config)

Each shard holds DTensors (FSDP with a device mesh, or FSDP2) whose ``placements`` say how
the full tensor was split over the mesh (``Shard(dim)`` or ``Replicate``), or plain tensors,
which FSDP splits along dim 0. Merging concatenates the pieces in rank order, builds the model
from ``huggingface/config.json``, loads the merged weights and saves them as safetensors with
the tokenizer files.

This project's native trainer already saves Hugging Face folders (see
:func:`trinity.trainer.checkpoint.hf_weights_dir`); such a checkpoint is copied, not converted.

Shard files are pickles (DTensors cannot be loaded with ``weights_only=True``): convert only
checkpoints you trust, as with veRL's own loader. torch and transformers are imported only
when a conversion runs, so ``trinity --help`` stays light.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import torch

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
_WEIGHT_FILE = re.compile(r"(\.safetensors|\.bin|\.pt|\.safetensors\.index\.json|\.bin\.index\.json)$")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class ConvertError(Exception):
    """A checkpoint that cannot be converted; the message is one line for people."""


@dataclass
class ShardedCheckpoint:
    """Where a veRL FSDP checkpoint's pieces are."""

    shard_dir: Path
    world_size: int
    hf_dir: Path

    def shard_path(self, rank: int) -> Path:
        return self.shard_dir / f"model_world_size_{self.world_size}_rank_{rank}.pt"


def _shard_files(folder: Path) -> dict[int, dict[int, Path]]:
    """``{world_size: {rank: path}}`` of the model shards in ``folder``."""
    found: dict[int, dict[int, Path]] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = _SHARD.match(path.name)
            if match:
                found.setdefault(int(match.group(1)), {})[int(match.group(2))] = path
    return found


def _has_hf_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        p.suffix == ".safetensors" or (p.name.startswith("pytorch_model") and p.suffix == ".bin")
        for p in folder.iterdir()
    )


def locate_shards(path: str | Path) -> ShardedCheckpoint | Path:
    """The sharded checkpoint at ``path`` (``global_step_N``, its ``actor`` folder, or any folder
    holding ``model_world_size_*`` shards), or the Hugging Face folder if ``path`` already is
    one. Raises :class:`ConvertError` for a missing shard or a world-size mismatch."""
    from trinity.trainer.checkpoint import hf_weights_dir

    path = Path(path)
    if not path.exists():
        raise ConvertError(f"no checkpoint at {path}")
    if not path.is_dir():
        raise ConvertError(
            f"{path} is a file; give the checkpoint folder (global_step_N or its actor folder)"
        )
    for folder in (path, path / "actor"):
        shards = _shard_files(folder)
        if shards:
            return _check_shards(folder, shards)
    hf_dir = hf_weights_dir(path)
    if _has_hf_weights(hf_dir):
        return hf_dir
    raise ConvertError(
        f"{path} holds no veRL FSDP shards (model_world_size_<W>_rank_<r>.pt) and no Hugging Face "
        "weights; give a global_step_N folder or its actor folder"
    )


def _check_shards(folder: Path, shards: dict[int, dict[int, Path]]) -> ShardedCheckpoint:
    if len(shards) > 1:
        sizes = ", ".join(str(w) for w in sorted(shards))
        raise ConvertError(f"{folder} mixes shards of world sizes {sizes}; remove the stale ones")
    ((world_size, ranks),) = shards.items()
    config_file = folder / "fsdp_config.json"
    if config_file.is_file():
        try:
            recorded = int(json.loads(config_file.read_text())["world_size"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConvertError(f"{config_file} is unreadable: {exc!r}") from None
        if recorded != world_size:
            raise ConvertError(
                f"world-size mismatch: {config_file} says {recorded} but the shards are "
                f"model_world_size_{world_size}_rank_*.pt"
            )
    missing = [r for r in range(world_size) if r not in ranks]
    if missing:
        names = ", ".join(f"model_world_size_{world_size}_rank_{r}.pt" for r in missing)
        raise ConvertError(f"missing shard {names} in {folder} (world size {world_size})")
    for hf_dir in (folder / "huggingface", folder):
        if (hf_dir / "config.json").is_file():
            return ShardedCheckpoint(folder, world_size, hf_dir)
    raise ConvertError(
        f"no {folder / 'huggingface' / 'config.json'}: veRL saves the model config there and it is "
        "needed to build the model"
    )


def merge_shards(
    ckpt: ShardedCheckpoint, expected: dict[str, tuple[int, ...]] | None = None
) -> dict[str, torch.Tensor]:
    """The full state dict, merged from the ``world_size`` shard files.

    ``expected`` (key -> shape) settles plain tensors that every rank holds whole (replicated)
    rather than a dim-0 slice of.
    """
    import torch

    # Unpickling a DeviceMesh without a process group logs a torch.compile warning that does
    # not apply here.
    mesh_logger = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_logger.level
    mesh_logger.setLevel(logging.ERROR)
    try:
        shards = [_load_shard(ckpt.shard_path(r)) for r in range(ckpt.world_size)]
    finally:
        mesh_logger.setLevel(level)
    keys = list(shards[0])
    for rank, shard in enumerate(shards[1:], start=1):
        if set(shard) != set(keys):
            diff = sorted(set(keys) ^ set(shard))
            raise ConvertError(
                f"{ckpt.shard_path(rank).name} and rank 0 hold different weights "
                f"({', '.join(diff[:3])}{' ...' if len(diff) > 3 else ''})"
            )
    merged = {}
    for key in keys:
        pieces = [shard.pop(key) for shard in shards]
        if not isinstance(pieces[0], torch.Tensor):
            continue  # e.g. FSDP's extra state entries: not weights
        merged[key] = _merge_key(key, pieces, ckpt.world_size, (expected or {}).get(key))
    return merged


def _load_shard(path: Path) -> dict[str, Any]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        if "ShardedTensor" in str(exc):
            raise ConvertError(
                f"{path.name} holds ShardedTensors (FSDP1 without a device mesh), which load only in "
                "the process group that saved them; veRL's DTensor and plain-tensor shards are supported"
            ) from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConvertError(f"cannot read {path}: {reason}") from None
    if not isinstance(state, dict):
        raise ConvertError(f"{path} holds a {type(state).__name__}, not a state dict")
    return state


def _merge_key(
    key: str, pieces: list[Any], world_size: int, expected: tuple[int, ...] | None
) -> torch.Tensor:
    import torch

    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor, Replicate, Shard

    if isinstance(pieces[0], DTensor):
        mesh = pieces[0].device_mesh.mesh
        if mesh.numel() != world_size:
            raise ConvertError(
                f"world-size mismatch: {key} is sharded over {mesh.numel()} ranks but there are "
                f"{world_size} shard files"
            )
        placements = pieces[0].placements
        local = [p.to_local() for p in pieces]

        def build(sub: torch.Tensor, level: int) -> torch.Tensor:
            if sub.dim() == 0:
                return local[int(sub)]
            placement = placements[level]
            if type(placement) is Shard:
                return torch.cat([build(sub[i], level + 1) for i in range(sub.shape[0])], dim=placement.dim)
            if isinstance(placement, Replicate):
                return build(sub[0], level + 1)
            raise ConvertError(f"{key}: placement {placement} is not supported (only Shard and Replicate)")

        full = build(mesh, 0)
        if tuple(full.shape) != tuple(pieces[0].shape):
            raise ConvertError(
                f"{key}: merged shape {list(full.shape)} differs from its recorded {list(pieces[0].shape)}"
            )
        return full.contiguous()
    if pieces[0].dim() == 0 or (expected is not None and tuple(pieces[0].shape) == tuple(expected)):
        return pieces[0]  # every rank holds the whole tensor
    return torch.cat(pieces, dim=0)


def _model_class(config: Any) -> Any:
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


def _listing(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" (and {len(keys) - 3} more)" if len(keys) > 3 else "")


def convert_checkpoint(checkpoint: str | Path, output: str | Path, dtype: str = "auto") -> str:
    """Write the checkpoint at ``checkpoint`` as a Hugging Face model folder ``output``.

    ``dtype`` is ``auto`` (keep the checkpoint's) or a torch dtype name. Returns a one-line
    summary; raises :class:`ConvertError` with a one-line reason.
    """
    if dtype not in DTYPES:
        raise ConvertError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConvertError(f"output {output} already exists and is not empty; give a new folder")
    found = locate_shards(checkpoint)
    if isinstance(found, Path):
        return _copy_hf_folder(found, output)
    return _convert_sharded(found, output, dtype)


def _copy_hf_folder(hf_dir: Path, output: Path) -> str:
    from trinity.trainer.checkpoint import STATE_FILE

    output.mkdir(parents=True, exist_ok=True)
    for path in hf_dir.iterdir():
        if path.is_file() and path.name != STATE_FILE:
            shutil.copy2(path, output / path.name)
    return (
        f"{hf_dir} is already a Hugging Face model folder (from_pretrained loads it as is); "
        f"copied its files to {output}"
    )


def _convert_sharded(ckpt: ShardedCheckpoint, output: Path, dtype: str) -> str:
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ckpt.hf_dir)
    # On the meta device the model costs no memory or random init; real storage comes next.
    with torch.device("meta"):
        cls = _model_class(config)
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gives tied parameters separate storage
    params = model.state_dict(keep_vars=True)
    state = merge_shards(ckpt, {k: tuple(v.shape) for k, v in params.items()})

    config_file = ckpt.hf_dir / "config.json"
    unexpected = sorted(set(state) - set(params))
    if unexpected:
        raise ConvertError(
            f"the checkpoint has weights the model of {config_file} lacks: {_listing(unexpected)}"
        )
    loaded_ids = {id(params[k]) for k in state}
    missing = sorted(k for k in params if k not in state and id(params[k]) not in loaded_ids)
    if missing:
        raise ConvertError(
            f"the checkpoint lacks weights the model of {config_file} needs: {_listing(missing)}"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(params[key].shape):
            raise ConvertError(
                f"shape mismatch for {key}: {list(tensor.shape)} in the checkpoint but "
                f"{list(params[key].shape)} in {config_file}"
            )
    model.load_state_dict(state, strict=False)
    if dtype == "auto":
        floats = [t.dtype for t in state.values() if t.is_floating_point()]
        target = floats[0] if floats else torch.float32
    else:
        target = getattr(torch, dtype)
    model.to(target)

    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    # Tokenizer, chat template, generation config: copied as saved (config.json is the new one).
    for path in ckpt.hf_dir.iterdir():
        if path.is_file() and path.name != "config.json" and not _WEIGHT_FILE.search(path.name):
            shutil.copy2(path, output / path.name)
    return (
        f"merged {ckpt.world_size} shards of {ckpt.shard_dir} ({len(state)} tensors, "
        f"{str(target).removeprefix('torch.')}) into {output}"
    )


@click.command(name="convert")
@click.option(
    "--checkpoint",
    required=True,
    type=click.Path(),
    help="veRL FSDP checkpoint: global_step_N, its actor (or critic) folder.",
)
@click.option("--output", required=True, type=click.Path(), help="New folder for the Hugging Face model.")
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="auto",
    show_default=True,
    help="Weight dtype to save; auto keeps the checkpoint's.",
)
def convert_command(checkpoint: str, output: str, dtype: str) -> None:
    """Convert a veRL FSDP (sharded) checkpoint to a Hugging Face model folder.

    A checkpoint that already is a Hugging Face folder (the native trainer's) is copied.
    """
    try:
        message = convert_checkpoint(checkpoint, output, dtype)
    except ConvertError as exc:
        click.secho(f"Error: {exc}", fg="red", err=True)
        raise SystemExit(1) from None
    click.echo(message)
