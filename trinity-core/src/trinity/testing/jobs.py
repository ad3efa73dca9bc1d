"""The tiny math job: one config every end-to-end test starts from, with its own changes merged in.

The job trains a tiny model (``<root>/model``) with GRPO on the math plugin's arithmetic
taskset (``<root>/data``, ``train`` and ``test`` splits, as ``python -m trinity_math.tasks
arithmetic --out <root>/data`` writes it), on CPU: the transformers rollout engine and the
native trainer in float32, an SQL experience buffer at ``<root>/buffer.db``, checkpoints under
``<root>/ckpt``. A test states only what it changes:

    config = tiny_job(root, name="grpo", buffer={"total_steps": 4}, synchronizer={"sync_interval": 2})
    trinity_run(write_job(root / "job.yaml", config))

Overrides are deep-merged (:func:`deep_merge`): a dict merges into the dict it replaces, any other
value (a list included) replaces it, and ``None`` removes the key, so the config's default applies.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["cpu_runtime", "deep_merge", "tiny_job", "tiny_taskset", "upstream_on_cpu", "write_job"]


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``overrides`` merged in: nested dicts merge key by key, any other
    value replaces the one in ``base``, and a ``None`` value removes the key. Neither argument
    is changed."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def tiny_taskset(root: str | Path, name: str = "arith", split: str = "train", **overrides: Any) -> dict:
    """The arithmetic taskset at ``<root>/data`` (``split``) as a file taskset named ``name``,
    prompted with the question alone (an empty system prompt), with ``overrides`` merged in."""
    taskset = {
        "name": name,
        "storage_type": "file",
        "path": f"{root}/data",
        "split": split,
        "format": {"prompt_key": "question", "response_key": "answer", "system_prompt": ""},
    }
    return deep_merge(taskset, overrides)


def cpu_runtime() -> dict:
    """The tiny jobs' runtime on CPU: the transformers rollout engine (one, float32, seed 1, two
    runners) and the native trainer in float32, no eval at start-up, TensorBoard metrics."""
    return {
        "explorer": {
            "eval_on_startup": False,
            "runner_per_model": 2,
            "rollout_model": {"engine_type": "transformers", "engine_num": 1, "dtype": "float32", "seed": 1},
        },
        "trainer": {"trainer_type": "native", "dtype": "float32"},
        "monitor": {"monitor_type": "tensorboard"},
    }


def upstream_on_cpu(upstream: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """An upstream example config (as loaded from its YAML) run on CPU: its GPU runtime (the
    ``cluster``, ``synchronizer``, ``trainer`` and ``explorer`` sections) replaced by
    :func:`cpu_runtime`, then ``overrides`` (model, data, sizes) deep-merged in."""
    gpu = {"cluster": None, "synchronizer": None, "trainer": None, "explorer": None}
    return deep_merge(deep_merge(deep_merge(upstream, gpu), cpu_runtime()), overrides)


def tiny_job(root: str | Path, **overrides: Any) -> dict:
    """The tiny math job's config (a dict, as a YAML file would load) for the files under
    ``root``, with ``overrides`` (top-level config keys) deep-merged in (see :func:`deep_merge`).

    Left at their defaults unless a test sets them: ``mode`` (``both``), the step count
    (``buffer.total_steps``; one epoch otherwise), the synchronizer, ``trainer.save_interval``
    and ``continue_from_checkpoint``.
    """
    base = {
        "project": "e2e",
        "name": "tiny",
        "checkpoint_root_dir": f"{root}/ckpt",
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "model": {"model_path": f"{root}/model", "max_prompt_tokens": 128, "max_response_tokens": 8},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {
                "taskset": tiny_taskset(root),
                "default_workflow_type": "math_workflow",
                "default_reward_fn_type": "math_reward",
            },
            "trainer_input": {
                "experience_buffer": {
                    "name": "exp",
                    "storage_type": "sql",
                    "path": f"sqlite:///{root}/buffer.db",
                }
            },
        },
        **cpu_runtime(),
    }
    return deep_merge(base, overrides)


def write_job(path: str | Path, config: Mapping[str, Any]) -> Path:
    """Write ``config`` as YAML at ``path`` (the job file ``trinity run --config`` reads) and
    return ``path`` as a :class:`Path`."""
    import yaml

    out = Path(path)
    out.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return out
