"""Import weight, data shipped as package resources, and the taskset writer."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

from trinity_webshop.catalog import default_catalog
from trinity_webshop.tasks import main as tasks_main


def test_hooks_and_workflow_import_without_torch():
    code = (
        "import sys\n"
        "import trinity_webshop.hooks as hooks\n"
        "import trinity_webshop\n"
        "registered = {}\n"
        "hooks.register_workflows(register=lambda name, cls: registered.setdefault(name, cls))\n"
        "assert list(registered) == ['webshop_workflow'], registered\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'bm25s', 'ray') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_data_files_are_package_resources():
    data = resources.files("trinity_webshop") / "data"
    assert (data / "products.jsonl").is_file() and (data / "goals.jsonl").is_file()


def test_taskset_writer(tmp_path, capsys):
    tasks_main([str(tmp_path), "--test", "5"])
    assert "wrote 5 test tasks" in capsys.readouterr().out
    test_rows = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    train_rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    catalog = default_catalog()
    assert [r["goal_index"] for r in test_rows] == catalog.goal_indices("test")[:5]
    assert len(train_rows) == len(catalog.goal_indices("train"))
    row = test_rows[0]
    assert row == {
        "goal_index": row["goal_index"],
        "split": "test",
        "instruction": catalog.goal(row["goal_index"])["instruction_text"],
    }

    tasks_main([str(tmp_path / "orig"), "--range", "test", "0", "3"])
    rows = [json.loads(line) for line in (tmp_path / "orig" / "test.jsonl").read_text().splitlines()]
    assert rows == [{"goal_index": i, "split": "test"} for i in range(3)]
