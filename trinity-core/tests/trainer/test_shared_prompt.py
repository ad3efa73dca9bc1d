"""The prompt-sharing forward: the same log-probs and gradients as the full pass, fewer tokens,
and a full pass whenever a model does not reproduce it."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.experience import EID, Experience
from trinity.trainer import shared_prompt
from trinity.trainer.batch import build_batch
from trinity.trainer.forward import forward_logprobs, response_logits
from trinity.trainer.native import NativeTrainer
from trinity.trainer.shared_prompt import prompt_index, shared_prompt_logits


def _experiences(prompts: int = 3, n: int = 4, seed: int = 0) -> list[Experience]:
    """``n`` responses (lengths 2-7) to each of ``prompts`` prompts of different lengths."""
    gen = torch.Generator().manual_seed(seed)
    exps = []
    for task in range(prompts):
        prompt = torch.randint(5, 60, (3 + 2 * task,), generator=gen)
        for run in range(n):
            length = int(torch.randint(2, 8, (1,), generator=gen))
            response = torch.randint(5, 60, (length,), generator=gen)
            exps.append(
                Experience(
                    tokens=torch.cat([prompt, response]),
                    prompt_length=len(prompt),
                    reward=float(run % 2),
                    eid=EID(batch=0, task=task, run=run),
                )
            )
    return exps


@pytest.fixture
def model(tiny_model_path):
    shared_prompt._verdicts.clear()
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def test_prompt_index_groups_rows_by_their_prompt_columns():
    exps = _experiences(prompts=3, n=4)
    exps = exps[4:6] + exps[:4] + exps[6:]  # task 1 first, then 0, 1, 2: groups need not be contiguous
    batch = build_batch(exps)
    first, inverse = prompt_index(batch)
    tasks = [e.eid.task for e in exps]
    assert len(first) == 3
    assert [tasks[int(r)] for r in first] == [1, 0, 2]  # numbered by first appearance
    for row, task in enumerate(tasks):
        assert tasks[int(first[inverse[row]])] == task


def test_prompt_index_is_none_when_no_prompt_repeats():
    exps = _experiences(prompts=4, n=1)
    assert prompt_index(build_batch(exps)) is None


def test_prompt_index_needs_two_rows_per_prompt_on_average():
    """An SFT batch that holds one row twice (an epoch boundary) is not worth a second pass."""
    exps = _experiences(prompts=4, n=1)
    assert prompt_index(build_batch([*exps, exps[0]])) is None
    pairs = _experiences(prompts=4, n=2)
    assert prompt_index(build_batch(pairs)) is not None


def test_shared_logits_and_gradients_equal_the_full_pass(model):
    batch = build_batch(_experiences())
    mask = batch["response_mask"]
    full = response_logits(model, batch)
    shared = response_logits(model, batch, share_prompt=True)
    assert shared.shape == full.shape
    assert torch.allclose(shared * mask[..., None], full * mask[..., None], atol=1e-5)
    assert shared_prompt._verdicts.get(model) is True

    def grad(share: bool) -> torch.Tensor:
        model.zero_grad()
        logprob, _ = forward_logprobs(model, batch, share_prompt=share)
        ((logprob * mask).sum() / mask.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    want, got = grad(False), grad(True)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (got - want).abs().max()


def test_shared_pass_runs_fewer_tokens(model):
    seen: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    batch = build_batch(_experiences(prompts=3, n=4))
    shared_prompt._verdicts[model] = True  # checked already: no comparison pass
    response_logits(model, batch, share_prompt=True)
    p, t = batch["prompt_length"], batch["response_length"]
    assert seen == [3 * p, 12 * (t - 1)]  # 3 distinct prompts, then 12 responses on the cache


def test_a_model_that_differs_gets_full_passes_with_one_warning(model, caplog):
    batch = build_batch(_experiences())
    model.train()
    for module in model.modules():  # dropout in training mode: no two passes agree
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="trinity.trainer.shared_prompt"):
        assert shared_prompt_logits(model, batch) is None  # with grad: the caller runs a full pass
        assert shared_prompt_logits(model, batch) is None
    warnings = [r for r in caplog.records if "differs from the full pass" in r.getMessage()]
    assert len(warnings) == 1 and "share_prompt_forward" in warnings[0].getMessage()
    assert shared_prompt._verdicts[model] is False


def test_a_model_whose_cache_cannot_be_reindexed_falls_back(model, monkeypatch, caplog):
    from transformers import DynamicCache

    def refuse(self, indices):
        raise NotImplementedError("no batch re-indexing")

    monkeypatch.setattr(DynamicCache, "batch_select_indices", refuse)
    batch = build_batch(_experiences())
    with caplog.at_level(logging.WARNING, logger="trinity.trainer.shared_prompt"):
        got = response_logits(model, batch, share_prompt=True)
    assert "cannot run shared prompts (NotImplementedError" in caplog.text
    assert torch.equal(got, response_logits(model, batch))


def test_gradient_checkpointing_runs_the_full_pass(model):
    model.gradient_checkpointing_enable()
    model.train()
    assert shared_prompt_logits(model, build_batch(_experiences())) is None
    assert model not in shared_prompt._verdicts


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_native_steps_match_with_and_without_sharing(config_factory, algorithm):
    """Two trainers, one sharing prompts: the same metrics and weights after two steps."""
    algo = {"algorithm_type": algorithm, "repeat_times": 4, "optimizer": {"lr": 1e-2}}
    exps = _experiences(prompts=2, n=4)
    results = []
    for share in (False, True):
        shared_prompt._verdicts.clear()
        trainer = NativeTrainer(config_factory(algo, trainer={"share_prompt_forward": share, "seed": 1}))
        metrics = [trainer.train_step(exps) for _ in range(2)]
        batch = build_batch(exps, trainer.pad_token_id)
        with torch.no_grad():
            logprob, _ = forward_logprobs(trainer.model.eval(), batch)
        results.append((metrics, logprob * batch["response_mask"]))
    (m0, lp0), (m1, lp1) = results
    for step0, step1 in zip(m0, m1):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss"):
            if key in step0:
                assert step1[key] == pytest.approx(step0[key], rel=1e-4, abs=1e-6), key
    # Adam turns rounding noise in near-zero gradients (the key bias's is zero in theory) into
    # whole lr-sized steps, so the weights are compared through what they compute.
    assert torch.allclose(lp1, lp0, atol=2e-3), (lp1 - lp0).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: bf16 autocast on the GPU")
def test_shared_pass_under_bf16_autocast_passes_its_check(tiny_model_path):
    shared_prompt._verdicts.clear()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).cuda().eval()
    batch = {
        k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in build_batch(_experiences()).items()
    }
    with torch.autocast("cuda", dtype=torch.bfloat16):
        shared = response_logits(model, batch, share_prompt=True)
    assert shared_prompt._verdicts.get(model) is True
    assert shared.isfinite().all()
