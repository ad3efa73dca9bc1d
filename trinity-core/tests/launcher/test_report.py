"""trinity.report holds the job's console lines: the launcher and the step loop print nothing
themselves, and every line carries the ``[trinity]`` prefix, problems on stderr."""

from __future__ import annotations

import ast
from pathlib import Path

import trinity
from trinity import report

SRC = Path(trinity.__file__).parent


def _print_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]


def test_the_launcher_and_the_step_loop_print_through_report():
    for module in ("launcher.py", "step_loop.py", "sync/explore_job.py", "sync/stage_weights.py"):
        assert _print_calls(SRC / module) == [], module
    assert len(_print_calls(SRC / "report.py")) == 1  # say()


def test_lines_carry_the_prefix_and_problems_go_to_stderr(capsys):
    report.checkpoint_loaded(3, "/ckpt/global_step_2", 2)
    report.explores_without_checkpoint(4, 4, "/job", "no train job runs", 2, waited=False)
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "[trinity] explorer step 3: loaded the trainer job's checkpoint /ckpt/global_step_2 (model version 2)",
        "[trinity] explorer step 4: no checkpoint of trainer step 4 in /job: no train job runs; "
        "exploring on with model version 2",
    ]
    assert err == ""
    report.explores_without_checkpoint(4, 4, "/job", "waited 60s", 2, waited=True)
    report.stage_ends("1 train steps, 1 explore steps in 3s", ["the trainer stopped after 1 of 2 steps"])
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 2
    assert all(line.startswith("[trinity] ") for line in err.splitlines())
    assert err.splitlines()[1].startswith("[trinity] finished short: the trainer stopped after 1 of 2 steps.")
