"""Shared fixtures of the explorer tests: one tiny local model per session."""

from __future__ import annotations

import json
import textwrap

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model):
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def engine(tiny_model_path):
    from trinity.rollout.transformers_engine import TransformersEngine

    return TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0)


@pytest.fixture
def debug_job(tmp_path, tiny_model_path):
    """``debug_job(workflow_source, workflow_name, rows)`` -> ``(config, plugins)``: an
    explore-mode config on the tiny model whose taskset (``rows``) runs the workflow registered
    by ``workflow_source`` (a plugin file named after the workflow) under ``workflow_name``."""

    def make(workflow_source: str, workflow_name: str, rows: list[dict]):
        plugins = tmp_path / "plugins"
        plugins.mkdir()
        # One file name per workflow: plugin modules of one test process share a namespace.
        (plugins / f"{workflow_name}.py").write_text(workflow_source)
        data = tmp_path / "tasks.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = tmp_path / "config.yaml"
        config.write_text(
            textwrap.dedent(
                f"""
                mode: explore
                checkpoint_root_dir: {tmp_path}/ckpt
                model: {{model_path: {tiny_model_path}, max_prompt_tokens: 64, max_response_tokens: 8}}
                buffer:
                  batch_size: 2
                  explorer_input:
                    taskset: {{name: toy, path: {data}, default_workflow_type: {workflow_name}}}
                explorer:
                  rollout_model: {{engine_type: transformers, dtype: float32}}
                """
            )
        )
        return config, plugins

    return make
