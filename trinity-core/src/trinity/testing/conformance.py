"""Conformance checks: does a component honour its contract (DESIGN §3)?

Each check builds the component from its ``default_args()`` (after checking they survive a
YAML round trip, as they would through a config file), calls it with the documented tensors
and shapes, and asserts on types, shapes and finiteness. Pass ``init_args`` to check a
non-default configuration, and ``batch``/``tensors`` to feed inputs of your own.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trinity.experience import EID, BufferExhausted, Experience
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

yaml = lazy_import("yaml")


def make_training_tensors(batch_size: int = 4, length: int = 6, seed: int = 0) -> dict[str, Any]:
    """Random tensors with the names and shapes the trainer passes to losses and advantages.

    Rows come in pairs of one group (``group_ids`` 0,0,1,1,...); the action mask has holes and
    every row keeps at least one valid token.
    """
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch_size, length, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    logprob = -torch.rand(batch_size, length, generator=g) * 3

    def near(x: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * torch.randn(batch_size, length, generator=g)

    return {
        "logprob": logprob,
        "old_logprob": near(logprob),
        "ref_logprob": near(logprob),
        "action_mask": mask,
        "advantages": torch.randn(batch_size, length, generator=g) * mask,
        "returns": torch.randn(batch_size, length, generator=g) * mask,
        "values": torch.randn(batch_size, length, generator=g),
        "entropy": torch.rand(batch_size, length, generator=g) * 2,
        "rewards": torch.rand(batch_size, generator=g),
        "token_level_rewards": torch.randn(batch_size, length, generator=g) * mask,
        "group_ids": torch.arange(batch_size) // 2,
        # Step-wise layout: each row its own one-step episode (trajectory), turn 0.
        "trajectory_ids": torch.arange(batch_size),
        "step_ids": torch.zeros(batch_size, dtype=torch.long),
        "rollout_logprobs": near(logprob),
        "has_rollout_logprobs": True,
        "teacher_logprobs": near(logprob),
        "old_entropy": torch.rand(batch_size, length, generator=g) * 2,
        "old_nec": torch.rand(batch_size, length, generator=g) * 0.1,
        "expert_mask": torch.arange(batch_size) % 2 == 0,
        "info": [{"reward_baseline": 0.5, "env_state_hash": f"s{i % 3}"} for i in range(batch_size)],
    }


def make_experiences(
    n: int, *, prompt_length: int = 3, response_length: int = 4, start: int = 0
) -> list[Experience]:
    """``n`` small experiences with distinct ids, two runs per task."""
    out = []
    for i in range(start, start + n):
        tokens = torch.arange(prompt_length + response_length) + i
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=prompt_length,
                logprobs=torch.full((response_length,), -1.0),
                reward=float(i % 3),
                eid=EID(batch=0, task=i // 2, run=i % 2),
            )
        )
    return out


def make_rollouts(
    tokenizer: Any,
    groups: int = 2,
    answers: tuple[tuple[str, float], ...] = (("4", 1.0), ("5!?", 0.0)),
    prompt: str = "2+2=",
) -> list[Experience]:
    """Rollouts a trainer can take a step on, in ``tokenizer``'s tokens: per task ``i`` of
    ``groups``, the prompt ``f"{prompt}{i}"`` answered with each ``(text, reward)`` of
    ``answers`` (run ``0``, ``1``, ...), so every group has a reward spread."""
    out = []
    for task in range(groups):
        p = tokenizer(f"{prompt}{task}", add_special_tokens=False)["input_ids"]
        for run, (text, reward) in enumerate(answers):
            r = tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(p + r),
                    prompt_length=len(p),
                    reward=reward,
                    eid=EID(batch=0, task=task, run=run),
                )
            )
    return out


class ListReader:
    """An in-memory :class:`~trinity.experience.BufferReader` over a list (reads each item once)."""

    short_reason: str | None = None

    def __init__(self, experiences: list[Experience]) -> None:
        self._items = list(experiences)
        self._pos = 0

    def expect_step(self, step: int | None) -> None:
        """No writers: nothing to wait for."""

    def set_step(self, step: int | None) -> None:
        """Nothing records which step read an item."""

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        if self._pos >= len(self._items):
            raise BufferExhausted("ListReader is empty")
        batch = self._items[self._pos : self._pos + batch_size]
        self._pos += len(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self._pos}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._pos = int(state["pos"])


# -- helpers ---------------------------------------------------------------------------------


def _check_subclass(cls: Any, base: type) -> None:
    assert isinstance(cls, type) and issubclass(cls, base), (
        f"{cls!r} must be a subclass of {base.__module__}.{base.__qualname__}"
    )


def _build(cls: type, init_args: Mapping[str, Any] | None, **injected: Any) -> Any:
    defaults = cls.default_args()
    assert isinstance(defaults, dict), (
        f"{cls.__name__}.default_args() must return a dict, got {type(defaults)}"
    )
    for key in defaults:
        assert isinstance(key, str), f"{cls.__name__}.default_args() keys must be strings, got {key!r}"
    dumped = yaml.safe_dump(defaults)
    assert yaml.safe_load(dumped) == defaults, (
        f"{cls.__name__}.default_args() does not survive a YAML round trip "
        f"(values must be plain numbers, strings, bools, lists or dicts): {defaults!r}"
    )
    args = {**defaults, **(init_args or {})}
    try:
        return cls(**args, **injected)
    except TypeError as exc:
        raise AssertionError(f"{cls.__name__}(**default_args()) failed: {exc}") from exc


def _check_metrics(metrics: Any, who: str) -> None:
    assert isinstance(metrics, dict), f"{who} must return metrics as a dict, got {type(metrics)}"
    for key, value in metrics.items():
        assert isinstance(key, str), f"{who}: metric names must be strings, got {key!r}"
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (
            f"{who}: metric {key!r} must be a float, got {type(value).__name__} (use .item())"
        )
        assert math.isfinite(value), f"{who}: metric {key!r} is not finite ({value})"


def _check_scalar_loss(loss: Any, who: str) -> None:
    assert isinstance(loss, torch.Tensor), f"{who} must return a tensor loss, got {type(loss)}"
    assert loss.dim() == 0, f"{who} must return a scalar loss, got shape {tuple(loss.shape)}"
    assert torch.isfinite(loss), f"{who} returned a non-finite loss ({loss.item()})"


# -- checks per kind ---------------------------------------------------------------------------


def check_policy_loss_fn(
    cls: type, init_args: Mapping[str, Any] | None = None, tensors: Mapping[str, Any] | None = None
) -> None:
    """Callable with ``logprob`` plus the trainer's tensors (and an unknown extra one);
    returns a finite scalar loss that back-propagates into ``logprob``, and float metrics."""
    from trinity.algorithm import PolicyLossFn

    _check_subclass(cls, PolicyLossFn)
    fn = _build(cls, init_args)
    data = dict(tensors or make_training_tensors())
    logprob = data.pop("logprob").clone().requires_grad_(True)
    data["an_unknown_extra_tensor"] = torch.zeros(1)  # the contract: extra keywords are tolerated
    missing = [n for n in cls.required_tensors() if n not in data and _is_required(cls.__call__, n)]
    assert not missing, f"{cls.__name__}.__call__ requires tensors the trainer does not provide: {missing}"
    result = fn(logprob, **data)
    assert isinstance(result, tuple) and len(result) == 2, f"{cls.__name__} must return (loss, metrics)"
    loss, metrics = result
    _check_scalar_loss(loss, cls.__name__)
    _check_metrics(metrics, cls.__name__)
    loss.backward()
    assert logprob.grad is not None, f"{cls.__name__}: the loss does not depend on logprob"
    assert torch.isfinite(logprob.grad).all(), f"{cls.__name__}: non-finite gradient"


def _is_required(func: Any, name: str) -> bool:
    param = inspect.signature(func).parameters.get(name)
    return param is not None and param.default is inspect.Parameter.empty


def check_advantage_fn(
    cls: type, init_args: Mapping[str, Any] | None = None, batch: Mapping[str, Any] | None = None
) -> None:
    """Sets finite ``advantages``/``returns`` of shape ``(B, T)``, zero on masked tokens."""
    from trinity.algorithm import AdvantageFn

    _check_subclass(cls, AdvantageFn)
    fn = _build(cls, init_args)
    data = dict(batch or make_training_tensors())
    mask = data["action_mask"]
    result = fn(data)
    assert isinstance(result, tuple) and len(result) == 2, f"{cls.__name__} must return (batch, metrics)"
    out, metrics = result
    for key in ("advantages", "returns"):
        assert key in out, f"{cls.__name__} did not set batch[{key!r}]"
        value = out[key]
        assert tuple(value.shape) == tuple(mask.shape), (
            f"{cls.__name__}: {key} has shape {tuple(value.shape)}, expected {tuple(mask.shape)}"
        )
        assert torch.isfinite(value).all(), f"{cls.__name__}: {key} has non-finite values"
    assert torch.all(out["advantages"][mask == 0] == 0), (
        f"{cls.__name__}: advantages must be 0 on masked tokens"
    )
    _check_metrics(metrics, cls.__name__)


def check_kl_fn(cls: type, init_args: Mapping[str, Any] | None = None) -> None:
    """``calculate_kl`` is ``(B, T)`` and finite; the loss is a finite scalar; the penalty sets
    ``token_level_rewards``."""
    from trinity.algorithm import KLFn

    _check_subclass(cls, KLFn)
    fn = _build(cls, init_args)
    data = make_training_tensors()
    kl = fn.calculate_kl(data["logprob"], data["ref_logprob"])
    assert tuple(kl.shape) == tuple(data["logprob"].shape), f"{cls.__name__}.calculate_kl has the wrong shape"
    assert torch.isfinite(kl).all(), f"{cls.__name__}.calculate_kl is not finite"
    loss, metrics = fn.calculate_kl_loss(
        data["logprob"], data["ref_logprob"], data["action_mask"], "token-mean"
    )
    _check_scalar_loss(loss, f"{cls.__name__}.calculate_kl_loss")
    _check_metrics(metrics, f"{cls.__name__}.calculate_kl_loss")
    batch = {k: data[k] for k in ("rewards", "action_mask", "old_logprob", "ref_logprob")}
    batch, metrics = fn.apply_kl_penalty_to_reward(batch)
    assert tuple(batch["token_level_rewards"].shape) == tuple(data["action_mask"].shape)
    _check_metrics(metrics, f"{cls.__name__}.apply_kl_penalty_to_reward")


def check_entropy_loss_fn(cls: type, init_args: Mapping[str, Any] | None = None) -> None:
    """Returns a finite scalar and float metrics for every aggregation mode."""
    from trinity.algorithm import LOSS_AGG_MODES, EntropyLossFn

    _check_subclass(cls, EntropyLossFn)
    fn = _build(cls, init_args)
    data = make_training_tensors()
    for mode in LOSS_AGG_MODES:
        loss, metrics = fn(data["entropy"], data["action_mask"], loss_agg_mode=mode, logprob=data["logprob"])
        _check_scalar_loss(loss, f"{cls.__name__} ({mode})")
        _check_metrics(metrics, cls.__name__)


def check_sample_strategy(
    cls: type, init_args: Mapping[str, Any] | None = None, auxiliary_buffers: Mapping[str, Any] | None = None
) -> None:
    """Built with buffers and a batch size, ``sample(step)`` returns Experiences and metrics,
    and its state survives ``state_dict``/``load_state_dict``."""
    from trinity.algorithm import SampleStrategy

    _check_subclass(cls, SampleStrategy)
    strategy = _build(
        cls,
        init_args,
        experience_buffer=ListReader(make_experiences(16)),
        auxiliary_buffers=dict(auxiliary_buffers or {}),
        train_batch_size=4,
    )
    experiences, metrics = strategy.sample(0)
    assert isinstance(experiences, list) and experiences, f"{cls.__name__}.sample returned no experiences"
    assert all(isinstance(e, Experience) for e in experiences), (
        f"{cls.__name__}.sample must return Experiences"
    )
    _check_metrics(metrics, f"{cls.__name__}.sample")
    state = strategy.state_dict()
    assert isinstance(state, dict), f"{cls.__name__}.state_dict must return a dict"
    strategy.load_state_dict(state)


def check_algorithm_type(cls: type, resolve_components: bool = True) -> None:
    """Flags have the right types, ``default_config()`` names only algorithm keys, and (with
    ``resolve_components``) every component it names is registered."""
    from trinity.algorithm import AlgorithmType
    from trinity.plugins import get_component

    _check_subclass(cls, AlgorithmType)
    for flag in ("use_critic", "use_reference", "use_advantage", "can_balance_batch"):
        assert isinstance(getattr(cls, flag), bool), f"{cls.__name__}.{flag} must be a bool"
    assert cls.schema in ("experience", "sft", "dpo", "cpt"), (
        f"{cls.__name__}.schema must be experience|sft|dpo|cpt"
    )
    config = cls.default_config()
    assert isinstance(config, dict), f"{cls.__name__}.default_config() must return a dict"
    from trinity.config.sections.algorithm import AlgorithmConfig

    # Any key of the algorithm section (components, their *_args, ...), as the resolver accepts.
    unknown = set(config) - set(AlgorithmConfig.model_fields)
    assert not unknown, f"{cls.__name__}.default_config() has unknown keys {sorted(unknown)}"
    if "repeat_times" in config:
        assert isinstance(config["repeat_times"], int) and config["repeat_times"] >= 1
    if resolve_components:
        kinds = {
            "sample_strategy": "sample_strategy",
            "advantage_fn": "advantage_fn",
            "policy_loss_fn": "policy_loss_fn",
            "kl_loss_fn": "kl_fn",
            "kl_penalty_fn": "kl_fn",
            "entropy_loss_fn": "entropy_loss_fn",
        }
        for key, kind in kinds.items():
            if key in config:
                get_component(kind, config[key])


def check_reward_fn(
    cls: type, init_args: Mapping[str, Any] | None = None, response: str = "42", truth: str | None = "42"
) -> None:
    """Returns a non-empty dict of finite floats for a sample response."""
    from trinity.workflow import RewardFn

    _check_subclass(cls, RewardFn)
    fn = _build(cls, init_args)
    parts = fn(response, truth)
    assert isinstance(parts, dict) and parts, f"{cls.__name__} must return a non-empty dict of reward parts"
    _check_metrics(parts, cls.__name__)


def check_workflow(cls: type) -> None:
    """A ``Workflow`` subclass with boolean flags; resettable ones implement ``reset``."""
    from trinity.workflow import Workflow

    _check_subclass(cls, Workflow)
    for flag in ("can_reset", "can_repeat", "is_async"):
        assert isinstance(getattr(cls, flag), bool), f"{cls.__name__}.{flag} must be a bool"
    if cls.can_reset:
        assert cls.reset is not Workflow.reset, (
            f"{cls.__name__} sets can_reset but does not implement reset()"
        )
    if cls.is_async:
        assert inspect.iscoroutinefunction(cls.run_async), f"{cls.__name__}.run_async must be async"


def make_selector_features(size: int, seed: int = 0) -> dict[str, list[float]]:
    """Two difficulty columns for selector checks: ``low`` and ``high``, pass rates in
    ``[0, 1]`` with ``low <= high`` in every row (as of a small and a large model)."""
    import random

    rng = random.Random(seed)
    low = [round(rng.random(), 3) for _ in range(size)]
    return {"low": low, "high": [round(x + (1 - x) * rng.random(), 3) for x in low]}


def check_selector(
    cls: type,
    init_args: Mapping[str, Any] | None = None,
    size: int = 10,
    features: Mapping[str, list[Any]] | None = None,
    seed: int = 7,
) -> None:
    """Built as the taskset reader builds it (``size``, ``seed``, ``features``: default two
    pass-rate columns from :func:`make_selector_features`, ``default_args()`` merged with
    ``init_args``): ``indices(start, count)`` gives ``count`` row indices in ``range(size)``
    (also when ``count > size``), the same ones for the same state and request; ``update``
    takes feedback; ``state_dict()`` survives JSON, and a fresh selector loading it continues
    with the same indices."""
    import json

    from trinity.buffer.selector import Selector

    _check_subclass(cls, Selector)
    features = dict(features if features is not None else make_selector_features(size))

    def build() -> Any:
        return _build(cls, init_args, size=size, seed=seed, features=features)

    def requests(selector: Any, start: int) -> list[list[int]]:
        out = []
        for count in (3, 1, size + 2, 4):
            got = selector.indices(start, count)
            assert isinstance(got, list) and len(got) == count, (
                f"{cls.__name__}.indices({start}, {count}) must return a list of {count} indices, got {got!r}"
            )
            for i in got:
                assert isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size, (
                    f"{cls.__name__}.indices returned {i!r}; expected ints in range({size})"
                )
            out.append(got)
            start += count
        return out

    def feed(selector: Any, batch: list[int]) -> None:
        rows = sorted(set(batch))
        selector.update(rows, [(i % 3) / 2 for i in rows])  # pass rates 0, 0.5, 1

    first, second = build(), build()
    assert requests(first, 0) == requests(second, 0), (
        f"{cls.__name__}: two selectors built alike return different indices for the same requests"
    )
    first.update([], [])
    for selector in (first, second):
        feed(selector, selector.indices(0, 4))
    assert requests(first, 5) == requests(second, 5), (
        f"{cls.__name__}: equal feedback leaves two selectors built alike in different states"
    )
    state = first.state_dict()
    assert isinstance(state, dict), f"{cls.__name__}.state_dict must return a dict, got {type(state)}"
    try:
        restored = json.loads(json.dumps(state))
    except (TypeError, ValueError) as exc:
        raise AssertionError(
            f"{cls.__name__}.state_dict() must be JSON-serialisable (it is saved in explorer_state.json): {exc}"
        ) from exc
    resumed = build()
    resumed.load_state_dict(restored)
    expected = requests(first, 40)
    assert requests(resumed, 40) == expected, (
        f"{cls.__name__}: a selector restored from state_dict() continues with other indices"
    )


def check_operator(
    cls: type, init_args: Mapping[str, Any] | None = None, rows: list[dict[str, Any]] | None = None
) -> None:
    """An :class:`~trinity.data.operator.ExperienceOperator` or
    :class:`~trinity.data.operator.TaskOperator` built from ``default_args()`` (updated by
    ``init_args``) returns ``(items, metrics)``: Experiences (of a step of two-rollout groups) or
    row dicts (of ``rows``), and a mapping of numbers."""
    from trinity.data.operator import ExperienceOperator, Operator, TaskOperator
    from trinity.experience import Experience

    _check_subclass(cls, Operator)
    assert issubclass(cls, (ExperienceOperator, TaskOperator)), (
        f"{cls.__name__} must subclass ExperienceOperator or TaskOperator, not Operator itself"
    )
    defaults = cls.default_args()
    assert isinstance(defaults, dict), f"{cls.__name__}.default_args() must return a dict"
    op = cls(**{**defaults, **dict(init_args or {})})
    if issubclass(cls, ExperienceOperator):
        items: list[Any] = make_experiences(8)
        for i, exp in enumerate(items):
            exp.reward = float(i % 3 == 0)
        kind = Experience
    else:
        items = (
            rows if rows is not None else [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(8)]
        )
        kind = dict
    result = op.process(list(items))
    assert isinstance(result, tuple) and len(result) == 2, (
        f"{cls.__name__}.process must return (items, metrics)"
    )
    out, metrics = result
    assert isinstance(out, list) and all(isinstance(x, kind) for x in out), (
        f"{cls.__name__}.process must return a list of {kind.__name__} first"
    )
    assert isinstance(metrics, Mapping), f"{cls.__name__}.process must return a mapping of metrics second"
    for key, value in metrics.items():
        assert isinstance(key, str) and isinstance(value, (int, float)) and not isinstance(value, bool), (
            f"{cls.__name__}: metric {key!r} must be a number, got {value!r}"
        )
    op.close()


def check_command(command: Any) -> None:
    """A ``register_commands`` component: a ``click.Command`` object (a
    :class:`trinity.cli.LazyCommand` is imported here) whose ``--help`` prints its usage."""
    import click
    from click.testing import CliRunner

    from trinity.cli import LazyCommand

    assert isinstance(command, click.Command), f"{command!r} must be an instance of click.core.Command"
    if isinstance(command, LazyCommand):
        command = command.load()
    result = CliRunner().invoke(command, ["--help"], prog_name=f"trinity {command.name}")
    assert result.exit_code == 0 and "Usage:" in result.output, (
        f"'trinity {command.name} --help' failed (exit {result.exit_code}): {result.output}"
    )


#: The conformance check of every component kind (a test keeps it equal to ``trinity.plugins.KINDS``:
#: a new hook kind is not done until it has a check here).
CHECKS: dict[str, Callable[..., None]] = {
    "policy_loss_fn": check_policy_loss_fn,
    "advantage_fn": check_advantage_fn,
    "kl_fn": check_kl_fn,
    "entropy_loss_fn": check_entropy_loss_fn,
    "sample_strategy": check_sample_strategy,
    "algorithm_type": check_algorithm_type,
    "reward_fn": check_reward_fn,
    "workflow": check_workflow,
    "selector": check_selector,
    "operator": check_operator,
    "command": check_command,
}


def check_component(kind: str, cls: Any, **kwargs: Any) -> None:
    """Run the conformance check for ``kind`` (a key of :data:`trinity.plugins.KINDS`)."""
    try:
        check = CHECKS[kind]
    except KeyError:
        raise ValueError(f"unknown component kind {kind!r}; kinds: {', '.join(CHECKS)}") from None
    check(cls, **kwargs)
