"""Checkpoints: HF-loadable weights, exact resume of weights / optimizer / scheduler / step."""

from __future__ import annotations

import datetime
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity.experience import EID, Experience
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.native import NativeTrainer


def _exps(tok):
    out = []
    for task in range(2):
        for run, (text, reward) in enumerate([("ab", 1.0), ("xyz", 0.0)]):
            p, r = tok(f"q{task}:")["input_ids"], tok(text)["input_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(p + r),
                    prompt_length=len(p),
                    reward=reward,
                    eid=EID(task=task, run=run),
                )
            )
    return out


def test_save_then_resume_is_exact(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    algo = {
        "algorithm_type": "grpo",
        "repeat_times": 2,
        "optimizer": {"lr": 1e-2, "lr_warmup_steps": 3, "lr_scheduler_type": "cosine"},
    }
    config = config_factory(algo, trainer={"total_steps": 6, "max_actor_ckpt_to_keep": 2})
    exps = _exps(tok)
    trainer = NativeTrainer(config)
    for step in range(1, 4):
        trainer.train_step(exps)
        path = trainer.save_checkpoint(extra_state={"reader": {"pos": step * 4}})
    assert ckpt.find_latest_checkpoint(config.job_dir) == (3, path)
    assert [s for s, _ in ckpt.list_checkpoints(config.job_dir)] == [2, 3]  # max_actor_ckpt_to_keep
    with open(os.path.join(config.job_dir, ckpt.LATEST_FILE)) as f:
        assert f.read() == "3"
    reference = trainer.train_step(exps)  # step 4 of the original run

    hf = AutoModelForCausalLM.from_pretrained(path)  # plain Hugging Face loading works
    assert AutoTokenizer.from_pretrained(path)("ab")["input_ids"] == tok("ab")["input_ids"]

    resumed = NativeTrainer(config)
    assert resumed.load_checkpoint() == {"reader": {"pos": 12}}
    assert resumed.global_step == 3
    for name, tensor in hf.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name].cpu(), tensor, rtol=0, atol=0)
    original_state = ckpt.load_trainer_state(path)["optimizer"]["state"]
    for key, slot in resumed.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(slot["exp_avg"].cpu(), original_state[key]["exp_avg"], rtol=0, atol=0)
    assert resumed.scheduler.last_epoch == 3
    again = resumed.train_step(exps)
    # Same weights, optimizer moments, LR position and RNG: step 4 repeats exactly.
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr", "actor/kl_loss"):
        assert again[key] == reference[key], key
    for (_, a), (_, b) in zip(resumed.model.named_parameters(), trainer.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_incomplete_checkpoint_is_ignored(tmp_path):
    job = tmp_path / "job"
    (job / "global_step_5").mkdir(parents=True)
    (job / "global_step_5" / ckpt.STATE_FILE).write_bytes(b"")
    (job / "global_step_7.tmp").mkdir()  # killed while saving
    (job / "global_step_9").mkdir()  # no trainer state: incomplete
    (job / ckpt.LATEST_FILE).write_text("9")
    assert ckpt.find_latest_checkpoint(job) == (5, str(job / "global_step_5"))
    assert ckpt.find_latest_checkpoint(tmp_path / "missing") is None


def test_fresh_run_in_used_folder_gets_timestamped_name(config_factory):
    from trinity.config.resolve import resolve_with

    config = resolve_with(config_factory({"algorithm_type": "sft"}), {"continue_from_checkpoint": False})
    assert ckpt.apply_continue_rule(config) is config  # job dir does not exist yet
    os.makedirs(config.job_dir)
    now = datetime.datetime(2025, 1, 2, 3, 4, 5)
    renamed = ckpt.apply_continue_rule(config, now=now)
    assert renamed.name == "run_20250102030405"
    assert renamed.job_dir == config.job_dir + "_20250102030405"
    assert renamed.checkpoint_job_dir == renamed.job_dir
    assert renamed.monitor.cache_dir == os.path.join(renamed.job_dir, "monitor")
    assert renamed.log.save_dir == os.path.join(renamed.job_dir, "log")
    assert renamed.ray_namespace == "test/run_20250102030405"
    # Derived from the name anew, as on load: the storages' namespaces follow too.
    assert renamed.buffer.trainer_input.experience_buffer.ray_namespace == "test/run_20250102030405"
    assert renamed.synchronizer.ray_namespace == "test/run_20250102030405"
    assert not renamed.continue_from_checkpoint
    # mode bench evaluates the checkpoints in the folder: never renamed.
    bench = config.model_copy(update={"mode": "bench"})
    assert ckpt.apply_continue_rule(bench, now=now) is bench
    resume = resolve_with(config, {"continue_from_checkpoint": True})
    assert ckpt.apply_continue_rule(resume, now=now).name == "run"
