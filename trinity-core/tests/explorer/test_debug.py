"""``trinity debug``: a plugin-dir workflow run on the tiny model, experiences written to jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from trinity.serving.debug import debug
from trinity.testing.plugins import isolated_plugin_manager

WORKFLOW = textwrap.dedent(
    """
    from trinity import hookimpl
    from trinity.workflow import Workflow

    class ToyWorkflow(Workflow):
        def run(self):
            if self.task.raw_task.get("fail"):
                raise RuntimeError("toy failure")
            exps = self.model.chat([{"role": "user", "content": self.task.task_desc}], max_tokens=5, seed=0)
            for e in exps:
                e.reward = float(self.task.truth in e.response_text)
            return exps

    @hookimpl
    def register_workflows(register):
        register("toy_debug_wf", ToyWorkflow)
    """
)


@pytest.fixture
def manager():
    # Autoload on: the config's algorithm comes from the installed algorithm plugin.
    with isolated_plugin_manager(autoload=True) as m:
        yield m


def test_debug_prints_and_writes_experiences(tmp_path, debug_job, manager):
    rows = [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(3)]
    config, plugins = debug_job(WORKFLOW, "toy_debug_wf", rows)
    out = tmp_path / "exps.jsonl"
    result = CliRunner().invoke(
        debug,
        [
            "--config",
            str(config),
            "--plugin-dir",
            str(plugins),
            "--output-file",
            str(out),
            "--num-tasks",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert result.output.count("=== task toy#") == 2
    assert "prompt:   '<|im_start|>user\\n0+1=<|im_end|>\\n<|im_start|>assistant\\n'" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    assert lines[0]["prompt_length"] + len(lines[0]["logprobs"]) == len(lines[0]["tokens"])
    assert lines[0]["reward"] in (0.0, 1.0)


def test_debug_shows_workflow_tracebacks(tmp_path, debug_job, manager):
    config, plugins = debug_job(WORKFLOW, "toy_debug_wf", [{"prompt": "x", "response": "y", "fail": True}])
    result = CliRunner().invoke(
        debug, ["--config", str(config), "--plugin-dir", str(plugins), "--num-tasks", "1"]
    )
    assert result.exit_code == 1
    assert "RuntimeError: toy failure" in result.output and "Traceback" in result.output
    assert "1 of 1 task(s) failed" in result.output


JUDGE_WORKFLOW = textwrap.dedent(
    """
    from trinity import hookimpl
    from trinity.workflow import Workflow

    class JudgedWorkflow(Workflow):
        def run(self):
            [exp] = self.model.chat([{"role": "user", "content": self.task.task_desc}], max_tokens=4, seed=0)
            judge = self.auxiliary_models[0]
            [verdict] = judge.chat([{"role": "user", "content": "rate: " + exp.response_text}], max_tokens=3)
            exp.reward = 1.0
            exp.info.update(judge=judge.model_name, judge_path=judge.model_path, n_aux=len(self.auxiliary_models))
            return [exp]

    @hookimpl
    def register_workflows(register):
        register("judged_debug_wf", JudgedWorkflow)
    """
)


def test_debug_loads_the_auxiliary_models(tmp_path, tiny_model_path, debug_job, manager):
    config, plugins = debug_job(WORKFLOW, "toy_debug_wf", [{"prompt": "1+1=", "response": "2"}])
    (plugins / "toy.py").write_text(JUDGE_WORKFLOW)
    text = config.read_text().replace("toy_debug_wf", "judged_debug_wf")
    text += (
        f"  auxiliary_models: [{{name: judge, model_path: {tiny_model_path}, engine_type: transformers}}]\n"
    )
    config.write_text(text)
    out = tmp_path / "exps.jsonl"
    result = CliRunner().invoke(
        debug, ["--config", str(config), "--plugin-dir", str(plugins), "--output-file", str(out)]
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert f"loading auxiliary model {tiny_model_path}" in result.output
    [line] = [json.loads(line) for line in out.read_text().splitlines()]
    assert line["info"]["judge"] == "judge" and line["info"]["judge_path"] == str(tiny_model_path)
    assert line["info"]["n_aux"] == 1


def test_importing_debug_is_light():
    code = "import sys, trinity.serving.debug; print(any(m in sys.modules for m in ('torch', 'transformers', 'ray')))"
    assert subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip() == ("False")
