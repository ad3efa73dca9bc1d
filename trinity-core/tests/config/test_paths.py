"""``trinity run`` and ``--dry-run`` check the models and files a job reads before Ray starts:
one line naming the key and what is missing, exit 2 (:mod:`trinity.config.paths`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from trinity.cli import cli
from trinity.config import ConfigError, load_config
from trinity.config import paths as paths_module
from trinity.config.paths import check_paths

CONFIG = """
    project: p
    name: n
    checkpoint_root_dir: {root}/ckpt
    mode: {mode}
    model:
      model_path: {model}
      max_prompt_tokens: 64
      max_response_tokens: 32
    algorithm:
      algorithm_type: {algorithm}
      repeat_times: 4
    buffer:
      batch_size: 2
      explorer_input:
        tasksets:
          - name: train
            path: {taskset}
        eval_tasksets:
          - name: test
            path: {eval_taskset}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A model folder (``model/``, with its config.json) and a taskset file (``train.jsonl``)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    return tmp_path


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache (nothing downloaded), the hub reachable by default."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return cache


def _write(root: Path, **fields: str) -> Path:
    values = {
        "root": root,
        "mode": "both",
        "model": root / "model",
        "algorithm": "grpo",
        "taskset": root / "train.jsonl",
        "eval_taskset": root / "train.jsonl",
        **fields,
    }
    path = root / "job.yaml"
    path.write_text(textwrap.dedent(CONFIG).format(**values))
    return path


def _run(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", "--config", str(path), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def _error(path: Path, *, network: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        check_paths(load_config(path), network=network)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_valid_config_passes_the_dry_run(root):
    code, stderr = _run(_write(root), "--dry-run")
    assert code == 0, stderr


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_missing_model_folder_is_one_line_and_exit_2_before_ray_starts(root, monkeypatch, dry_run):
    import trinity.launcher

    monkeypatch.setattr(trinity.launcher, "run", lambda config: pytest.fail("the job started"))
    path = _write(root, model=root / "no-model")
    code, stderr = _run(path, *(["--dry-run"] if dry_run else []))
    assert code == 2
    assert stderr == (
        f"Error: {path}: model.model_path: no such folder '{root / 'no-model'}'; give the model's local "
        "folder, or a Hugging Face id such as Qwen/Qwen2.5-0.5B-Instruct\n"
    )


def test_a_bare_relative_name_is_a_missing_folder_not_a_network_problem(root, monkeypatch):
    monkeypatch.chdir(root)
    message = _error(_write(root, model="my-sft-model"))
    assert f"model.model_path: no such folder 'my-sft-model' ({root / 'my-sft-model'})" in message
    assert "network" not in message and "connect" not in message


def test_a_folder_that_is_no_model_or_a_file(root):
    (root / "weights").mkdir()
    assert "model.model_path: " in _error(_write(root, model=root / "weights"))
    assert "holds no config.json: not a Hugging Face model folder" in _error(
        _write(root, model=root / "weights")
    )
    assert "is a file; give the model's folder" in _error(_write(root, model=root / "train.jsonl"))


def test_a_hub_id_offline_and_not_in_the_cache_says_so(root, empty_hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _write(root, model="Qwen/Qwen2.5-1.5B-Instruct")
    code, stderr = _run(path, "--dry-run")
    assert code == 2 and stderr.count("\n") == 1
    assert "model.model_path: 'Qwen/Qwen2.5-1.5B-Instruct' is no local folder" in stderr
    assert (
        f"HF_HUB_OFFLINE=1 forbids downloading it (it is not in the Hugging Face cache {empty_hub_cache})"
        in stderr
    )


def test_a_hub_id_in_the_cache_needs_no_network(root, empty_hub_cache, monkeypatch):
    snapshot = empty_hub_cache / "models--Qwen--Qwen2.5-1.5B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(paths_module, "hub_problem", lambda repo: pytest.fail("asked the hub"))
    check_paths(load_config(_write(root, model="Qwen/Qwen2.5-1.5B-Instruct")), network=True)


def test_a_hub_id_to_download_is_looked_up_only_when_the_job_starts(root, empty_hub_cache, monkeypatch):
    path = _write(root, model="Qwen/Qwen2.5-1.5B-Instruct")
    asked = []
    monkeypatch.setattr(paths_module, "hub_problem", lambda repo: asked.append(repo))
    assert _run(path, "--dry-run")[0] == 0 and asked == []  # a dry run stays offline
    check_paths(load_config(path), network=True)
    assert asked == ["Qwen/Qwen2.5-1.5B-Instruct"]


def test_a_hub_that_cannot_be_reached_or_has_no_such_model(root, empty_hub_cache, monkeypatch):
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    path = _write(root, model="Qwen/Qwen2.5-1.5B-Instruct")

    def unreachable(self, repo_id, **kwargs):
        raise httpx.ConnectError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    message = _error(path, network=True)
    assert "model.model_path: 'Qwen/Qwen2.5-1.5B-Instruct' is no local folder" in message
    assert "nor in the Hugging Face cache, and the Hugging Face hub (" in message
    assert message.endswith("cannot be reached (ConnectError)")

    def missing(self, repo_id, **kwargs):
        raise RepositoryNotFoundError.__new__(RepositoryNotFoundError)

    monkeypatch.setattr(HfApi, "model_info", missing)
    assert "there is no such model on the Hugging Face hub" in _error(path, network=True)


def test_missing_tasksets_name_their_key(root, monkeypatch):
    message = _error(_write(root, taskset=root / "nope.jsonl"))
    assert message.endswith(
        f"buffer.explorer_input.tasksets[0].path: no such file or folder '{root / 'nope.jsonl'}'"
    )
    message = _error(_write(root, eval_taskset=root / "test.jsonl"))
    assert "buffer.explorer_input.eval_tasksets[0].path: no such file or folder" in message
    monkeypatch.chdir(root)
    message = _error(_write(root, taskset="openai/gsm8k"))
    assert "tasksets[0].path: no such file or folder 'openai/gsm8k'" in message
    assert "tasksets are read from local files; for a Hugging Face dataset run `hf download" in message


def test_what_a_stage_does_not_read_is_not_checked(root):
    # A train-only stage never reads the tasksets; grpo trains no critic.
    path = _write(root, mode="train", taskset=root / "nope.jsonl", eval_taskset=root / "nope.jsonl")
    path.write_text(
        path.read_text()
        + f"  trainer_input: {{experience_buffer: {{name: e, storage_type: sql, path: {root}/e.db}}}}\n"
    )
    text = path.read_text().replace(
        "max_response_tokens: 32", f"max_response_tokens: 32\n  critic_model_path: {root}/c"
    )
    path.write_text(text)
    check_paths(load_config(path))


def test_a_critic_is_checked_when_the_algorithm_trains_one(root):
    path = _write(root, algorithm="ppo")
    path.write_text(
        path.read_text().replace(
            "max_response_tokens: 32", f"max_response_tokens: 32\n  critic_model_path: {root}/c"
        )
    )
    assert f"model.critic_model_path: no such folder '{root / 'c'}'" in _error(path)


def test_a_train_job_reading_a_dataset_from_files(root):
    path = _write(root, mode="train", algorithm="sft")
    text = path.read_text() + (
        f"  trainer_input:\n    experience_buffer: {{name: sft, storage_type: file, path: {root}/sft}}\n"
    )
    path.write_text(text)
    assert f"buffer.trainer_input.experience_buffer.path: no such file or folder '{root / 'sft'}'" in _error(
        path
    )
    (root / "sft").mkdir()
    check_paths(load_config(path))


def test_stages_later_ones_start_from_the_previous_weights(root):
    path = _write(root)
    path.write_text(
        path.read_text()
        + "stages:\n"
        + "  - stage_name: warmup\n    mode: train\n    algorithm: {algorithm_type: sft}\n"
        + f"    buffer: {{trainer_input: {{experience_buffer: {{name: s, storage_type: file, path: {root}/sft}}}}}}\n"
        + f"  - stage_name: rl\n    buffer: {{explorer_input: {{tasksets: [{{name: t, path: {root}/rl}}]}}}}\n"
    )
    (root / "sft").mkdir()
    code, stderr = _run(path, "--dry-run")
    assert code == 2
    assert stderr == (
        f"Error: {path}: buffer.explorer_input.tasksets[0].path: in stage 'rl': no such file or folder "
        f"'{root / 'rl'}'\n"
    )
    (root / "rl").mkdir()
    assert _run(path, "--dry-run")[0] == 0
