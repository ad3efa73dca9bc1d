"""Shared fixtures: a tiny local model and configs for the native trainer."""

from __future__ import annotations

from typing import Any

import pytest

from trinity.config import resolve_config
from trinity.config.validation import validate_config


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model) -> str:
    return str(tiny_model(hidden_size=32, num_layers=2))


def make_config(model_path: str, job_root: str, algorithm: dict[str, Any], **sections: Any):
    """A resolved ``mode: train`` config for the native trainer (the buffer path is never read)."""
    data = {
        "mode": "train",
        "project": "test",
        "name": "run",
        "checkpoint_root_dir": job_root,
        "model": {"model_path": model_path, "max_prompt_tokens": 16, "max_response_tokens": 16},
        "algorithm": algorithm,
        "buffer": {
            "batch_size": 4,
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
            },
        },
        "trainer": {"trainer_type": "native", "use_dynamic_bsz": False, **sections.pop("trainer", {})},
        **sections,
    }
    return resolve_config(validate_config(data))


@pytest.fixture
def config_factory(tiny_model_path: str, tmp_path):
    def factory(algorithm: dict[str, Any], **sections: Any):
        return make_config(tiny_model_path, str(tmp_path / "ckpt"), algorithm, **sections)

    return factory
