"""The CPU example configs (quickstart, its OPMD and LoRA variants, DPO) load and resolve as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity.config import load_config, stage_configs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    ("name", "rl_algorithm"), [("quickstart.yaml", "grpo"), ("opmd.yaml", "opmd"), ("lora.yaml", "grpo")]
)
def test_quickstart_is_sft_then_rl_on_cpu_backends(monkeypatch, tmp_path, name, rl_algorithm):
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    sft, rl = stage_configs(load_config(EXAMPLES / "quickstart" / name))
    assert (sft.mode, sft.algorithm.algorithm_type) == ("train", "sft")
    sft_data = sft.buffer.trainer_input.experience_buffer
    assert (sft_data.schema_type, sft_data.path) == ("sft", f"{tmp_path}/data/sft")
    assert (rl.mode, rl.algorithm.algorithm_type, rl.algorithm.repeat_times) == ("both", rl_algorithm, 8)
    assert rl.explorer.eval_on_startup  # the first eval is the SFT-only model
    assert [t.name for t in rl.buffer.explorer_input.eval_tasksets] == ["heldout", "practice"]
    assert rl.buffer.explorer_input.eval_tasksets[0].split == "test"
    assert rl.explorer.rollout_model.engine_type == "transformers"
    assert rl.trainer.trainer_type == "native"
    assert rl.synchronizer.sync_method == "memory"
    assert rl.model.model_path == f"{tmp_path}/model"  # the launcher moves it to the SFT weights
    # RL practises the train problems without a worked solution; the held-out ones stay unseen.
    assert [t.path for t in rl.buffer.explorer_input.tasksets] == [f"{tmp_path}/data/rl"]


def test_opmd_variant_differs_from_the_quickstart_only_in_its_algorithm():
    import yaml

    quickstart, opmd = (
        yaml.safe_load((EXAMPLES / "quickstart" / n).read_text()) for n in ("quickstart.yaml", "opmd.yaml")
    )
    assert (opmd["name"], opmd["algorithm"]["algorithm_type"], opmd["stages"][1]["stage_name"]) == (
        "arithmetic-opmd", "opmd", "opmd")  # fmt: skip
    opmd["name"], opmd["algorithm"]["algorithm_type"], opmd["stages"][1]["stage_name"] = (
        quickstart["name"], quickstart["algorithm"]["algorithm_type"], quickstart["stages"][1]["stage_name"])  # fmt: skip
    assert opmd == quickstart  # same data, model, warm-up, steps and evaluation


def test_lora_variant_trains_an_adapter_in_its_rl_stage_only(monkeypatch, tmp_path):
    import yaml

    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    sft, rl = stage_configs(load_config(EXAMPLES / "quickstart" / "lora.yaml"))
    assert sft.model.lora_configs is None  # the warm-up trains a fresh model: full weights
    assert [(c.lora_rank, c.target_modules) for c in rl.model.lora_configs] == [(16, "all-linear")]
    assert rl.explorer.rollout_model.enable_lora
    quickstart, lora = (
        yaml.safe_load((EXAMPLES / "quickstart" / n).read_text()) for n in ("quickstart.yaml", "lora.yaml")
    )
    rl_stage = lora["stages"][1]
    assert rl_stage.pop("model") == {
        "lora_configs": [{"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"}]
    }
    assert rl.algorithm.optimizer.lr == rl_stage.pop("algorithm")["optimizer"]["lr"]
    assert lora.pop("name") == "arithmetic-lora"
    quickstart.pop("name")
    assert lora == quickstart  # same data, model, warm-up, steps and evaluation


def test_dpo_example_trains_on_preference_pairs(monkeypatch, tmp_path):
    monkeypatch.setenv("DPO_DIR", str(tmp_path))
    config = load_config(EXAMPLES / "dpo" / "dpo.yaml")
    assert (config.mode, config.algorithm.algorithm_type) == ("train", "dpo")
    pairs = config.buffer.trainer_input.experience_buffer
    assert (pairs.schema_type, pairs.path) == ("dpo", f"{tmp_path}/data/dpo")
    assert config.trainer.trainer_type == "native"
