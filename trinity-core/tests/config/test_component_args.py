"""A taskset's ``reward_fn_args`` and ``workflow_args`` are checked when the config loads, as the
algorithm components' ``*_args`` are: an argument the reward function's constructor (or a
workflow that declares ``WORKFLOW_ARGS``) does not take is one line naming the key, the argument
and the accepted ones, instead of a TypeError in every task at run time."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from trinity import hookimpl
from trinity.cli import cli
from trinity.config import ConfigError, load_config
from trinity.workflow import RewardFn, Workflow


class ExactReward(RewardFn):
    def __init__(self, score: float = 1.0, penalty: float = 0.0) -> None:
        self.score, self.penalty = score, penalty

    def __call__(self, response, truth=None, **kwargs):
        return {"accuracy": self.score if response == truth else self.penalty}


class AnyArgsReward(RewardFn):
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __call__(self, response, truth=None, **kwargs):
        return {"accuracy": 0.0}


class FreeWorkflow(Workflow):
    """Reads ``workflow_args`` as it likes: nothing to check."""

    def run(self):
        return []


class DeclaredWorkflow(Workflow):
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("max_turns", "temperature")
    default_reward_fn: ClassVar[type[RewardFn]] = ExactReward

    def run(self):
        return []


class TaskPlugin:
    @hookimpl
    def register_workflows(self, register):
        register("free", FreeWorkflow)
        register("declared", DeclaredWorkflow)

    @hookimpl
    def register_reward_fns(self, register):
        register("exact", ExactReward)
        register("any_args", AnyArgsReward)


@pytest.fixture(autouse=True)
def task_components(fake_algorithms):
    fake_algorithms.register_plugin(TaskPlugin(), "task-components")


def _config(write_yaml, minimal_yaml, taskset: str, workflow: str = "free", eval_taskset: str = "") -> str:
    text = minimal_yaml.replace(
        "path: data/train.jsonl",
        f"path: data/train.jsonl\n            {taskset}\n        default_workflow_type: {workflow}"
        + (f"\n        eval_tasksets: [{{name: e, path: e.jsonl, {eval_taskset}}}]" if eval_taskset else ""),
    )
    return write_yaml(text)


def _error(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_unknown_reward_fn_arg_names_the_key_the_argument_and_the_accepted_ones(write_yaml, minimal_yaml):
    path = _config(
        write_yaml,
        minimal_yaml,
        "default_reward_fn_type: exact\n            reward_fn_args: {format_score: 0.0}",
    )
    assert _error(path) == (
        f"{path}: buffer.explorer_input.tasksets[0].reward_fn_args.format_score: unknown argument "
        "'format_score' of reward_fn 'exact'; Valid arguments: penalty, score"
    )


def test_a_misspelt_reward_fn_arg_gets_the_closest_name(write_yaml, minimal_yaml):
    path = _config(
        write_yaml, minimal_yaml, "default_reward_fn_type: exact\n            reward_fn_args: {scor: 2.0}"
    )
    assert (
        "reward_fn_args.scor: unknown argument 'scor' of reward_fn 'exact'; did you mean 'score'?"
        in _error(path)
    )


def test_reward_fn_args_it_takes_load(write_yaml, minimal_yaml):
    path = _config(
        write_yaml, minimal_yaml, "default_reward_fn_type: exact\n            reward_fn_args: {score: 2.0}"
    )
    assert load_config(path).buffer.explorer_input.tasksets[0].reward_fn_args == {"score": 2.0}


def test_a_reward_taking_any_keyword_is_not_checked(write_yaml, minimal_yaml):
    path = _config(
        write_yaml,
        minimal_yaml,
        "default_reward_fn_type: any_args\n            reward_fn_args: {whatever: 1}",
    )
    load_config(path)


def test_eval_tasksets_are_checked_too(write_yaml, minimal_yaml):
    path = _config(
        write_yaml,
        minimal_yaml,
        "default_reward_fn_type: exact",
        eval_taskset="default_reward_fn_type: exact, reward_fn_args: {format_score: 0.0}",
    )
    assert "buffer.explorer_input.eval_tasksets[0].reward_fn_args.format_score: unknown argument" in _error(
        path
    )


def test_the_workflows_own_reward_is_checked_when_the_taskset_names_none(write_yaml, minimal_yaml):
    path = _config(write_yaml, minimal_yaml, "reward_fn_args: {format_score: 0.0}", workflow="declared")
    message = _error(path)
    assert (
        "reward_fn_args.format_score: unknown argument 'format_score' of ExactReward (workflow 'declared'"
        in message
    )
    assert message.endswith("Valid arguments: penalty, score")


def test_rows_naming_their_own_reward_are_not_checked(write_yaml, minimal_yaml):
    path = _config(
        write_yaml,
        minimal_yaml,
        "default_reward_fn_type: exact\n            reward_fn_args: {format_score: 0.0}\n"
        "            format: {reward_fn_key: reward}",
    )
    load_config(path)


def test_workflow_args_are_checked_where_the_workflow_declares_them(write_yaml, minimal_yaml):
    path = _config(write_yaml, minimal_yaml, "workflow_args: {max_turn: 3}", workflow="declared")
    assert _error(path) == (
        f"{path}: buffer.explorer_input.tasksets[0].workflow_args.max_turn: unknown argument 'max_turn' "
        "of workflow 'declared'; did you mean 'max_turns'? Valid arguments: max_turns, temperature"
    )
    path = _config(write_yaml, minimal_yaml, "workflow_args: {max_turns: 3}", workflow="declared")
    load_config(path)


def test_workflow_args_of_a_workflow_that_declares_none_are_free(write_yaml, minimal_yaml):
    path = _config(write_yaml, minimal_yaml, "workflow_args: {anything: 1, env: builtin}", workflow="free")
    assert load_config(path).buffer.explorer_input.tasksets[0].workflow_args == {
        "anything": 1,
        "env": "builtin",
    }


def test_trinity_run_dry_run_stops_with_the_line_and_exit_2(write_yaml, minimal_yaml, tmp_path):
    path = _config(
        write_yaml,
        minimal_yaml,
        "default_reward_fn_type: exact\n            reward_fn_args: {format_score: 0.0}",
    )
    result = CliRunner().invoke(cli, ["run", "--config", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert (
        "reward_fn_args.format_score: unknown argument 'format_score' of reward_fn 'exact'" in result.stderr
    )
