"""Building buffer readers and writers from configuration (what the explorer and trainer call).

    writer = get_buffer_writer(config.buffer.trainer_input.experience_buffer)   # explorer
    reader = get_buffer_reader(config.buffer.trainer_input.experience_buffer)   # trainer
    tasks = get_taskset_reader(config.buffer.explorer_input.tasksets, config.buffer)

Every object returned is picklable-free of open connections until first use, so it can be built
in one process and used in another (a Ray actor); SQL storage reconnects after a fork.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.buffer.base import BufferReader, BufferWriter
    from trinity.buffer.taskset import TasksetScheduler
    from trinity.config import BufferConfig, Config, ExperienceBufferConfig, TasksetConfig


def _sql_url(config: ExperienceBufferConfig, cache_dir: str | None) -> str:
    if config.path:
        return config.path
    if cache_dir:
        return f"sqlite:///{os.path.abspath(os.path.join(cache_dir, (config.name or 'experience') + '.db'))}"
    raise ValueError(
        f"experience buffer {config.name!r}: storage_type sql needs a path "
        "(e.g. path: sqlite:///buffer.db, or any SQLAlchemy URL)"
    )


def _is_db_url(path: str | None) -> bool:
    return bool(path) and "://" in str(path)


def _sql_storage(config: ExperienceBufferConfig, url: str) -> Any:
    """The buffer's SQL table, retrying transient errors as ``max_retry_times/interval`` say."""
    from trinity.buffer.sql import SQLStorage

    return SQLStorage(
        url,
        config.name or "experience",
        max_retry_times=config.max_retry_times,
        max_retry_interval=config.max_retry_interval,
    )


def _replay(config: ExperienceBufferConfig) -> dict[str, Any]:
    rb = config.replay_buffer
    enable = bool(config.use_priority_queue) or bool(rb and rb.enable)
    cooldown = config.reuse_cooldown_time if config.reuse_cooldown_time is not None else None
    if rb is not None and rb.reuse_cooldown_time is not None:
        cooldown = rb.reuse_cooldown_time
    return {
        "priority": enable,
        "priority_fn": rb.priority_fn if rb else None,
        "priority_fn_args": dict(rb.priority_fn_args) if rb else None,
        "reuse_cooldown_time": cooldown,
    }


def _queue_actor(config: ExperienceBufferConfig) -> Any:
    from trinity.buffer.queue import get_queue_actor

    path = config.path
    if path and not _is_db_url(path):
        raise ValueError(
            f"experience buffer {config.name!r}: a queue's path is its SQL backup and must be a "
            f"SQLAlchemy URL such as sqlite:///backup.db, got {path!r}"
        )
    return get_queue_actor(
        config.name or "experience",
        namespace=config.ray_namespace,
        capacity=config.capacity,
        mirror_url=path or None,
        **_replay(config),
    )


def get_buffer_writer(
    config: ExperienceBufferConfig, *, cache_dir: str | None = None, run: str | None = None
) -> BufferWriter:
    """A writer for an experience buffer, by ``storage_type`` (``sql``, ``queue``, ``file``).

    ``cache_dir`` supplies a default SQLite file for ``sql`` buffers without a ``path``;
    ``run`` (:func:`run_name`) prefixes the stored experience ids.
    """
    kind = config.storage_type
    name = config.name or "experience"
    if kind == "sql":
        from trinity.buffer.sql import SQLWriter

        return SQLWriter(_sql_storage(config, _sql_url(config, cache_dir)), run)
    if kind == "queue":
        from trinity.buffer.queue import QueueWriter

        return QueueWriter(_queue_actor(config), name, run)
    if kind == "file":
        from trinity.buffer.file import FileWriter

        if not config.path:
            raise ValueError(f"experience buffer {name!r}: storage_type file needs a path (file or folder)")
        return FileWriter(config.path, name)
    raise ValueError(f"experience buffer {name!r}: unknown storage_type {kind!r}; use queue, sql or file")


def run_name(config: Config) -> str | None:
    """The run a job's experiences belong to: its job folder under the checkpoint root
    (``<project>/<name>``, plus the stage), unique per run since a fresh run gets a new name.
    ``None`` for a config that was never resolved (no job folder)."""
    if not config.checkpoint_job_dir or not config.checkpoint_root_dir:
        return None
    return os.path.relpath(config.checkpoint_job_dir, config.checkpoint_root_dir)


def check_buffer_is_free(config: Config, cache_dir: str | None = None) -> None:
    """Refuse, with a one-line ``ValueError``, an experience buffer whose unread rows another
    run left: this run's trainer would train on them. Only SQL-backed buffers (``sql``, or a
    ``queue`` with an SQL ``path``) keep rows across runs."""
    exp = config.buffer.trainer_input.experience_buffer
    if exp is None or not (exp.storage_type == "sql" or (exp.storage_type == "queue" and exp.path)):
        return
    url = _sql_url(exp, cache_dir) if exp.storage_type == "sql" else str(exp.path)
    run = run_name(config)
    if run is None:
        return
    count, example = _sql_storage(exp, url).unread_of_other_runs(run)
    if count:
        earlier = example.split(":", 1)[0] if example and ":" in example else "an earlier run"
        raise ValueError(
            f"buffer.trainer_input.experience_buffer {exp.name!r} ({url}) holds {count} unread "
            f"experiences of another run ({earlier}); this run would train on them. Use another "
            "path or name for the buffer, or continue that run (continue_from_checkpoint: true)"
        )


def start_queue(config: Config) -> bool:
    """Create the job's ``queue`` experience buffer actor now, without waiting for it: its
    process then starts beside the explorer's and trainer's instead of after them (they find
    it by name). ``False`` when the buffer is no queue."""
    exp = config.buffer.trainer_input.experience_buffer
    if exp is None or exp.storage_type != "queue":
        return False
    _queue_actor(exp)
    return True


def join_queue(config: Config, job_id: str) -> bool:
    """Record that job ``job_id`` uses the job's ``queue`` experience buffer (creating its
    actor); ``False`` when the buffer is no queue. Call :func:`leave_queue` when the job ends."""
    import ray

    exp = config.buffer.trainer_input.experience_buffer
    if exp is None or exp.storage_type != "queue":
        return False
    ray.get(_queue_actor(exp).join_job.remote(job_id))
    return True


def leave_queue(config: Config, job_id: str) -> str | None:
    """Job ``job_id`` no longer uses the queue. The queue actor is detached, so it outlives the
    job that created it (the other side of a decoupled pair may still need it); the last job to
    leave removes it, unless it holds unread experiences that only it keeps (no SQL ``path``).
    Returns a line saying what happened to the queue (``None``: nothing worth saying)."""
    import ray

    from trinity.buffer.queue import kill_queue_actor, queue_actor_name

    exp = config.buffer.trainer_input.experience_buffer
    if exp is None or exp.storage_type != "queue":
        return None
    name = exp.name or "experience"
    try:
        actor = ray.get_actor(queue_actor_name(name), namespace=exp.ray_namespace)
    except ValueError:
        return None  # already gone
    left = ray.get(actor.leave_job.remote(job_id))
    if left["jobs"]:
        return f"queue {name!r} stays on the cluster for the {left['jobs']} other job(s) using it"
    if left["size"] and not left["mirrored"]:
        return (
            f"queue {name!r} stays on the cluster with {left['size']} unread experiences that only it "
            f"holds (no path); the next job of this project/name reads them, or remove it with "
            f"ray.kill(ray.get_actor({queue_actor_name(name)!r}, namespace={exp.ray_namespace!r}))"
        )
    kill_queue_actor(name, exp.ray_namespace)
    return None


def release_reads_after(config: Config, position: dict[str, Any]) -> int:
    """Make the rows the trainer's reader read after ``position`` (its ``state_dict()``)
    unread again; returns how many. Only ``sql`` and ``queue`` buffers track their readers."""
    exp = config.buffer.trainer_input.experience_buffer
    if exp is None or exp.storage_type not in ("sql", "queue"):
        return 0
    reader = get_buffer_reader(exp, cache_dir=config.buffer.cache_dir)
    reader.load_state_dict(position)
    return int(reader.released or 0)


def get_buffer_reader(
    config: ExperienceBufferConfig, *, tokenizer: Any = None, cache_dir: str | None = None
) -> BufferReader:
    """A reader for an experience buffer or an SFT/DPO dataset.

    ``schema_type`` ``sft``/``dpo``/``cpt`` with ``file`` storage gives an
    :class:`~trinity.buffer.sft.SFTDatasetReader` (``tokenizer``, or one loaded from
    ``tokenizer_path``); otherwise the reader of the ``storage_type``. SQL buffers read FIFO,
    or highest priority first when ``replay_buffer.enable`` is set.
    """
    kind = config.storage_type
    name = config.name or "experience"
    if config.schema_type in ("sft", "dpo", "cpt") and kind == "file":
        from trinity.buffer.sft import SFTDatasetReader

        return SFTDatasetReader(config, tokenizer)
    if kind == "sql":
        from trinity.buffer.sql import SQLReader

        order = "priority" if _replay(config)["priority"] else "fifo"
        return SQLReader(
            _sql_storage(config, _sql_url(config, cache_dir)),
            order=order,
            max_read_timeout=config.max_read_timeout,
        )
    if kind == "queue":
        from trinity.buffer.queue import QueueReader

        return QueueReader(_queue_actor(config), config.max_read_timeout, name)
    if kind == "file":
        from trinity.buffer.file import FileReader

        if not config.path:
            raise ValueError(f"experience buffer {name!r}: storage_type file needs a path (file or folder)")
        return FileReader(config.path, name)
    raise ValueError(f"experience buffer {name!r}: unknown storage_type {kind!r}; use queue, sql or file")


def get_taskset_reader(
    tasksets: TasksetConfig | Sequence[TasksetConfig], buffer_config: BufferConfig | None = None
) -> TasksetScheduler:
    """Read one or several (interleaved) tasksets; construction validates them all."""
    from trinity.buffer.taskset import TasksetScheduler

    configs = [tasksets] if not isinstance(tasksets, Sequence) else list(tasksets)
    return TasksetScheduler(configs, buffer_config)
