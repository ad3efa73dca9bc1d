"""The docs cannot drift: every hook has a section in docs/plugins.md with its exact signature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from trinity import hookspecs
from trinity.plugins import KINDS, TrinityPluginManager

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _hook_names() -> list[str]:
    manager = TrinityPluginManager(autoload=False)
    return sorted(name for name in dir(manager._pm.hook) if name.startswith("register_"))


def test_every_hook_is_documented_with_its_signature():
    text = (DOCS / "plugins.md").read_text()
    headings = set(re.findall(r"^### `(\w+)\((.*?)\)`", text, flags=re.M))
    for name in _hook_names():
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert (name, params) in headings, f"docs/plugins.md lacks a '### `{name}({params})`' section"


def test_docs_name_no_hook_that_does_not_exist():
    text = (DOCS / "plugins.md").read_text()
    documented = set(re.findall(r"^### `(\w+)\(", text, flags=re.M))
    assert documented == set(_hook_names())


def test_every_hook_has_a_docstring_and_a_kind():
    for name in _hook_names():
        assert getattr(hookspecs, name).__doc__, f"hookspec {name} has no docstring"
    assert {k.hook for k in KINDS.values()} == set(_hook_names())


REPO = DOCS.parent
TEMPLATE = "examples/plugins/trinity-algo-example"
TEMPLATE_FILES = [
    "pyproject.toml",
    "src/trinity_algo_example/hooks.py",
    "src/trinity_algo_example/vanilla_pg.py",
]


def _file_blocks(text: str) -> dict[str, str]:
    """``{path: block}`` for every ``<!-- file: path -->`` followed by a fenced block."""
    blocks = re.findall(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", text, flags=re.M | re.S)
    paths = [path for path, _ in blocks]
    assert len(paths) == len(set(paths)), f"a file is copied twice: {paths}"
    return dict(blocks)


def test_the_plugin_template_is_copied_verbatim():
    """docs/plugins.md shows the template's files byte for byte: edit both, or the test fails."""
    blocks = _file_blocks((DOCS / "plugins.md").read_text())
    assert sorted(blocks) == sorted(f"{TEMPLATE}/{name}" for name in TEMPLATE_FILES)
    for path, block in blocks.items():
        assert block == (REPO / path).read_text(), f"docs/plugins.md's copy of {path} differs from the file"


def _section(name: str) -> str:
    text = (DOCS / "plugins.md").read_text()
    return text.split(f"### `{name}(register)`", 1)[1].split("\n### ", 1)[0]


def test_the_reward_example_is_built_from_reward_fn_args_and_scores_the_truth(plugin_manager):
    import yaml

    from trinity import hookimpl
    from trinity.config import FormatConfig
    from trinity.plugins import get_component
    from trinity.testing import check_component
    from trinity.workflow import RewardFn, Task

    section = _section("register_reward_fns")
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    [config] = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    namespace = {"RewardFn": RewardFn, "hookimpl": hookimpl}
    exec(compile(code, "reward_example.py", "exec"), namespace)
    plugin_manager.register_plugin(
        type("Docs", (), {"register_reward_fns": namespace["register_reward_fns"]}), "docs"
    )
    taskset = yaml.safe_load(config)["buffer"]["explorer_input"]["taskset"]
    cls = get_component("reward_fn", taskset["default_reward_fn_type"])
    check_component("reward_fn", cls)
    reward = cls(**taskset["reward_fn_args"])  # what the docs say a workflow does
    task = Task(
        reward_fn=cls,
        raw_task={"question": "The capital of France?", "answer": "Paris"},
        format_args=FormatConfig(**taskset["format"]),
        reward_fn_args=taskset["reward_fn_args"],
    )
    assert task.truth == "Paris"  # the format.response_key column
    assert reward(" paris\n", task.truth) == {"exact_match": 2.0}
    assert reward("Lyon", task.truth) == {"exact_match": 0.0}
