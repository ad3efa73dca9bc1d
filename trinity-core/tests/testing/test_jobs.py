"""The tiny math job builder (``trinity.testing.jobs``) and the session's tiny models
(the ``tiny_model`` fixture)."""

from __future__ import annotations

import json

import pytest

from trinity.config import load_config
from trinity.testing.jobs import deep_merge, tiny_job, tiny_taskset, write_job


def test_deep_merge_merges_dicts_replaces_the_rest_and_none_removes():
    base = {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "x": 1, "y": 2}
    merged = deep_merge(base, {"a": {"c": {"e": 3}}, "l": [3], "x": None, "z": {"k": 1}})
    assert merged == {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "l": [3], "y": 2, "z": {"k": 1}}
    # Neither input is changed, and the result shares nothing with them.
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "x": 1, "y": 2}
    merged["a"]["c"]["d"] = 9
    assert base["a"]["c"]["d"] == 2
    # A dict replaces a non-dict (and the reverse).
    assert deep_merge({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}
    assert deep_merge({"a": {"b": 2}}, {"a": 1}) == {"a": 1}


def test_tiny_taskset_reads_the_arithmetic_split_under_root(tmp_path):
    taskset = tiny_taskset(tmp_path, "probe", split="test", format={"system_prompt": None})
    assert taskset["name"] == "probe" and taskset["split"] == "test"
    assert taskset["path"] == f"{tmp_path}/data"
    assert taskset["format"] == {"prompt_key": "question", "response_key": "answer"}


def test_the_tiny_job_loads_as_a_config_with_its_overrides(tmp_path, tiny_model):
    import shutil

    shutil.copytree(tiny_model(), tmp_path / "model")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    config = tiny_job(
        tmp_path,
        name="loaded",
        mode="explore",
        buffer={"total_steps": 3, "trainer_input": {"experience_buffer": {"max_read_timeout": 7}}},
        explorer={"runner_per_model": None, "rollout_model": {"seed": 5}},
    )
    loaded = load_config(str(write_job(tmp_path / "job.yaml", config)))
    assert (loaded.mode, loaded.name, loaded.buffer.total_steps) == ("explore", "loaded", 3)
    assert loaded.model.model_path == str(tmp_path / "model")
    buffer = loaded.buffer.trainer_input.experience_buffer
    # The override merged into the base's SQL buffer rather than replacing it.
    assert (buffer.storage_type, buffer.path, buffer.max_read_timeout) == (
        "sql",
        f"sqlite:///{tmp_path}/buffer.db",
        7,
    )
    assert loaded.explorer.rollout_model.seed == 5
    assert loaded.explorer.rollout_model.engine_type == "transformers"
    # Removed: the config's default applies.
    default = type(loaded.explorer).model_fields["runner_per_model"].default
    assert loaded.explorer.runner_per_model == default != tiny_job(tmp_path)["explorer"]["runner_per_model"]
    assert [t.name for t in loaded.buffer.explorer_input.tasksets] == ["arith"]


def test_tiny_model_builds_once_per_session_for_the_same_arguments(tiny_model):
    from transformers import AutoConfig

    default = tiny_model()
    # Defaults filled in: the same model whichever way the arguments are spelled.
    assert tiny_model(seed=0) == default and tiny_model(seed=0, hidden_size=64) == default
    other = tiny_model(hidden_size=32, seed=1)
    assert other != default and tiny_model(seed=1, hidden_size=32) == other
    assert AutoConfig.from_pretrained(other).hidden_size == 32
    assert AutoConfig.from_pretrained(default).hidden_size == 64


def test_tiny_model_saves_what_create_tiny_model_saves(tiny_model, tmp_path):
    from safetensors.torch import load_file

    from trinity.testing.tiny_model import create_tiny_model

    shared = tiny_model(seed=2, num_layers=1)
    own = create_tiny_model(tmp_path / "own", seed=2, num_layers=1)
    a, b = load_file(shared / "model.safetensors"), load_file(own / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize("bad", [{"architecture": "gpt2"}, {"no_such_argument": 1}])
def test_tiny_model_refuses_what_create_tiny_model_refuses(tiny_model, bad):
    with pytest.raises((ValueError, TypeError)):
        tiny_model(**bad)


def test_an_upstream_config_on_cpu_keeps_its_algorithm_and_data_and_loses_its_gpu_runtime():
    from trinity.testing.jobs import cpu_runtime, upstream_on_cpu

    upstream = {
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 8},
        "cluster": {"gpu_per_node": 8},
        "synchronizer": {"sync_method": "nccl"},
        "explorer": {"rollout_model": {"engine_num": 4, "tensor_parallel_size": 2}},
        "trainer": {"ulysses_sequence_parallel_size": 2},
    }
    config = upstream_on_cpu(upstream, {"algorithm": {"repeat_times": 2}})
    assert config["algorithm"] == {"algorithm_type": "grpo", "repeat_times": 2}
    assert "cluster" not in config and "synchronizer" not in config
    assert {k: config[k] for k in ("explorer", "trainer", "monitor")} == cpu_runtime()
    assert upstream["cluster"] == {"gpu_per_node": 8}  # the loaded config is not changed
