"""Selectors as a component kind: built-ins without plugins, plugin selectors built from the
config, one request per taskset and step, feedback from the explorer, resume, conformance."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trinity import hookimpl
from trinity.buffer.selector import (
    BUILTIN_SELECTORS,
    RandomSelector,
    Selector,
    SequentialSelector,
    ShuffleSelector,
    make_selector,
)
from trinity.buffer.taskset import TasksetError, TasksetReader, TasksetScheduler
from trinity.config import Config, TasksetConfig, no_effect
from trinity.config.no_effect import find_no_effect
from trinity.explorer.explorer import Explorer
from trinity.explorer.runner import TaskResult
from trinity.plugins import KINDS, UnknownComponentError, get_component, install_hint, list_components
from trinity.testing import check_component
from trinity.testing.conformance import check_selector
from trinity.workflow import Workflow


class EchoWorkflow(Workflow):
    def run(self):
        return []


class Recording(Selector):
    """Sequential, remembers requests and feedback; its state is the feedback seen."""

    def __init__(self, size, *, seed=42, features=None, scale: float = 1.0, **kwargs):
        super().__init__(size, seed=seed, features=features, **kwargs)
        self.scale = scale
        self.requests: list[tuple[int, int]] = []
        self.seen: dict[int, float] = {}

    def indices(self, start, count):
        self.requests.append((start, count))
        return [(start + k) % self.size for k in range(count)]

    def update(self, indices, values):
        self.seen.update({int(i): float(v) for i, v in zip(indices, values)})

    def state_dict(self):
        return {"seen": {str(k): v for k, v in self.seen.items()}}

    def load_state_dict(self, state):
        self.seen = {int(k): float(v) for k, v in state["seen"].items()}


class Hardest(Selector):
    """Reads the rows with the lowest ``score`` feature first (a tiny curriculum)."""

    def __init__(self, size, *, seed=42, features=None, **kwargs):
        super().__init__(size, seed=seed, features=features, **kwargs)
        (scores,) = self.features.values()
        self.order = sorted(range(size), key=lambda i: scores[i])

    def index(self, position):
        return self.order[position % self.size]


class Plugin:
    @hookimpl
    def register_workflows(self, register):
        register("echo", EchoWorkflow)

    @hookimpl
    def register_selectors(self, register):
        register("recording", Recording)
        register("hardest", Hardest)


@pytest.fixture
def plugin(register_plugin):
    register_plugin(Plugin(), "selector-test")


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def make_config(path, **kw) -> TasksetConfig:
    return TasksetConfig(
        name=kw.pop("name", "math"),
        path=str(path),
        format={"prompt_key": "q"},
        default_workflow_type="echo",
        **kw,
    )


def qs(n, start=0, **extra):
    return [{"q": f"q{i}", **{k: f(i) for k, f in extra.items()}} for i in range(start, start + n)]


# -- the kind and its built-ins ------------------------------------------------------------------


def test_selector_is_a_kind_with_builtins_and_no_plugin(plugin_manager):
    assert "selector" in KINDS
    assert list_components("selector") == ["random", "sequential", "shuffle"]
    assert get_component("selector", "shuffle") is ShuffleSelector
    assert plugin_manager.component_provider("selector", "random") == "trinity-core"
    assert plugin_manager.plugin_infos() == []  # the core's own hooks are no plugin


def test_plugin_selectors_are_listed_under_their_plugin(plugin_manager, plugin):
    (info,) = plugin_manager.plugin_infos()
    assert info.components["selector"] == ["recording", "hardest"]
    assert "register_selectors" in info.hooks
    assert list_components("selector") == ["hardest", "random", "recording", "sequential", "shuffle"]


def test_a_plugin_cannot_take_a_builtin_name(plugin_manager):
    class Clash:
        @hookimpl
        def register_selectors(self, register):
            register("shuffle", Recording)

    with pytest.raises(Exception, match=r"duplicate selector 'shuffle'.*'trinity-core'"):
        plugin_manager.register_plugin(Clash(), "clash")


def test_unknown_selector_names_the_closest_and_where_to_get_more(plugin_manager):
    with pytest.raises(UnknownComponentError) as info:
        get_component("selector", "shufle")
    message = str(info.value)
    assert "Did you mean 'shuffle'?" in message
    assert "Installed selectors: random, sequential, shuffle." in message
    assert install_hint("trinity-plugins-algos") in message


def test_builtins_keep_their_order():
    size, seed = 7, 3
    assert SequentialSelector(size).indices(5, 4) == [5, 6, 0, 1]
    perm1 = np.random.default_rng([seed, 1]).permutation(size).tolist()
    assert ShuffleSelector(size, seed=seed).indices(7, 7) == perm1
    draws = [int(np.random.default_rng([seed, p]).integers(size)) for p in range(10, 13)]
    assert RandomSelector(size, seed=seed).indices(10, 3) == draws


def test_make_selector_builds_a_registered_selector_by_name(plugin_manager):
    built = make_selector("shuffle", 7, seed=3)
    assert isinstance(built, ShuffleSelector)
    assert built.indices(0, 14) == ShuffleSelector(7, seed=3).indices(0, 14)
    assert make_selector("sequential", 4).indices(0, 5) == [0, 1, 2, 3, 0]
    with pytest.raises(ValueError, match="at least one row"):
        make_selector("random", 0)
    with pytest.raises(UnknownComponentError):
        make_selector("bogus", 3)


@pytest.mark.parametrize("name", sorted(BUILTIN_SELECTORS))
def test_builtins_conform(name):
    check_component("selector", BUILTIN_SELECTORS[name])


def test_conformance_catches_broken_selectors():
    class OutOfRange(Selector):
        def index(self, position):
            return self.size

    class Unseeded(Selector):
        def index(self, position):
            return int(np.random.default_rng().integers(self.size))

    class NotJson(Recording):
        def state_dict(self):
            return {"seen": set(self.seen)}

    class Forgetful(Recording):
        def indices(self, start, count):
            shift = len(self.seen)
            return [(start + shift + k) % self.size for k in range(count)]

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    class Nothing(Selector):
        pass

    with pytest.raises(AssertionError, match="expected ints in range"):
        check_selector(OutOfRange)
    with pytest.raises(AssertionError, match="different indices"):
        check_selector(Unseeded)
    with pytest.raises(AssertionError, match="JSON"):
        check_selector(NotJson)
    with pytest.raises(AssertionError, match="restored from state_dict"):
        check_selector(Forgetful)
    with pytest.raises(NotImplementedError, match="override index"):
        check_selector(Nothing)
    check_selector(Recording, init_args={"scale": 2.0})
    check_selector(Hardest, features={"score": [3, 1, 2, 5, 4]}, size=5)


# -- the reader builds its selector --------------------------------------------------------------


def test_reader_gives_the_selector_feature_columns_and_kwargs(tmp_path, plugin):
    rows = qs(4, score=lambda i: [5, 1, 3, 2][i])
    rows.insert(2, {"no_prompt": 1})  # skipped: features are of the usable rows only
    path = write_rows(tmp_path / "t.jsonl", rows)
    cfg = make_config(
        path,
        data_selector={
            "selector_type": "recording",
            "feature_keys": ["score", "missing"],
            "kwargs": {"scale": 0.5},
            "seed": 9,
        },
    )
    reader = TasksetReader(cfg)
    sel = reader.selector
    assert isinstance(sel, Recording) and sel.scale == 0.5 and sel.seed == 9 and sel.size == 4
    assert sel.features == {"score": [5, 1, 3, 2], "missing": [None] * 4}
    hard = TasksetReader(
        make_config(path, data_selector={"selector_type": "hardest", "feature_keys": ["score"]})
    )
    assert [t.task_desc for t in hard.read_batch(4)] == ["q1", "q3", "q2", "q0"]


def test_unknown_selector_type_fails_at_construction(tmp_path, plugin):
    path = write_rows(tmp_path / "t.jsonl", qs(3))
    with pytest.raises(TasksetError) as info:
        TasksetReader(make_config(path, data_selector={"selector_type": "recordng"}))
    assert str(info.value).startswith(
        "taskset 'math': data_selector.selector_type: Unknown selector 'recordng'."
    )
    assert "Did you mean 'recording'?" in str(info.value)
    # Eval tasksets are read in file order: their selector_type is not used, so not checked.
    reader = TasksetReader(make_config(path, is_eval=True, data_selector={"selector_type": "nope"}))
    assert isinstance(reader.selector, SequentialSelector)


def test_bad_selector_arguments_name_the_taskset(tmp_path, plugin, caplog):
    path = write_rows(tmp_path / "t.jsonl", qs(3))
    with pytest.raises(TasksetError, match=r"taskset 'math': data_selector: selector 'recording': .*seed"):
        TasksetReader(make_config(path, data_selector={"selector_type": "recording", "kwargs": {"seed": 1}}))
    with pytest.raises(TasksetError, match="taskset 'math': data_selector: selector 'hardest': "):
        TasksetReader(make_config(path, data_selector={"selector_type": "hardest"}))
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.selector"):
        TasksetReader(make_config(path, data_selector={"selector_type": "shuffle", "kwargs": {"tau": 0}}))
    assert "selector ShuffleSelector ignores data_selector.kwargs tau" in caplog.text


# -- scheduling, feedback and resume ---------------------------------------------------------------


def test_scheduler_asks_each_taskset_once_per_batch_keeping_the_interleaving(tmp_path, plugin):
    a = make_config(
        write_rows(tmp_path / "a.jsonl", qs(10)), name="a", data_selector={"selector_type": "recording"}
    )
    b = make_config(write_rows(tmp_path / "b.jsonl", qs(2, 100)), name="b", total_epochs=1)
    sched = TasksetScheduler([a, b])
    first = sched.read_batch(5)
    assert [(t.taskset_name, t.task_desc) for t in first] == [
        ("a", "q0"),
        ("b", "q100"),
        ("a", "q1"),
        ("b", "q101"),
        ("a", "q2"),
    ]
    assert [t.task_desc for t in sched.read_batch(3)] == ["q3", "q4", "q5"]  # b is done
    assert sched.readers[0].selector.requests == [(0, 3), (3, 3)]


def _result(task, rewards, error=None):
    exps = [SimpleNamespace(reward=r) for r in rewards]
    return TaskResult(task=task, experiences=exps, error=error)


def test_explorer_feeds_mean_rewards_of_finished_tasks_by_row(tmp_path, plugin):
    rows = qs(5)
    rows.insert(1, "not json")  # a skipped line: Task.index (file row) != row index from here on
    path = write_rows(tmp_path / "t.jsonl", rows)
    sched = TasksetScheduler([make_config(path, data_selector={"selector_type": "recording"})])
    tasks = sched.read_batch(5)
    assert [t.index for t in tasks] == [0, 2, 3, 4, 5]
    results = [
        _result(tasks[0], [1.0, 0.0, 1.0, 1.0]),
        _result(tasks[1], [], error="ValueError: boom"),  # failed: not fed as 0
        _result(tasks[2], []),  # empty: not fed
        _result(tasks[3], [None, float("nan"), 0.5]),  # only finite rewards count
        _result(tasks[4], [0.0, 0.0]),
    ]
    Explorer._feed_selectors(SimpleNamespace(taskset_reader=sched), results)
    selector = sched.readers[0].selector
    assert selector.seen == {0: 0.75, 3: 0.5, 4: 0.0}
    # Its state travels with the reader's position, through JSON as explorer_state.json.
    state = json.loads(json.dumps(sched.state_dict()))
    assert state["tasksets"]["math"]["selector"] == {"seen": {"0": 0.75, "3": 0.5, "4": 0.0}}
    again = TasksetScheduler([make_config(path, data_selector={"selector_type": "recording"})])
    again.load_state_dict(state)
    assert again.readers[0].selector.seen == selector.seen and again.readers[0].position == 5


def test_feedback_skips_tasksets_without_results_and_sources_without_feedback(tmp_path, plugin):
    path = write_rows(tmp_path / "t.jsonl", qs(3))
    sched = TasksetScheduler([make_config(path, data_selector={"selector_type": "recording"})])
    sched.feedback({"other": {0: 1.0}, "math": {}})
    assert sched.readers[0].selector.seen == {}
    Explorer._feed_selectors(SimpleNamespace(taskset_reader=object()), [])  # no feedback(): nothing
    # A single reader as the explorer's task source takes the same feedback.
    reader = TasksetReader(make_config(path, data_selector={"selector_type": "recording"}))
    (task,) = reader.read_batch(1)
    Explorer._feed_selectors(SimpleNamespace(taskset_reader=reader), [_result(task, [1.0, 0.0])])
    assert reader.selector.seen == {0: 0.5}


def test_stateless_selectors_leave_the_reader_state_as_it_was(tmp_path, plugin):
    path = write_rows(tmp_path / "t.jsonl", qs(3))
    reader = TasksetReader(make_config(path, data_selector={"selector_type": "shuffle"}))
    reader.read_batch(2)
    reader.feedback({"math": {0: 1.0}})  # built-ins ignore feedback
    assert reader.state_dict() == {"position": 2, "steps": 1}


# -- config ----------------------------------------------------------------------------------------


def _config(selector: dict, **taskset) -> Config:
    return Config.model_validate(
        {
            "model": {"model_path": "m"},
            "buffer": {
                "explorer_input": {
                    "tasksets": [{"path": "t.jsonl", "data_selector": selector, **taskset}],
                    "eval_tasksets": [{"path": "e.jsonl", "data_selector": dict(selector)}],
                }
            },
        }
    )


def test_config_accepts_any_selector_name():
    config = _config({"selector_type": " Difficulty_Based "})
    assert config.buffer.explorer_input.tasksets[0].data_selector.selector_type == "difficulty_based"
    path = _config({"selector_type": "my_pkg.sel.MySelector"})
    assert path.buffer.explorer_input.tasksets[0].data_selector.selector_type == "my_pkg.sel.MySelector"


def test_feature_keys_and_kwargs_warn_only_where_nothing_reads_them(monkeypatch):
    monkeypatch.setattr(no_effect, "_warned", set())
    plugin_config = _config(
        {"selector_type": "difficulty_based", "feature_keys": ["a", "b"], "kwargs": {"tau": 0}}
    )
    assert [k for k, _ in find_no_effect(plugin_config)] == [
        "buffer.explorer_input.eval_tasksets[0].data_selector.feature_keys",
        "buffer.explorer_input.eval_tasksets[0].data_selector.kwargs",
    ]
    builtin = _config({"selector_type": "shuffle", "feature_keys": ["a"]})
    assert [k for k, _ in find_no_effect(builtin)] == [
        "buffer.explorer_input.tasksets[0].data_selector.feature_keys",
        "buffer.explorer_input.eval_tasksets[0].data_selector.feature_keys",
    ]
    alias = Config.model_validate(
        {
            "model": {"model_path": "m"},
            "buffer": {
                "explorer_input": {
                    "taskset": {
                        "path": "t",
                        "task_selector": {"selector_type": "offline_easy2hard", "feature_keys": ["a"]},
                    }
                }
            },
        }
    )
    assert find_no_effect(alias) == []


# -- end to end: an explore step feeds the selector ---------------------------------------------------


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_explore_step_feeds_the_selector(tmp_path, plugin, tiny_model):
    from trinity.rollout.transformers_engine import TransformersEngine

    class Parity(Workflow):
        can_repeat = True

        def run(self):
            messages = [{"role": "user", "content": self.task.task_desc}]
            exps = self.model.chat(messages, n=self.repeat_times, max_tokens=4, seed=self.task.index)
            for e in exps:
                e.reward = float(e.response_length % 2 == 0)
            return exps

    class Workflows:
        @hookimpl
        def register_workflows(self, register):
            register("parity", Parity)

    from trinity.plugins import get_manager

    get_manager().register_plugin(Workflows(), "parity")
    model = tiny_model(seed=0)
    data = write_rows(tmp_path / "tasks.jsonl", qs(4))
    config = Config.model_validate(
        {
            "buffer": {
                "batch_size": 3,
                "explorer_input": {
                    "tasksets": [
                        {
                            "name": "train",
                            "path": str(data),
                            "format": {"prompt_key": "q"},
                            "repeat_times": 2,
                            "default_workflow_type": "parity",
                            "data_selector": {"selector_type": "recording"},
                        }
                    ]
                },
            },
            "explorer": {
                "runner_per_model": 1,
                "max_retry_times": 0,
                "rollout_model": {
                    "model_path": str(model),
                    "engine_type": "transformers",
                    "dtype": "float32",
                },
            },
        }
    )

    class Sink:
        def write(self, exps):
            self.exps = list(exps)

        def end_step(self, step):
            pass

        def metrics(self):
            return {}

    sink = Sink()
    engine = TransformersEngine(model, dtype="float32", device="cpu", seed=0)
    explorer = Explorer(config, engines=[engine], writer=sink)
    try:
        assert explorer.explore_step() is not None
    finally:
        explorer.shutdown()
    expected: dict[int, list[float]] = {}
    for e in sink.exps:
        expected.setdefault(e.info["task_index"], []).append(e.reward)
    selector = explorer.taskset_reader.readers[0].selector
    assert selector.seen == {i: sum(v) / len(v) for i, v in expected.items()}
    assert sorted(selector.seen) == [0, 1, 2]
