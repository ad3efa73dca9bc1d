"""End to end: `trinity run` with LoRA (``model.lora_configs``) on CPU, 2 steps, memory sync every
step: the transformers engine takes the adapter-only syncs, and the checkpoint holds the adapter
and a merged export."""

from __future__ import annotations

import sqlite3

import pytest

from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_lora_run_syncs_the_adapter_and_saves_adapter_and_export(tmp_path, math_job, trinity_run):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    import torch
    from transformers import AutoModelForCausalLM

    root = math_job(tmp_path, train=16, test=4)
    config = tiny_job(
        root,
        name="lora",
        algorithm={"optimizer": {"lr": 1.0e-2}, "entropy_loss_fn_args": {"entropy_coef": 0.01}},
        model={"lora_configs": [{"name": "lora", "lora_rank": 4, "lora_alpha": 8}]},
        buffer={"total_steps": 2},
        synchronizer={"sync_method": "memory", "sync_interval": 1},
    )
    proc = trinity_run(write_job(root / "job.yaml", config))
    assert "step 2/2" in proc.stdout + proc.stderr
    step = root / "ckpt" / "e2e" / "lora" / "global_step_2"
    assert (step / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(step / "huggingface").state_dict()
    base = AutoModelForCausalLM.from_pretrained(root / "model").state_dict()
    changed = [n for n in base if not torch.equal(base[n], merged[n])]
    assert changed and all(n.endswith("_proj.weight") for n in changed)  # the adapted linears only
    with sqlite3.connect(root / "buffer.db") as db:
        versions = {v for (v,) in db.execute("select distinct model_version from exp")}
    assert versions == {0, 1}  # step 2 was explored with the weights step 1 trained
