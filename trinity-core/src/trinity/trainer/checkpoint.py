"""Trainer checkpoints on disk.

Layout of a job directory (``config.job_dir``)::

    <job_dir>/latest_checkpointed_iteration.txt     the newest complete step, e.g. "20"
    <job_dir>/global_step_20/                        Hugging Face model + tokenizer
        config.json, model.safetensors, tokenizer files ...
        trainer_state.pt                             step, optimizer, scheduler, RNG, extra state
        critic/                                      the critic (PPO), Hugging Face format

With LoRA (``model.lora_configs``) the model files are replaced by ``adapter/`` (the trained
adapter, PEFT's format: what resume reads) and ``huggingface/`` (the merged full model and the
tokenizer: what checkpoint sync, ``trinity convert`` and ``from_pretrained`` read; see
:func:`hf_weights_dir`).

A checkpoint is written to ``global_step_N.tmp`` and renamed when complete, and the
``latest`` file is replaced atomically afterwards, so a run killed while saving never leaves a
half-written checkpoint that resume would pick up.
"""

from __future__ import annotations

import datetime
import os
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
CRITIC_DIR = "critic"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def checkpoint_dir(job_dir: str | os.PathLike, step: int) -> str:
    """``<job_dir>/global_step_<step>``."""
    return os.path.join(os.fspath(job_dir), f"global_step_{step}")


def list_checkpoints(job_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """Complete checkpoints (those with a trainer state file) as ``(step, path)``, oldest first."""
    job_dir = os.fspath(job_dir)
    if not os.path.isdir(job_dir):
        return []
    found = []
    for entry in os.listdir(job_dir):
        match = _STEP_DIR.match(entry)
        path = os.path.join(job_dir, entry)
        if match and os.path.isfile(os.path.join(path, STATE_FILE)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def hf_weights_dir(path: str | os.PathLike) -> Path:
    """The folder of a checkpoint that holds its Hugging Face weights: the checkpoint itself or
    its ``huggingface`` / ``actor/huggingface`` / ``actor`` subfolder (veRL's layouts)."""
    path = Path(path)
    for sub in ("", "huggingface", "actor/huggingface", "actor"):
        if (path / sub / "config.json").is_file():
            return path / sub
    return path


def find_latest_checkpoint(job_dir: str | os.PathLike) -> tuple[int, str] | None:
    """``(step, path)`` of the newest complete checkpoint in ``job_dir``, or ``None``.

    ``latest_checkpointed_iteration.txt`` is trusted when the folder it names is complete;
    otherwise (file missing, or edited by hand) the newest complete ``global_step_N`` wins.
    """
    job_dir = os.fspath(job_dir)
    latest = os.path.join(job_dir, LATEST_FILE)
    if os.path.isfile(latest):
        with open(latest) as f:
            text = f.read().strip()
        if text.isdigit():
            step = int(text)
            path = checkpoint_dir(job_dir, step)
            if os.path.isfile(os.path.join(path, STATE_FILE)):
                return step, path
    found = list_checkpoints(job_dir)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) RNG states."""
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    job_dir: str | os.PathLike,
    step: int,
    *,
    model: Any,
    state: dict[str, Any],
    tokenizer: Any = None,
    critic: Any = None,
    max_to_keep: int | None = None,
    lora: bool = False,
) -> str:
    """Write ``<job_dir>/global_step_<step>/`` and mark it as the latest; returns its path.

    ``model`` (and ``critic``) are saved with ``save_pretrained``; ``state`` (optimizer,
    scheduler, step, ...) goes to ``trainer_state.pt`` with the RNG states added. With
    ``max_to_keep`` (> 0), older checkpoints beyond that count are deleted afterwards.
    ``lora``: ``model`` is a PEFT LoRA model, saved as ``adapter/`` plus a merged ``huggingface/``.
    """
    import torch

    job_dir = os.fspath(job_dir)
    final = checkpoint_dir(job_dir, step)
    tmp = f"{final}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if lora:
        from trinity.trainer.lora import save_adapter_and_export

        save_adapter_and_export(model, tmp, tokenizer)
    else:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    if critic is not None:
        critic.save_pretrained(os.path.join(tmp, CRITIC_DIR))
    torch.save({**state, "global_step": step, "rng": rng_state()}, os.path.join(tmp, STATE_FILE))
    if os.path.exists(final):  # saving the same step again (e.g. final save after an interval save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(os.path.join(job_dir, LATEST_FILE), str(step))
    if max_to_keep:
        prune_checkpoints(job_dir, max_to_keep)
    return final


def load_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
    """The ``trainer_state.pt`` of checkpoint folder ``path``.

    Loaded with ``weights_only=False``: the file holds optimizer and RNG state written by this
    trainer, so only load checkpoints you trust.
    """
    import torch

    file = os.path.join(os.fspath(path), STATE_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} does not exist; {path} is not a complete trainer checkpoint")
    return torch.load(file, map_location="cpu", weights_only=False)


def prune_checkpoints(job_dir: str | os.PathLike, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints; returns the deleted paths."""
    if keep <= 0:
        return []
    old = list_checkpoints(job_dir)[:-keep]
    for _, path in old:
        shutil.rmtree(path, ignore_errors=True)
    return [p for _, p in old]


def timestamped_name(
    name: str,
    job_dir: str | os.PathLike,
    continue_from_checkpoint: bool,
    now: datetime.datetime | None = None,
) -> str:
    """Trinity-RFT's rule for a fresh run in a used folder.

    With ``continue_from_checkpoint: false`` and an existing ``job_dir``, the run is renamed to
    ``<name>_<YYYYmmddHHMMSS>`` so it never overwrites (or resumes) the earlier run; otherwise
    ``name`` is returned unchanged.
    """
    if continue_from_checkpoint or not os.path.exists(os.fspath(job_dir)):
        return name
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d%H%M%S")
    return f"{name}_{stamp}"


def apply_continue_rule(config: Config, now: datetime.datetime | None = None) -> Config:
    """``config``, renamed by :func:`timestamped_name` if needed and then resolved anew, so every
    value derived from the job folder (checkpoints, monitor, logs, buffer cache, Ray namespaces,
    the storages' namespaces too) follows the new name. Returns ``config`` itself when nothing
    changes, else a new config.
    """
    from trinity.config.resolve import resolve_with

    if config.mode == "bench":
        return config  # bench evaluates the run in this folder; a new name would find nothing
    new_name = timestamped_name(config.name, config.job_dir, config.continue_from_checkpoint, now)
    if new_name == config.name:
        return config
    return resolve_with(config, {"name": new_name})


__all__ = [
    "CRITIC_DIR",
    "LATEST_FILE",
    "STATE_FILE",
    "apply_continue_rule",
    "checkpoint_dir",
    "find_latest_checkpoint",
    "list_checkpoints",
    "load_trainer_state",
    "prune_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "timestamped_name",
]
