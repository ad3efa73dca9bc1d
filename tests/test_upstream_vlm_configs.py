"""Upstream's multimodal examples ``grpo_vlm/vlm.yaml`` and ``mix_vlm/mix_vlm.yaml`` (stored
unchanged under ``upstream_configs/``): they load with the real loader and name what runs them
(``simple_mm_workflow`` reading the ``images`` column, and for ``mix_vlm`` expert SFT rows with
images too). ``tests/e2e/test_vlm_run.py`` runs ``mix_vlm`` on CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.plugins import get_component

UPSTREAM = Path(__file__).parent / "upstream_configs"


@pytest.mark.parametrize("name", ["grpo_vlm/vlm.yaml", "mix_vlm/mix_vlm.yaml"])
def test_the_vlm_examples_load_unchanged(upstream_env, name):
    from trinity_math.mm_workflow import SimpleMMWorkflow

    config = load_config(UPSTREAM / name)
    [taskset] = config.buffer.explorer_input.tasksets
    assert get_component("workflow", taskset.default_workflow_type) is SimpleMMWorkflow
    assert (taskset.format.prompt_key, taskset.format.image_key) == ("problem", "images")
    if name.startswith("mix_vlm"):
        assert config.algorithm.algorithm_type == "mix_chord"
        sft = config.buffer.trainer_input.auxiliary_buffers["sft_dataset"]
        assert (sft.schema_type, sft.format.image_key, sft.format.response_key) == (
            "sft",
            "images",
            "response",
        )
