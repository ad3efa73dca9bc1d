"""Deliberately broken configs: each must fail with one precise line (file, key, problem, hint)."""

from __future__ import annotations

import pytest

from trinity.config import ConfigError, load_config

# (id, edit of the minimal config, expected key path, fragments the message must contain)
# An edit is (old, new) applied to the minimal YAML, or a whole replacement text.
CASES = [
    (
        "typo-top-level",
        ("mode: both", "mode: both\n    projet: x"),
        "projet",
        ["unknown key 'projet'", "did you mean 'project'?"],
    ),
    (
        "typo-transposed",
        ("model:", "modle: {}\n    model:"),
        "modle",
        ["did you mean 'model'?"],
    ),
    (
        "typo-section-key",
        ("batch_size: 2", "batch_sise: 2"),
        "buffer.batch_sise",
        ["unknown key 'batch_sise'", "did you mean 'batch_size'?"],
    ),
    (
        "typo-deep-in-list",
        ("path: data/train.jsonl", "path: data/train.jsonl\n            format: {prompt_kye: q}"),
        "buffer.explorer_input.tasksets[0].format.prompt_kye",
        ["did you mean 'prompt_key'?"],
    ),
    (
        "key-in-wrong-section",
        ("repeat_times: 4", "repeat_times: 4\n      lr: 0.1"),
        "algorithm.lr",
        ["unknown key 'lr'", "belongs under algorithm.optimizer"],
    ),
    (
        "unknown-key-no-close-match",
        ("mode: both", "mode: both\n    cluster: {zzzz: 1}"),
        "cluster.zzzz",
        ["valid keys: ray_address, node_num, gpu_per_node"],
    ),
    (
        "typo-in-dict-of-buffers",
        (
            "batch_size: 2",
            "batch_size: 2\n      trainer_input:\n        auxiliary_buffers:\n          sft: {nmae: x}",
        ),
        "buffer.trainer_input.auxiliary_buffers.sft.nmae",
        ["did you mean 'name'?"],
    ),
    (
        "wrong-type-int",
        ("batch_size: 2", "batch_size: eight"),
        "buffer.batch_size",
        ["expected an integer, got 'eight' (str)"],
    ),
    (
        "wrong-type-fraction",
        ("batch_size: 2", "batch_size: 2.5"),
        "buffer.batch_size",
        ["expected an integer, got 2.5 (float)"],
    ),
    (
        "wrong-type-bool",
        ("max_prompt_tokens: 64", "max_prompt_tokens: 64\n      trust_remote_code: maybe"),
        "model.trust_remote_code",
        ["expected a boolean (true/false), got 'maybe' (str)"],
    ),
    (
        "out-of-range",
        ("repeat_times: 4", "repeat_times: 0"),
        "algorithm.repeat_times",
        ["must be >= 1, got 0"],
    ),
    (
        "wrong-enum-mode",
        ("mode: both", "mode: server"),
        "mode",
        ["invalid value 'server'", "expected one of: both, train, explore, bench, serve, colocate"],
    ),
    (
        "wrong-enum-deep",
        ("path: data/train.jsonl", "path: data/train.jsonl\n            storage_type: fille"),
        "buffer.explorer_input.tasksets[0].storage_type",
        ["invalid value 'fille'", "file, queue, sql", "did you mean 'file'?"],
    ),
    (
        "wrong-enum-sync-method",
        ("mode: both", "mode: both\n    synchronizer: {sync_method: ncl}"),
        "synchronizer.sync_method",
        ["expected one of: checkpoint, memory, nccl", "did you mean 'nccl'?"],
    ),
    (
        "wrong-enum-engine",
        ("mode: both", "mode: both\n    explorer: {rollout_model: {engine_type: sglang}}"),
        "explorer.rollout_model.engine_type",
        ["expected one of: auto, vllm, vllm_async, transformers"],
    ),
    (
        "wrong-monitor",
        ("mode: both", "mode: both\n    monitor: {monitor_type: [console, wandbb]}"),
        "monitor.monitor_type",
        ["invalid value 'wandbb'", "tensorboard, wandb, mlflow, console"],
    ),
    (
        "list-where-dict-expected",
        ("mode: both", "mode: both\n    trainer:\n      - save_interval: 3"),
        "trainer",
        ["expected a mapping of keys (a section), got a list"],
    ),
    (
        "dict-where-list-expected",
        ("tasksets:\n          - name: train\n", "tasksets:\n            name: train\n"),
        "buffer.explorer_input.tasksets",
        ["expected a list of mappings (sections), got a mapping"],
    ),
    (
        "args-not-a-mapping",
        ("repeat_times: 4", "repeat_times: 4\n      kl_loss_fn_args: [0.1]"),
        "algorithm.kl_loss_fn_args",
        ["expected a mapping (key: value) or null, got a list"],
    ),
    (
        "missing-model-path",
        ("model_path: tiny-model", "trust_remote_code: false"),
        "model.model_path",
        ["required key is missing"],
    ),
    (
        "missing-stage-name",
        ("mode: both", "mode: both\n    stages:\n      - mode: train"),
        "stages[0].stage_name",
        ["required key is missing"],
    ),
    (
        "missing-max-model-len",
        ("max_response_tokens: 32", "max_model_len: null"),
        "model.max_model_len",
        ["cannot be derived", "max_prompt_tokens and model.max_response_tokens"],
    ),
    (
        "missing-taskset-path",
        ("path: data/train.jsonl", "split: train"),
        "buffer.explorer_input.tasksets[0].path",
        ["required for storage_type 'file'"],
    ),
    (
        "bad-interpolation",
        ("model_path: tiny-model", "model_path: ${model.no_such_key}"),
        "model.model_path",
        ["bad interpolation", "no_such_key"],
    ),
    (
        "missing-env-var",
        ("path: data/train.jsonl", "path: ${oc.env:TRINITY_TEST_UNSET_VAR}/train.jsonl"),
        "buffer.explorer_input.tasksets[0].path",
        [
            "environment variable TRINITY_TEST_UNSET_VAR is not set",
            "${oc.env:TRINITY_TEST_UNSET_VAR,<default>}",
        ],
    ),
    (
        "unknown-algorithm-type",
        ("algorithm_type: grpo", "algorithm_type: grpoo"),
        "algorithm.algorithm_type",
        [
            "Unknown algorithm_type 'grpoo'",
            "Did you mean 'grpo'?",
            "Installed algorithm_types: grpo, ppo, sft",
        ],
    ),
    (
        "unknown-component",
        ("repeat_times: 4", "repeat_times: 4\n      kl_loss_fn: k3"),
        "algorithm.kl_loss_fn",
        ["Unknown kl_fn 'k3'", "Installed kl_fns: k2, low_var_kl, none"],
    ),
    (
        "unknown-component-arg",
        ("repeat_times: 4", "repeat_times: 4\n      policy_loss_fn_args: {clip_rnage: 0.1}"),
        "algorithm.policy_loss_fn_args.clip_rnage",
        ["unknown argument 'clip_rnage' of policy_loss_fn 'clip'", "did you mean 'clip_range'?"],
    ),
    (
        "algorithm-check-config",
        ("repeat_times: 4", "repeat_times: 1"),
        None,
        ["algorithm type 'grpo': algorithm.repeat_times must be at least 2"],
    ),
    (
        "training-repeat-conflict",
        ("path: data/train.jsonl", "path: data/train.jsonl\n            repeat_times: 3"),
        "buffer.explorer_input.tasksets[0].repeat_times",
        ["3 conflicts with algorithm.repeat_times (4)"],
    ),
    (
        "duplicate-names",
        (
            "path: data/train.jsonl",
            "path: data/train.jsonl\n        eval_tasksets: [{name: ev, path: e.jsonl}, {name: ev, path: f.jsonl}]",
        ),
        "buffer.explorer_input.eval_tasksets[1].name",
        ["'ev' is already used by buffer.explorer_input.eval_tasksets[0]", "eval/<name>"],
    ),
    (
        "both-taskset-forms",
        ("tasksets:", "taskset: {name: one, path: a.jsonl}\n        tasksets:"),
        "buffer.explorer_input.taskset",
        ["either taskset", "not both"],
    ),
    (
        "no-taskset-in-both-mode",
        (
            "        tasksets:\n          - name: train\n            path: data/train.jsonl\n",
            "        tasksets: []\n",
        ),
        "buffer.explorer_input.tasksets",
        ["mode 'both' needs at least one training taskset"],
    ),
    (
        "invalid-yaml",
        ("batch_size: 2", "batch_size: [2"),
        None,
        ["invalid YAML at line"],
    ),
    (
        "top-level-not-a-mapping",
        "- just\n- a list\n",
        None,
        ["the top level must be a mapping of sections, got a list"],
    ),
]


def _text(minimal: str, edit) -> str:
    if isinstance(edit, str):
        return edit
    old, new = edit
    assert old in minimal, f"test edit {old!r} does not apply"
    return minimal.replace(old, new, 1)


@pytest.mark.parametrize(("edit", "key", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_config_gives_one_precise_line(
    write_yaml, minimal_yaml, monkeypatch, edit, key, fragments
) -> None:
    monkeypatch.delenv("TRINITY_TEST_UNSET_VAR", raising=False)
    path = write_yaml(_text(minimal_yaml, edit))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    error = info.value
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    assert error.file == str(path)
    if key is not None:
        assert error.key == key, message
        assert message.startswith(f"{path}: {key}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_there_are_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


def test_invalid_yaml_reports_the_line(write_yaml) -> None:
    path = write_yaml("mode: both\nmodel:\n  model_path: [x\nbuffer: {}\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+, column \d+"):
        load_config(path)


def test_missing_file(tmp_path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: config file not found; check the path passed to --config"


def test_several_problems_are_counted(write_yaml, minimal_yaml) -> None:
    text = minimal_yaml.replace("batch_size: 2", "batch_size: x").replace("mode: both", "mode: nope")
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(text))
    assert "also 1 more problem(s) at: buffer.batch_size" in str(info.value)


def test_env_default_is_used_when_unset(write_yaml, minimal_yaml, monkeypatch) -> None:
    monkeypatch.delenv("TRINITY_TEST_UNSET_VAR", raising=False)
    text = minimal_yaml.replace("data/train.jsonl", "${oc.env:TRINITY_TEST_UNSET_VAR,fallback}/t.jsonl")
    config = load_config(write_yaml(text))
    assert config.buffer.explorer_input.tasksets[0].path == "fallback/t.jsonl"


def test_a_training_and_an_eval_taskset_may_share_a_name(write_yaml, minimal_yaml) -> None:
    # Trinity-RFT's examples (grpo_frozen_lake, asymre) name both "frozenlake" / "math": the two
    # never meet (read positions vs eval/<name> metrics), so this loads.
    text = minimal_yaml.replace(
        "path: data/train.jsonl",
        "path: data/train.jsonl\n        eval_tasksets: [{name: train, path: e.jsonl}]",
    )
    config = load_config(write_yaml(text))
    inputs = config.buffer.explorer_input
    assert [t.name for t in inputs.tasksets] == [t.name for t in inputs.eval_tasksets] == ["train"]
    assert inputs.eval_tasksets[0].is_eval and not inputs.tasksets[0].is_eval
