"""The veRL back-end for real on CPU: veRL 0.9's FSDP workers in Ray, gloo, no doubles.

Run by ``nox -s verl`` (veRL installed); skipped elsewhere. Each fixture starts real worker
groups (about 10 s each on 2 cores), so set-up is shared per module: GRPO with the reference
model on two gloo ranks (checkpoint, resume in a new worker group, ``trinity convert``), PPO
with a critic on one rank, and the placement errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="veRL is installed only in the `nox -s verl` session")
ray = pytest.importorskip("ray")

from trinity.experience import EID, Experience  # noqa: E402
from trinity.monitor.base import scalar_metrics  # noqa: E402

from .conftest import make_config  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """A Ray of two CPUs: room for two veRL ranks, as on the 2-core CI machine."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from trinity.testing.tiny_model import create_tiny_model

    return str(create_tiny_model(tmp_path_factory.mktemp("verl") / "model", hidden_size=32, num_layers=2))


def _experiences(seed: int) -> list[Experience]:
    """Two tasks x two rollouts of different lengths (padding on both sides) and rewards."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for task in range(2):
        for run in range(2):
            prompt = torch.randint(1, 60, (2 + task + run,), generator=gen)
            response = torch.randint(1, 60, (3 + 2 * run,), generator=gen)
            rows.append(
                Experience(
                    tokens=torch.cat([prompt, response]),
                    prompt_length=len(prompt),
                    reward=float(run == task),
                    logprobs=-torch.rand(len(response), generator=gen),
                    eid=EID(batch=seed, task=task, run=run),
                )
            )
    return rows


def _config(model: str, root: Path, algorithm: dict[str, Any], ranks: int, **trainer: Any):
    return make_config(
        model,
        str(root),
        {"repeat_times": 2, "optimizer": {"lr": 1e-3}, **algorithm},
        buffer={
            "batch_size": 2,
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
            },
        },
        trainer={
            "trainer_type": "verl",
            "save_hf_checkpoint": "always",
            "trainer_config": {"trainer": {"n_gpus_per_node": ranks}},
            **trainer,
        },
    )


def _hf_logprobs(model_path: str, experiences: list[Experience]) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs of a plain Hugging Face forward pass on the padded batch, and the mask."""
    from transformers import AutoModelForCausalLM

    from trinity.trainer.forward import forward_logprobs
    from trinity.trainer.verl.dataproto import build_verl_batch

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    batch = build_verl_batch(experiences, 0)
    with torch.no_grad():
        logprob, _ = forward_logprobs(model, batch)
    return logprob, batch["action_mask"] > 0


def _hf_params(path: str | Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach() for k, v in model.named_parameters()}  # tied weights once


def _assert_same_weights(
    exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], **tol
) -> None:
    assert set(reference) <= set(exported), sorted(set(reference) - set(exported))
    for key, value in reference.items():
        torch.testing.assert_close(exported[key].float(), value.float(), msg=key, **tol)


@pytest.fixture(scope="module")
def grpo(local_ray, model_path, tmp_path_factory):
    """GRPO with the reference model on two gloo ranks: log-probs, two steps, a checkpoint, a
    third step; then a new worker group resumes from the checkpoint and runs the third step."""
    from trinity.trainer.verl.trainer import VerlTrainer

    root = tmp_path_factory.mktemp("grpo")
    config = _config(
        model_path,
        root,
        {"algorithm_type": "grpo", "kl_loss_fn": "low_var_kl", "kl_loss_fn_args": {"kl_coef": 0.1}},
        ranks=2,
    )
    out = SimpleNamespace(config=config)
    start = time.monotonic()
    trainer = VerlTrainer(config)
    out.spawn_s = time.monotonic() - start
    try:
        out.device, out.world_size = trainer.device, trainer.world_size
        batch, plan = trainer.prepare(_experiences(0))
        out.old_logprob = trainer.policy_stats(batch, plan, ("old_logprob",))["old_logprob"]
        out.ref_logprob = trainer.ref_logprobs(batch, plan)
        out.metrics = [trainer.train_step(_experiences(step)) for step in (1, 2)]
        out.exported = trainer.state_dict()
        out.checkpoint = trainer.save_checkpoint(extra_state={"reader": 7})
        trainer.train_step(_experiences(3))
        out.after_third = trainer.state_dict()
    finally:
        trainer.close()

    resumed = VerlTrainer(config)
    try:
        out.extra = resumed.load_checkpoint()
        out.resumed_step = resumed.global_step
        out.resumed_weights = resumed.state_dict()
        resumed.train_step(_experiences(3))
        out.resumed_third = resumed.state_dict()
    finally:
        resumed.close()
    return out


def test_two_gloo_ranks_on_cpu(grpo):
    assert grpo.device == "cpu" and grpo.world_size == 2
    assert grpo.spawn_s < 120


def test_remove_padding_log_probs_equal_a_plain_forward_pass(grpo, model_path):
    """``use_remove_padding`` (on by default) packs the rows into one sequence; on CPU, with SDPA,
    the log-probs of the actor and of the reference model equal an unpacked Hugging Face pass."""
    assert grpo.config.trainer.use_remove_padding
    expected, mask = _hf_logprobs(model_path, _experiences(0))
    for got in (grpo.old_logprob, grpo.ref_logprob):
        torch.testing.assert_close(got[mask], expected[mask], atol=2e-5, rtol=1e-5)


def test_grpo_steps_train_with_our_loss_and_the_reference_model(grpo, model_path):
    for metrics in grpo.metrics:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "timing/ref", "timing/update_actor"):
            assert key in metrics, key
        assert all(torch.isfinite(torch.tensor(v)) for v in scalar_metrics(metrics).values())
    assert grpo.metrics[0]["actor/grad_norm"] > 0
    # After two updates the policy has moved away from the reference model.
    assert grpo.metrics[1]["actor/kl_loss"] > 0
    initial = _hf_params(model_path)
    assert max((grpo.exported[k] - v).abs().max().item() for k, v in initial.items()) > 1e-4


def test_state_dict_for_weight_sync_equals_the_saved_checkpoint(grpo):
    """The full weights ``memory`` sync sends are those ``from_pretrained(global_step_N)`` loads."""
    assert os.path.basename(grpo.checkpoint) == "global_step_2"
    _assert_same_weights(grpo.exported, _hf_params(grpo.checkpoint), rtol=0, atol=0)


def test_resume_restores_step_weights_and_optimizer(grpo):
    assert grpo.extra == {"reader": 7}
    assert grpo.resumed_step == 2
    _assert_same_weights(grpo.resumed_weights, grpo.exported, rtol=0, atol=0)
    # The same third step from the checkpoint gives the same weights: the optimizer's moments
    # and the learning-rate schedule came back with the FSDP shards.
    _assert_same_weights(grpo.resumed_third, grpo.after_third, rtol=1e-5, atol=1e-6)


def test_trinity_convert_merges_the_two_rank_shards(grpo, tmp_path):
    actor = Path(grpo.checkpoint) / "actor"
    assert sorted(p.name for p in actor.glob("model_world_size_*")) == [
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    ]
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "convert", "--checkpoint", str(actor), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "merged 2 shards" in proc.stdout
    _assert_same_weights(grpo.exported, _hf_params(out), rtol=0, atol=0)


@pytest.fixture(scope="module")
def ppo(local_ray, model_path, tmp_path_factory):
    """PPO with a critic on one rank: two steps, a checkpoint, a third step, then back to it."""
    from trinity.trainer.verl.trainer import VerlTrainer

    root = tmp_path_factory.mktemp("ppo")
    trainer = VerlTrainer(_config(model_path, root, {"algorithm_type": "ppo"}, ranks=1))
    try:
        out = SimpleNamespace(device=trainer.device, world_size=trainer.world_size)
        out.metrics = [trainer.train_step(_experiences(step)) for step in (1, 2)]
        out.saved = trainer.state_dict()
        out.checkpoint = trainer.save_checkpoint()
        trainer.train_step(_experiences(3))
        out.moved = trainer.state_dict()
        trainer.load_checkpoint(out.checkpoint)
        out.loaded_step, out.loaded = trainer.global_step, trainer.state_dict()
    finally:
        trainer.close()
    return out


def test_ppo_trains_the_critic_and_the_actor(ppo):
    assert ppo.device == "cpu" and ppo.world_size == 1
    for metrics in ppo.metrics:
        for key in ("critic/vf_loss", "actor/pg_loss", "timing/values", "timing/update_critic"):
            assert key in metrics, key
    assert ppo.metrics[0]["critic/vf_loss"] > 0


def test_ppo_checkpoint_has_critic_shards_and_loads_back(ppo):
    critic = Path(ppo.checkpoint) / "critic"
    assert list(critic.glob("model_world_size_1_rank_0.pt"))
    assert max((ppo.moved[k] - v).abs().max().item() for k, v in ppo.saved.items()) > 0
    assert ppo.loaded_step == 2
    _assert_same_weights(ppo.loaded, ppo.saved, rtol=0, atol=0)


# -- the same step in both back-ends ---------------------------------------------------------------


@pytest.fixture(scope="module")
def both_backends(local_ray, model_path, tmp_path_factory):
    """Two GRPO steps (reference model, KL loss, entropy bonus) on the same experiences, through
    the native trainer and through veRL's workers (one rank, one micro-batch in both)."""
    from trinity.trainer.native import NativeTrainer
    from trinity.trainer.verl.trainer import VerlTrainer

    root = tmp_path_factory.mktemp("both")
    algorithm = {
        "algorithm_type": "grpo",
        "kl_loss_fn": "low_var_kl",
        "kl_loss_fn_args": {"kl_coef": 0.1},
        "entropy_loss_fn_args": {"entropy_coef": 0.01},
    }
    out = SimpleNamespace(metrics={}, weights={})
    for kind in ("native", "verl"):
        config = _config(
            model_path, root / kind, algorithm, ranks=1, use_dynamic_bsz=False, trainer_type=kind
        )
        trainer = NativeTrainer(config) if kind == "native" else VerlTrainer(config)
        try:
            out.metrics[kind] = [trainer.train_step(_experiences(step)) for step in (1, 2)]
            out.weights[kind] = trainer.state_dict()
        finally:
            if kind == "verl":
                trainer.close()
    return out


def test_native_and_verl_take_the_same_step(both_backends):
    """The whole step — reference and old log-probs, GRPO advantages, KL loss and entropy bonus,
    the gradient and the optimizer step — gives the same numbers in both back-ends."""
    native, verl = both_backends.metrics["native"], both_backends.metrics["verl"]
    keys = (
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/grad_norm",
        "critic/advantages/mean",
        "critic/advantages/max",
        "critic/score/mean",
        "rollout/logprob_diff/mean",
    )
    for step in (0, 1):
        for key in keys:
            assert verl[step][key] == pytest.approx(native[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert native[0]["actor/grad_norm"] > 0 and native[1]["actor/kl_loss"] > 0
    _assert_same_weights(both_backends.weights["verl"], both_backends.weights["native"], rtol=1e-4, atol=1e-5)


# -- placement: every wait has a limit, and its error names what is missing ----------------------


def test_more_ranks_than_any_node_has_cpus_fails_at_once(local_ray):
    from trinity.trainer.verl.trainer import place_workers

    start = time.monotonic()
    with pytest.raises(RuntimeError) as failed:
        place_workers(1, 3, False, "too_many", timeout_s=60)
    assert time.monotonic() - start < 10
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("the veRL trainer needs 1 node(s) x 3 CPU bundle(s) for its 3 rank(s)")
    assert "Ray has 1 node(s) (2 CPU / 0 GPU)" in message
    assert "trainer.trainer_config.trainer.n_gpus_per_node" in message


def test_busy_cpus_time_out_naming_what_is_free(local_ray):
    from ray.util.placement_group import placement_group, remove_placement_group

    from trinity.trainer.verl.trainer import place_workers

    holder = placement_group([{"CPU": 2.0}])
    ray.get(holder.ready(), timeout=30)
    try:
        with pytest.raises(RuntimeError, match=r"could not place them in 1 s; .* 0 CPU and 0 GPU free"):
            place_workers(1, 1, False, "busy", timeout_s=1)
    finally:
        remove_placement_group(holder)


def test_cpu_platform_is_veRLs_choice_only_without_an_accelerator():
    """In a fresh process: veRL's own detection picks our platform on this GPU-less machine,
    and the CPU worker environment names it explicitly."""
    from trinity.trainer.verl.platform import PLATFORM_NAME, CpuPlatform, worker_env

    assert CpuPlatform().is_platform_available() == (not torch.cuda.is_available())
    env = worker_env()
    assert env["VERL_PLATFORM"] == PLATFORM_NAME
    assert "trinity.trainer.verl.platform" in env["VERL_USE_EXTERNAL_MODULES"].split(",")
    code = (
        "import trinity.trainer.verl.platform\n"
        "from verl.utils.device import get_device_name, get_nccl_backend\n"
        "print(get_device_name(), get_nccl_backend())"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if not torch.cuda.is_available():
        assert proc.stdout.split()[-2:] == ["cpu", "gloo"]
