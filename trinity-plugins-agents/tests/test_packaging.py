"""Entry point, `trinity plugins`, import weight, and the taskset writers."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from trinity_agents.tasks import frozen_lake_rows, toolcall_rows
from trinity_agents.tasks import main as tasks_main

WORKFLOWS = sorted(
    [
        "frozen_lake_workflow",
        "toolcall_workflow",
        "alfworld_workflow",
        "step_wise_alfworld_workflow",
        "RAFT_alfworld_workflow",
        "RAFT_reflect_alfworld_workflow",
        "agentscope_react_workflow",
        "agentscope_react_math_workflow",
        "agentscopev0_react_math_workflow",
        "agentscope_frozen_lake_workflow",
        "examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow",
        "email_search_workflow",
        "agentscope_v1_react_search_workflow",
        "sciworld_workflow",
    ]
)


def test_entry_point_is_registered():
    [ep] = [ep for ep in entry_points(group="trinity") if ep.value == "trinity_agents.hooks"]
    assert ep.name == "agents" and ep.dist is not None and ep.dist.name == "trinity-plugins-agents"


def test_hooks_import_without_torch_or_gymnasium():
    code = (
        "import sys\n"
        "import trinity_agents.hooks as hooks\n"
        "import trinity_agents\n"
        "registered = {}\n"
        "hooks.register_workflows(register=lambda name, cls: registered.setdefault(name, cls))\n"
        "print('NAMES', sorted(registered))\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'gymnasium', 'numpy', 'ray', 'agentscope') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"NAMES {WORKFLOWS}" in out.stdout and "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_trinity_plugins_lists_the_workflows():
    trinity = Path(sys.executable).parent / "trinity"
    command = [str(trinity)] if trinity.exists() else [sys.executable, "-m", "trinity.cli"]
    out = subprocess.run([*command, "plugins", "--json"], capture_output=True, text=True, check=True)
    [entry] = [p for p in json.loads(out.stdout) if p["name"] == "trinity-plugins-agents"]
    assert entry["components"] == {"workflow": WORKFLOWS}
    assert entry["hooks"] == ["register_workflows"] and not entry.get("error")


def test_the_plugin_manager_resolves_the_names():
    from trinity.plugins import get_component
    from trinity_agents.frozen_lake import FrozenLakeWorkflow
    from trinity_agents.toolcall import ToolCallWorkflow

    assert get_component("workflow", "toolcall_workflow") is ToolCallWorkflow
    assert get_component("workflow", "frozen_lake_workflow") is FrozenLakeWorkflow


def test_taskset_writers(tmp_path, capsys):
    tasks_main(["toolcall", str(tmp_path / "tc"), "--train", "5", "--test", "3", "--seed", "2"])
    assert "wrote 5 train and 3 test tasks" in capsys.readouterr().out
    read = lambda p: [json.loads(line) for line in p.read_text().splitlines()]  # noqa: E731
    assert read(tmp_path / "tc" / "train.jsonl") == toolcall_rows(5, 2)
    assert read(tmp_path / "tc" / "test.jsonl") == toolcall_rows(3, 3)

    tasks_main(["frozen_lake", str(tmp_path / "fl"), "--train", "4", "--test", "2", "--map-max-size", "4"])
    rows = read(tmp_path / "fl" / "train.jsonl")
    assert rows == frozen_lake_rows(4, 0, 4)
    for i, row in enumerate(rows):
        assert set(row) == {"seed", "size", "p", "index", "uid"} and row["index"] == i
        assert 2 <= row["size"] < 4 and 0.6 <= row["p"] < 0.85
        assert row["uid"] == f"{row['seed']}_{row['size']}_{row['p']}"
