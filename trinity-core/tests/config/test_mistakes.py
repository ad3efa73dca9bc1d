"""Plain config mistakes that used to load (or crash): each must be one ConfigError line naming the key.

Covers impossible numbers (negative sizes, steps, timeouts; ports past 65535), a max_model_len
too small for its prompt and response, misspelled workflow / reward / enum / component names (with
the closest valid name), binary files passed as configs, and ``eval_interval`` rounded to a
multiple of ``sync_interval`` as Trinity-RFT does.
"""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from trinity import hookimpl
from trinity.cli import cli
from trinity.config import ConfigError, load_config
from trinity.workflow import RewardFn, Workflow


class _Workflow(Workflow):
    def run(self):
        return []


class _Reward(RewardFn):
    def __call__(self, response, truth=None, **kwargs):
        return {"accuracy": 0.0}


class FakeWorkflows:
    @hookimpl
    def register_workflows(self, register):
        register("math_workflow", _Workflow)
        register("simple_workflow", _Workflow)

    @hookimpl
    def register_reward_fns(self, register):
        register("math_reward", _Reward)
        register("countdown_reward", _Reward)


@pytest.fixture(autouse=True)
def fake_workflows(fake_algorithms):
    """The fake algorithms of conftest plus two workflows and two reward functions."""
    fake_algorithms.register_plugin(FakeWorkflows(), "fake-workflows")
    return fake_algorithms


def _with(text: str) -> tuple[str, str]:
    """An edit appending top-level ``text`` after ``mode: both``."""
    return ("mode: both", "mode: both\n    " + text)


_TASKSET = "path: data/train.jsonl"
_EVAL = _TASKSET + "\n        eval_tasksets:\n          - {name: dev, path: d.jsonl, %s}"

# (id, (old, new) edit of the minimal config, expected key, fragments the message must contain)
CASES = [
    # -- 1. impossible numbers -------------------------------------------------------------
    (
        "negative-train-batch-size",
        ("batch_size: 2", "batch_size: 2\n      train_batch_size: -4"),
        "buffer.train_batch_size",
        ["must be >= 0, got -4"],
    ),
    ("zero-batch-size", ("batch_size: 2", "batch_size: 0"), "buffer.batch_size", ["must be >= 1, got 0"]),
    (
        "negative-batch-size",
        ("batch_size: 2", "batch_size: -3"),
        "buffer.batch_size",
        ["must be >= 1, got -3"],
    ),
    (
        "negative-total-steps",
        ("batch_size: 2", "batch_size: 2\n      total_steps: -5"),
        "buffer.total_steps",
        ["must be >= 1, got -5"],
    ),
    (
        "zero-total-epochs",
        ("batch_size: 2", "batch_size: 2\n      total_epochs: 0"),
        "buffer.total_epochs",
        ["must be >= 1, got 0"],
    ),
    (
        "negative-trainer-total-steps",
        _with("trainer: {total_steps: -1}"),
        "trainer.total_steps",
        ["must be >= 1, got -1"],
    ),
    (
        "negative-read-timeout",
        ("batch_size: 2", "batch_size: 2\n      trainer_input: {experience_buffer: {max_read_timeout: -1}}"),
        "buffer.trainer_input.experience_buffer.max_read_timeout",
        ["must be >= 0, got -1"],
    ),
    (
        "negative-eval-interval",
        _with("explorer: {eval_interval: -10}"),
        "explorer.eval_interval",
        ["must be >= 1, got -10"],
    ),
    (
        "negative-explorer-sync-interval",
        _with("synchronizer: {explorer_sync_interval: -2}"),
        "synchronizer.explorer_sync_interval",
        ["must be >= 0, got -2"],
    ),
    (
        "negative-max-tokens",
        ("max_prompt_tokens: 64", "max_prompt_tokens: -64"),
        "model.max_prompt_tokens",
        ["must be >= 1, got -64"],
    ),
    (
        "top-p-above-one",
        ("max_prompt_tokens: 64", "max_prompt_tokens: 64\n      top_p: 1.5"),
        "model.top_p",
        ["must be <= 1, got 1.5"],
    ),
    (
        "negative-temperature",
        ("path: data/train.jsonl", "path: data/train.jsonl\n            rollout_args: {temperature: -0.5}"),
        "buffer.explorer_input.tasksets[0].rollout_args.temperature",
        ["must be >= 0, got -0.5"],
    ),
    (
        "negative-lr",
        ("repeat_times: 4", "repeat_times: 4\n      optimizer: {lr: -0.001}"),
        "algorithm.optimizer.lr",
        ["must be >= 0, got -0.001"],
    ),
    (
        "negative-checkpoints-to-keep",
        _with("trainer: {max_checkpoints_to_keep: -1}"),
        "trainer.max_checkpoints_to_keep",
        ["must be >= 0, got -1"],
    ),
    # -- 2. ports ----------------------------------------------------------------------------
    (
        "huge-base-port",
        _with("explorer: {rollout_model: {base_port: 99999999}}"),
        "explorer.rollout_model.base_port",
        ["must be <= 65535, got 99999999"],
    ),
    (
        "negative-base-port",
        _with("explorer: {rollout_model: {base_port: -1}}"),
        "explorer.rollout_model.base_port",
        ["must be >= 0, got -1"],
    ),
    (
        "base-port-range-runs-past-65535",
        _with("explorer: {runner_per_model: 8, rollout_model: {base_port: 65530}}"),
        "explorer.rollout_model.base_port",
        ["65530 + 8 runners reaches port 65537, past 65535", "use at most 65528"],
    ),
    (
        "huge-proxy-port",
        _with("explorer: {proxy_port: 70000}"),
        "explorer.proxy_port",
        ["must be <= 65535, got 70000"],
    ),
    (
        "huge-data-juicer-port",
        _with("service: {data_juicer: {port: 65536}}"),
        "service.data_juicer.port",
        ["must be <= 65535, got 65536"],
    ),
    # -- 3. max_model_len ------------------------------------------------------------------
    (
        "max-model-len-too-small",
        ("max_response_tokens: 32", "max_response_tokens: 32\n      max_model_len: 80"),
        "model.max_model_len",
        ["80 is smaller than model.max_prompt_tokens + model.max_response_tokens (64 + 32 = 96)"],
    ),
    # -- 4. workflows and reward functions ---------------------------------------------------
    (
        "buffer-workflow-typo",
        ("batch_size: 2", "batch_size: 2\n      default_workflow_type: math_workflw"),
        "buffer.default_workflow_type",
        [
            "Unknown workflow 'math_workflw'",
            "Did you mean 'math_workflow'?",
            "math_workflow, simple_workflow",
        ],
    ),
    (
        "buffer-reward-typo",
        ("batch_size: 2", "batch_size: 2\n      default_reward_fn_type: math_rewrad"),
        "buffer.default_reward_fn_type",
        ["Unknown reward_fn 'math_rewrad'", "Did you mean 'math_reward'?"],
    ),
    (
        "explorer-input-eval-workflow-typo",
        ("tasksets:", "default_eval_workflow_type: simple_workflo\n        tasksets:"),
        "buffer.explorer_input.default_eval_workflow_type",
        ["Unknown workflow 'simple_workflo'", "Did you mean 'simple_workflow'?"],
    ),
    (
        "taskset-workflow-typo",
        (_TASKSET, _TASKSET + "\n            default_workflow_type: math_workfow"),
        "buffer.explorer_input.tasksets[0].default_workflow_type",
        ["Unknown workflow 'math_workfow'", "Did you mean 'math_workflow'?"],
    ),
    (
        "taskset-reward-typo",
        (_TASKSET, _TASKSET + "\n            default_reward_fn_type: countdown_rewards"),
        "buffer.explorer_input.tasksets[0].default_reward_fn_type",
        ["Unknown reward_fn 'countdown_rewards'", "Did you mean 'countdown_reward'?"],
    ),
    (
        "eval-taskset-workflow-typo",
        (_TASKSET, _EVAL % "default_workflow_type: simple_wrokflow"),
        "buffer.explorer_input.eval_tasksets[0].default_workflow_type",
        ["Unknown workflow 'simple_wrokflow'", "Did you mean 'simple_workflow'?"],
    ),
    (
        "eval-taskset-reward-typo",
        (_TASKSET, _EVAL % "default_reward_fn_type: mathreward"),
        "buffer.explorer_input.eval_tasksets[0].default_reward_fn_type",
        ["Unknown reward_fn 'mathreward'", "Did you mean 'math_reward'?"],
    ),
    # -- 6. enum-like strings and component names -----------------------------------------------
    (
        "monitor-typo",
        _with("monitor: {monitor_type: tensorbord}"),
        "monitor.monitor_type",
        ["invalid value 'tensorbord'", "did you mean 'tensorboard'?"],
    ),
    (
        "monitor-typo-in-list",
        _with("monitor: {monitor_type: [console, wandbb]}"),
        "monitor.monitor_type",
        ["invalid value 'wandbb'", "did you mean 'wandb'?"],
    ),
    (
        "lr-scheduler-typo",
        ("repeat_times: 4", "repeat_times: 4\n      optimizer: {lr_scheduler_type: cosin}"),
        "algorithm.optimizer.lr_scheduler_type",
        ["invalid value 'cosin'", "expected one of: constant, cosine", "did you mean 'cosine'?"],
    ),
    (
        "warmup-style-typo",
        ("repeat_times: 4", "repeat_times: 4\n      optimizer: {warmup_style: Cosnie}"),
        "algorithm.optimizer.warmup_style",
        ["invalid value 'cosnie'", "did you mean 'cosine'?"],
    ),
    (
        "schema-type-typo",
        ("batch_size: 2", "batch_size: 2\n      trainer_input: {experience_buffer: {schema_type: stf}}"),
        "buffer.trainer_input.experience_buffer.schema_type",
        ["invalid value 'stf'", "did you mean 'sft'?"],
    ),
    (
        "priority-fn-typo",
        (
            "batch_size: 2",
            "batch_size: 2\n      trainer_input: {experience_buffer: {replay_buffer: {priority_fn: linear_decya}}}",
        ),
        "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn",
        ["invalid value 'linear_decya'", "did you mean 'linear_decay'?"],
    ),
    (
        "engine-dtype-typo",
        _with("explorer: {rollout_model: {dtype: bfloat61}}"),
        "explorer.rollout_model.dtype",
        ["invalid value 'bfloat61'", "did you mean 'bfloat16'?"],
    ),
    (
        "loss-agg-mode-typo",
        ("repeat_times: 4", "repeat_times: 4\n      loss_agg_mode: token_mean"),
        "algorithm.loss_agg_mode",
        ["invalid value 'token_mean'", "did you mean 'token-mean'?"],
    ),
    (
        "loss-agg-mode-typo-in-component-args",
        (
            "repeat_times: 4",
            "repeat_times: 4\n      policy_loss_fn_args: {loss_agg_mode: seq-mean-token-smu}",
        ),
        "algorithm.policy_loss_fn_args.loss_agg_mode",
        ["invalid value 'seq-mean-token-smu'", "did you mean 'seq-mean-token-sum'?"],
    ),
    (
        "policy-loss-typo",
        ("repeat_times: 4", "repeat_times: 4\n      policy_loss_fn: clpi"),
        "algorithm.policy_loss_fn",
        ["Unknown policy_loss_fn 'clpi'", "Did you mean 'clip'?"],
    ),
]


def _text(minimal: str, edit: tuple[str, str]) -> str:
    old, new = edit
    assert old in minimal, f"test edit {old!r} does not apply"
    return minimal.replace(old, new, 1)


@pytest.mark.parametrize(("edit", "key", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistake_is_one_line_naming_the_key(write_yaml, minimal_yaml, edit, key, fragments) -> None:
    path = write_yaml(_text(minimal_yaml, edit))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    error, message = info.value, str(info.value)
    assert "\n" not in message, message
    assert error.key == key, message
    assert message.startswith(f"{path}: {key}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# -- values Trinity-RFT gives a meaning to keep loading ----------------------------------------

SENTINELS = [
    ("train-batch-size-zero-derives", ("batch_size: 2", "batch_size: 2\n      train_batch_size: 0")),
    ("top-k-minus-one-disables", ("max_prompt_tokens: 64", "max_prompt_tokens: 64\n      top_k: -1")),
    (
        "warmup-steps-minus-one-uses-ratio",
        ("repeat_times: 4", "repeat_times: 4\n      optimizer: {lr_warmup_steps: -1}"),
    ),
    ("save-interval-zero-saves-at-end", _with("trainer: {save_interval: 0}")),
    ("checkpoints-to-keep-zero-keeps-all", _with("trainer: {max_checkpoints_to_keep: 0}")),
    ("report-interval-zero-disables", _with("explorer: {runner_state_report_interval: 0}")),
    ("task-pipeline-top-k-minus-one-keeps-all", _with("data_processor: {task_pipeline: {top_k: -1}}")),
    ("base-port-null-picks-free-ports", _with("explorer: {rollout_model: {base_port: null}}")),
    ("highest-ports", _with("explorer: {proxy_port: 65535, rollout_model: {base_port: 65528}}")),
    (
        "dotted-class-path-workflow",
        (_TASKSET, _TASKSET + "\n            default_workflow_type: trinity_math.workflows.MathWorkflow"),
    ),
    ("case-insensitive-enums", _with("monitor: {monitor_type: TensorBoard}")),
]


@pytest.mark.parametrize("edit", [c[1] for c in SENTINELS], ids=[c[0] for c in SENTINELS])
def test_sentinel_values_still_load(write_yaml, minimal_yaml, edit) -> None:
    load_config(write_yaml(_text(minimal_yaml, edit)))


def test_a_dotted_class_path_that_does_not_import_is_a_mistake(write_yaml, minimal_yaml) -> None:
    edit = (_TASKSET, _TASKSET + "\n            default_workflow_type: pkg.mod.MyFlow")
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(_text(minimal_yaml, edit)))
    assert info.value.key.endswith(".default_workflow_type") and "pkg.mod.MyFlow" in str(info.value)


def test_fixed_lists_match_the_code_that_uses_them() -> None:
    from trinity.buffer.queue import PRIORITY_FNS
    from trinity.config.sections.algorithm import LR_SCHEDULES
    from trinity.config.sections.buffer import PRIORITY_FNS as CONFIG_PRIORITY_FNS
    from trinity.trainer.schedule import SCHEDULE_TYPES

    assert sorted(CONFIG_PRIORITY_FNS) == sorted(PRIORITY_FNS)
    assert sorted(LR_SCHEDULES) == sorted(SCHEDULE_TYPES)


def test_train_batch_size_zero_means_derive(write_yaml, minimal_yaml) -> None:
    text = _text(minimal_yaml, ("batch_size: 2", "batch_size: 2\n      train_batch_size: 0"))
    assert load_config(write_yaml(text)).buffer.train_batch_size == 8  # 2 * repeat_times 4


def test_base_port_zero_means_free_ports(write_yaml, minimal_yaml) -> None:
    text = _text(minimal_yaml, _with("explorer: {rollout_model: {base_port: 0}}"))
    assert load_config(write_yaml(text)).explorer.rollout_model.base_port is None


def test_valid_workflow_names_resolve(write_yaml, minimal_yaml) -> None:
    text = _text(
        minimal_yaml,
        ("batch_size: 2", "batch_size: 2\n      default_workflow_type: math_workflow\n"
         "      default_reward_fn_type: math_reward"),
    )  # fmt: skip
    [taskset] = load_config(write_yaml(text)).buffer.explorer_input.tasksets
    assert (taskset.default_workflow_type, taskset.default_reward_fn_type) == ("math_workflow", "math_reward")


# -- 5. binary files ------------------------------------------------------------------------

BINARIES = [
    ("random-bytes", bytes(range(256)) * 4),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00"),
    ("nul-bytes-in-ascii", b"mode: both\x00\x00\x00\nmodel: {}\n"),
]


@pytest.mark.parametrize("content", [b[1] for b in BINARIES], ids=[b[0] for b in BINARIES])
def test_binary_file_is_not_a_yaml_config(tmp_path, content) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: not a text YAML file"), message


# -- 7. eval_interval follows sync_interval ---------------------------------------------------


@pytest.mark.parametrize(("eval_interval", "sync_interval", "expected"), [(10, 4, 8), (3, 4, 4), (12, 4, 12)])
def test_eval_interval_is_rounded_to_a_multiple_of_sync_interval(
    write_yaml, minimal_yaml, caplog, eval_interval, sync_interval, expected
) -> None:
    text = _text(
        minimal_yaml,
        _with(
            f"explorer: {{eval_interval: {eval_interval}}}\n    synchronizer: {{sync_interval: {sync_interval}}}"
        ),
    )
    with caplog.at_level(logging.WARNING, logger="trinity"):
        config = load_config(write_yaml(text))
    assert config.explorer.eval_interval == expected
    warnings = [r for r in caplog.records if "eval_interval" in r.getMessage()]
    if expected == eval_interval:
        assert warnings == []
    else:
        [record] = warnings
        assert record.name.startswith("trinity.")
        assert record.levelno == logging.WARNING
        assert (
            f"`eval_interval` is not a multiple of `sync_interval`; adjusted to {expected}"
            in record.getMessage()
        )


def test_eval_interval_is_kept_in_bench_mode(write_yaml, minimal_yaml) -> None:
    text = _text(minimal_yaml, ("mode: both", "mode: bench\n    explorer: {eval_interval: 10}\n"
                                "    synchronizer: {sync_interval: 4}"))  # fmt: skip
    text = _text(text, (_TASKSET, _EVAL % "default_workflow_type: math_workflow"))
    assert load_config(write_yaml(text)).explorer.eval_interval == 10


# -- the CLI: exit code 2 and one line -----------------------------------------------------------


def _dry_run(path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", "--config", str(path), "--dry-run"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def test_cli_dry_run_rejects_a_negative_batch_size(write_yaml, minimal_yaml) -> None:
    path = write_yaml(_text(minimal_yaml, ("batch_size: 2", "batch_size: 2\n      train_batch_size: -4")))
    code, stderr = _dry_run(path)
    assert code == 2
    assert stderr == f"Error: {path}: buffer.train_batch_size: must be >= 0, got -4\n"


def test_cli_dry_run_rejects_a_binary_file(tmp_path) -> None:
    path = tmp_path / "picture.png"
    path.write_bytes(BINARIES[1][1])
    code, stderr = _dry_run(path)
    assert code == 2
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"Error: {path}: not a text YAML file"), stderr


def test_cli_dry_run_rejects_an_unknown_workflow(write_yaml, minimal_yaml) -> None:
    path = write_yaml(
        _text(minimal_yaml, ("batch_size: 2", "batch_size: 2\n      default_workflow_type: math_wf"))
    )
    code, stderr = _dry_run(path)
    assert code == 2
    assert stderr.startswith(f"Error: {path}: buffer.default_workflow_type: Unknown workflow 'math_wf'.")
    assert stderr.count("\n") == 1
