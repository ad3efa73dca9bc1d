"""The local paths a job reads, checked before Ray starts (``trinity run`` and ``--dry-run``).

A model folder that does not exist used to surface ~20 s later, after Ray started, as 80 lines
ending in huggingface_hub's ``Repo id must be in the form 'repo_name'`` (or, for a bare name,
blamed on the network); a taskset path as an exception repr. :func:`check_paths` says it in one
line naming the key (:class:`~trinity.config.ConfigError`, exit 2 like every config error):

- model folders (``model.model_path``, the critic's when the algorithm trains one, auxiliary
  models, LoRA adapters, a tokenizer set apart from the model): a local folder (a model's must
  hold ``config.json``), or a Hugging Face id (``owner/name``) that is in the local cache or can
  be downloaded (not with ``HF_HUB_OFFLINE=1``; ``network=True`` also asks the hub whether it
  is reachable and has the model);
- the data the job reads from files (``storage_type: file``): training tasksets (or the task
  pipeline's inputs, when a pipeline writes the first one) and eval tasksets when the stage
  explores, the trainer's experience buffer when no explorer of this job writes it, its
  auxiliary buffers (e.g. SFT data). Data-Juicer recipes are checked when the config loads.

Kept light: nothing heavy is imported unless a hub id has to be looked up.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from trinity.config.errors import ConfigError
from trinity.placement import runs

if TYPE_CHECKING:
    from trinity.config import Config

# ``owner/name`` as the hub accepts it (huggingface_hub's validate_repo_id, with its one slash).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_TRUE = ("1", "on", "yes", "true")


def check_paths(config: Config, *, network: bool = False, model_path: bool = True) -> None:
    """Raise :class:`ConfigError` for the first local path of ``config`` (one resolved stage)
    that the job would fail to read. ``model_path=False`` skips the paths that follow the model
    (a later stage starts from the previous stage's checkpoint instead)."""
    model = config.model
    follows_model = {model.model_path} if not model_path else set()
    if model_path:
        _check_model(model.model_path, "model.model_path", network)
    explores, trains = runs(config, "explorer"), runs(config, "trainer")
    if trains and model.critic_model_path not in follows_model | {model.model_path} and _uses_critic(config):
        _check_model(model.critic_model_path, "model.critic_model_path", network)
    for i, lora in enumerate(model.lora_configs or []):
        if lora.path:
            _check_model(lora.path, f"model.lora_configs[{i}].path", network, marker=None)
    if explores:
        for i, aux in enumerate(config.explorer.auxiliary_models):
            if aux.model_path and aux.model_path not in follows_model:
                _check_model(aux.model_path, f"explorer.auxiliary_models[{i}].model_path", network)
        inputs = config.buffer.explorer_input
        groups = [("eval_tasksets", inputs.eval_tasksets)] if config.mode != "serve" else []
        pipeline = None
        if config.mode not in ("bench", "serve"):
            groups.insert(0, ("tasksets", inputs.tasksets))
            pipeline = _task_pipeline(config)
        if pipeline is not None:
            for i, path in enumerate(pipeline.inputs):
                _check_data(path, f"data_processor.task_pipeline.inputs[{i}]", "task pipeline input")
        for group, tasksets in groups:
            for i, ts in enumerate(tasksets):
                if pipeline is not None and group == "tasksets" and i == 0:
                    continue  # the task pipeline writes it before the job starts
                if ts.storage_type == "file":
                    _check_data(ts.path, f"buffer.explorer_input.{group}[{i}].path", "taskset")
    if trains:
        trainer_input = config.buffer.trainer_input
        eb = trainer_input.experience_buffer
        if eb is not None:
            tokenizer = eb.tokenizer_path
            if tokenizer and tokenizer not in follows_model | {model.model_path}:
                key = "buffer.trainer_input.experience_buffer.tokenizer_path"
                _check_model(tokenizer, key, network, marker=None)
            if eb.storage_type == "file" and config.mode == "train":  # no explorer of this job writes it
                from trinity.config.pipelines import trains_on_pipeline_output

                if not trains_on_pipeline_output(config):
                    _check_experiences(eb, "buffer.trainer_input.experience_buffer")
                else:  # an SFT/DPO train job's task pipeline writes it before the job starts
                    for i, path in enumerate(config.data_processor.task_pipeline.inputs):
                        _check_data(path, f"data_processor.task_pipeline.inputs[{i}]", "task pipeline input")
        for name, aux in trainer_input.auxiliary_buffers.items():
            if aux.storage_type == "file":
                _check_experiences(aux, f"buffer.trainer_input.auxiliary_buffers.{name}")


def _task_pipeline(config: Config):
    """The task pipeline that runs before the job (it writes the first training taskset), if any."""
    from trinity.config.pipelines import task_operators

    tp = config.data_processor.task_pipeline if config.data_processor else None
    return tp if tp is not None and task_operators(tp) else None


def _uses_critic(config: Config) -> bool:
    from trinity.plugins import get_component

    try:
        return bool(get_component("algorithm_type", config.algorithm.algorithm_type).use_critic)
    except Exception:  # an unknown algorithm failed at load already
        return False


def _where(path: str) -> str:
    """`` (/abs/path)`` for a relative path: where the job looks for it."""
    full = os.path.abspath(os.path.expanduser(path))
    return "" if full == path else f" ({full})"


def looks_like_hub_id(path: str) -> bool:
    """Whether ``path`` has the form of a Hugging Face repo id (``owner/name``)."""
    return bool(_HUB_ID.match(path)) and ".." not in path and "--" not in path


def hub_offline() -> str | None:
    """The variable that forbids downloads (``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1``)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return f"{var}={os.environ[var]}"
    return None


def hub_cache_dir() -> str:
    """The local Hugging Face hub cache (where downloaded models are)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def in_hub_cache(repo_id: str) -> bool:
    """Whether the hub cache holds a snapshot of model ``repo_id`` (its ``config.json``)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def hub_problem(repo_id: str) -> str | None:
    """Why model ``repo_id`` cannot be downloaded now (the hub unreachable, no such model), or
    ``None``. Other answers (rate limits, server errors) are not held against it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=10)
    except RepositoryNotFoundError:
        return "there is no such model on the Hugging Face hub (or it is private: `hf auth login`)"
    except HfHubHTTPError:
        return None
    except Exception as exc:  # connection refused, DNS, timeout: the download would fail the same way
        from huggingface_hub import constants

        return f"the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({type(exc).__name__})"
    return None


def _check_model(path: str, key: str, network: bool, marker: str | None = "config.json") -> None:
    """A model (or adapter, tokenizer) folder, or a hub id that can be had; ``marker``: the file
    a folder of this kind holds."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        if marker and not os.path.exists(os.path.join(local, marker)):
            raise ConfigError(
                f"{path!r}{_where(path)} holds no {marker}: not a Hugging Face model folder "
                "(convert a veRL checkpoint with `trinity convert`)",
                key=key,
            )
        return
    if os.path.exists(local):
        raise ConfigError(f"{path!r} is a file; give the model's folder", key=key)
    if not looks_like_hub_id(path):
        raise ConfigError(
            f"no such folder {path!r}{_where(path)}; give the model's local folder, or a Hugging Face id "
            "such as Qwen/Qwen2.5-0.5B-Instruct",
            key=key,
        )
    if in_hub_cache(path):
        return
    offline = hub_offline()
    if offline:
        raise ConfigError(
            f"{path!r} is no local folder{_where(path)} and {offline} forbids downloading it (it is not in "
            f"the Hugging Face cache {hub_cache_dir()}); download it first (`hf download {path}`) or give "
            "a local folder",
            key=key,
        )
    if network:
        problem = hub_problem(path)
        if problem:
            raise ConfigError(
                f"{path!r} is no local folder{_where(path)} nor in the Hugging Face cache, and {problem}",
                key=key,
            )


def _check_data(path: str | None, key: str, what: str) -> None:
    """A file or folder the job reads (tasksets are read from local files only)."""
    if not path:
        return  # a missing path is a config error already
    if os.path.exists(os.path.expanduser(path)):
        return
    hint = ""
    if looks_like_hub_id(path):
        hint = (
            f" ({what}s are read from local files; for a Hugging Face dataset run "
            f"`hf download --repo-type dataset {path} --local-dir DIR` and give DIR)"
        )
    raise ConfigError(f"no such file or folder {path!r}{_where(path)}{hint}", key=key)


def _check_experiences(buffer, key: str) -> None:
    """An experience buffer or dataset the trainer reads from files."""
    if buffer.schema_type in ("sft", "dpo", "cpt"):
        _check_data(buffer.path, f"{key}.path", "dataset")
        return
    from trinity.buffer.file import experience_file

    if buffer.path and not os.path.exists(experience_file(os.path.expanduser(buffer.path), buffer.name)):
        raise ConfigError(
            f"no experience file {experience_file(buffer.path, buffer.name)!r}{_where(buffer.path)} "
            "(an explore job writes it there)",
            key=f"{key}.path",
        )
