"""Runs under a checkpoint root: where they are, their status, and their TensorBoard scalars.

A run is a job folder ``<root>/<project>/[<group>/]<name>`` (a stage of a multi-stage job is
``<name>/<stage>``) holding what the launcher writes: ``log/`` (actor logs),
``monitor/tensorboard/<role>/`` (event files), ``global_step_N/`` checkpoints, ``buffer/``.

The launcher also writes the resolved config a run started with (``config.yaml``;
``config.explore.yaml`` / ``config.serve.yaml`` for the explore / serve job of a decoupled pair):
the Runs page shows it, the Experiences page decodes tokens with its model's tokenizer, and it
says why a run has no browsable experiences. A run "has data" once it has a checkpoint or a
logged metric; a failed start without any is greyed on the page and never ticked by default.

A run's status is what the launcher recorded in ``run_status.json`` (:mod:`trinity.run_status`;
a ``running`` run whose process is gone is ``failed``). Runs from before that file existed get
theirs from their files: ``running`` while a log or event file changed in the last
:data:`RUNNING_WINDOW_S` seconds, else ``failed`` when an actor log ends in a traceback or an
``ERROR`` line, else ``finished``.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from trinity.run_status import read_run_status

RUNNING_WINDOW_S = 120.0
MAX_DEPTH = 4  # project / group / name / stage
_MARKERS = ("log", "monitor", "latest_checkpointed_iteration.txt", "run_status.json")
_FAILED = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|\bJobFailed\b")
_LOG_TAIL_BYTES = 32_768


@dataclass
class RunInfo:
    """One run as the Runs page lists it."""

    id: str  # path below the root, with "/"
    path: str
    status: str  # running | finished | failed | unknown
    status_reason: str
    updated: float
    roles: list[str] = field(default_factory=list)
    checkpoints: int = 0
    buffers: list[str] = field(default_factory=list)
    config_files: list[str] = field(default_factory=list)  # names in the run folder
    has_data: bool = False  # a checkpoint or a logged metric
    buffer_note: str = ""  # why there is no experience buffer to browse, when there is none

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_runs(root: str, launched: dict[str, str] | None = None) -> list[RunInfo]:
    """Every run folder below ``root``, newest first. ``launched`` maps job folders the studio
    started to their known status (``running`` / ``finished`` / ``failed``)."""
    launched = {os.path.abspath(k): v for k, v in (launched or {}).items()}
    root = os.path.abspath(root)
    runs = []
    for path in _run_dirs(root):
        runs.append(describe_run(root, path, launched.get(path)))
    runs.sort(key=lambda r: r.updated, reverse=True)
    return runs


def _run_dirs(root: str) -> list[str]:
    found = []

    def walk(folder: str, depth: int) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        names = {e.name for e in entries}
        if depth > 0 and any(m in names for m in _MARKERS):
            found.append(folder)
        if depth >= MAX_DEPTH:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and not _skip(entry.name):
                walk(entry.path, depth + 1)

    walk(root, 0)
    return found


def _skip(name: str) -> bool:
    return (
        name.startswith(".")
        or name.startswith("global_step_")
        or name in ("log", "monitor", "buffer", "__pycache__")
    )


def describe_run(root: str, path: str, known_status: str | None = None) -> RunInfo:
    """A :class:`RunInfo` for the run folder ``path``."""
    watched = _watched_files(path)
    updated = max((_mtime(f) for f in watched), default=_mtime(path))
    tb = os.path.join(path, "monitor", "tensorboard")
    roles = sorted(d for d in _listdir(tb) if os.path.isdir(os.path.join(tb, d)))
    checkpoints = sum(1 for d in _listdir(path) if d.startswith("global_step_"))
    buffers = sorted(
        glob.glob(os.path.join(path, "buffer", "*.db")) + glob.glob(os.path.join(path, "buffer", "*.jsonl"))
    )
    recorded = read_run_status(path)
    if known_status:
        status, reason = known_status, "started from the studio"
    elif recorded is not None:
        status = str(recorded.get("status"))
        reason = str(recorded.get("reason") or "recorded by the launcher")
        if status == "interrupted":
            status = "failed"
    else:
        status, reason = _infer_status(path, updated)
    configs = config_files(path)
    return RunInfo(
        id=os.path.relpath(path, root).replace(os.sep, "/"),
        path=path,
        status=status,
        status_reason=reason,
        updated=updated,
        roles=roles,
        checkpoints=checkpoints,
        buffers=buffers,
        config_files=configs,
        has_data=checkpoints > 0 or any(_has_records(f) for f in watched if "tfevents" in f),
        buffer_note="" if buffers else _buffer_note(path, configs),
    )


CONFIG_FILES = ("config.yaml", "config.explore.yaml", "config.serve.yaml")


def config_files(path: str) -> list[str]:
    """The names of the resolved configs the launcher saved in the run folder ``path``."""
    return [name for name in CONFIG_FILES if os.path.isfile(os.path.join(path, name))]


_CONFIGS: dict[str, tuple[float, dict[str, Any] | None]] = {}


def run_config(path: str) -> dict[str, Any] | None:
    """The run's saved config (the first of :func:`config_files`) as a mapping; ``None`` when
    there is none or it does not parse. Cached by modification time."""
    import yaml

    names = config_files(path)
    if not names:
        return None
    file = os.path.join(path, names[0])
    mtime = _mtime(file)
    hit = _CONFIGS.get(file)
    if hit and hit[0] == mtime:
        return hit[1]
    try:
        with open(file, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        data = None
    data = data if isinstance(data, dict) else None
    _CONFIGS[file] = (mtime, data)
    return data


def run_tokenizer(path: str) -> str | None:
    """The tokenizer of the run in ``path``: its saved config's experience-buffer tokenizer,
    else its model (``model.model_path``)."""
    config = run_config(path) or {}
    buffer = ((config.get("buffer") or {}).get("trainer_input") or {}).get("experience_buffer") or {}
    model = config.get("model") or {}
    found = buffer.get("tokenizer_path") or model.get("tokenizer_path") or model.get("model_path")
    return str(found) if found else None


def _buffer_note(path: str, configs: list[str]) -> str:
    """Why the run folder holds no experience buffer the Experiences page can open."""
    config = run_config(path)
    if config is None:
        return "no experience buffer in the run folder" + ("" if configs else " (and no saved config)")
    buffer = ((config.get("buffer") or {}).get("trainer_input") or {}).get("experience_buffer") or {}
    kind, where = buffer.get("storage_type"), buffer.get("path")
    schema = buffer.get("schema_type")
    if config.get("mode") == "train" and schema in ("sft", "dpo", "cpt") and kind == "file":
        return f"an {schema.upper()} stage: it trains on the dataset {where}, not on experiences"
    if kind == "queue" and not where:
        return (
            "the queue buffer kept its experiences in memory only; give it a path "
            "(buffer.trainer_input.experience_buffer.path: sqlite:///...) to keep them"
        )
    if where:
        return f"the experiences are in {where}"
    return "no experience buffer in the run folder"


def _has_records(file: str) -> bool:
    """Whether a TensorBoard event file holds more than its header record (a logged value).
    A record is ``length (u64) · crc (u32) · data · crc (u32)``."""
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            (length,) = struct.unpack("<Q", head)
            return os.path.getsize(file) > 8 + 4 + length + 4
    except OSError:
        return False


def _infer_status(path: str, updated: float) -> tuple[str, str]:
    if time.time() - updated < RUNNING_WINDOW_S:
        return "running", f"files changed in the last {int(RUNNING_WINDOW_S)} s"
    for log in sorted(glob.glob(os.path.join(path, "log", "*.log"))):
        tail = _tail(log)
        if _FAILED.search(tail):
            return "failed", f"{os.path.basename(log)} reports an error"
    if not _watched_files(path):
        return "unknown", "no logs or monitor files yet"
    return "finished", "no recent writes and no error in the logs"


def _watched_files(path: str) -> list[str]:
    files = glob.glob(os.path.join(path, "log", "*.log"))
    files += glob.glob(os.path.join(path, "monitor", "tensorboard", "*", "events.out.tfevents.*"))
    return files


def _tail(file: str) -> str:
    try:
        with open(file, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class ScalarCache:
    """``read_scalars`` per run and role, re-read only when an event file changed."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple, dict[str, list[tuple[int, float]]]]] = {}
        self._lock = threading.Lock()

    def scalars(self, run_path: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """``{role: {tag: [(step, value)]}}`` of the run at ``run_path``."""
        tb = os.path.join(run_path, "monitor", "tensorboard")
        out = {}
        for role in sorted(_listdir(tb)):
            folder = os.path.join(tb, role)
            if os.path.isdir(folder):
                out[role] = self._role(folder)
        return out

    def _role(self, folder: str) -> dict[str, list[tuple[int, float]]]:
        from trinity.monitor.tensorboard import read_scalars

        files = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
        key = tuple((f, _mtime(f), os.path.getsize(f)) for f in files if os.path.exists(f))
        with self._lock:
            hit = self._cache.get(folder)
            if hit and hit[0] == key:
                return hit[1]
        try:
            data = read_scalars(folder)
        except Exception:  # a file being written may end in a partial record: show what is read
            data = {}
        with self._lock:
            self._cache[folder] = (key, data)
        return data
