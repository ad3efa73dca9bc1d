"""The native trainer on a tiny real model: learning signal, micro-batching, critic, DPO."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from trinity.experience import EID, Experience
from trinity.trainer.batch import build_batch, to_device
from trinity.trainer.forward import forward_logprobs
from trinity.trainer.native import NativeTrainer

PROMPT = "2+2="
GOOD, BAD = "4", "5!?"


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _rollouts(tok, groups=2):
    """Per task: one rewarded and one unrewarded response of the same prompt."""
    exps = []
    for task in range(groups):
        for run, (text, reward) in enumerate([(GOOD, 1.0), (BAD, 0.0)]):
            p, r = _ids(tok, PROMPT + str(task)), _ids(tok, text)
            exps.append(
                Experience(
                    tokens=torch.tensor(p + r),
                    prompt_length=len(p),
                    reward=reward,
                    eid=EID(batch=0, task=task, run=run),
                )
            )
    return exps


def _mean_logprob(trainer, exps):
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        logprob, _ = forward_logprobs(trainer.model, batch)
    mask = batch["action_mask"]
    return ((logprob * mask).sum(-1) / mask.sum(-1)).tolist()


def test_grpo_raises_logprob_of_rewarded_responses(config_factory, tiny_model_path):
    config = config_factory({"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-2}})
    trainer = NativeTrainer(config)
    assert trainer.ref_model is not None  # grpo uses a k2 KL loss against the reference
    exps = _rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    before = _mean_logprob(trainer, exps)
    for _ in range(4):
        metrics = trainer.train_step(exps)
    after = _mean_logprob(trainer, exps)
    good = [a - b for a, b, e in zip(after, before, exps) if e.reward == 1.0]
    bad = [a - b for a, b, e in zip(after, before, exps) if e.reward == 0.0]
    assert min(good) > 0.1 and max(bad) < -0.1, (good, bad)
    for key in (
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "critic/score/mean",
        "response_length/mean",
        "timing/step",
    ):
        assert key in metrics, key
    assert metrics["actor/kl_loss"] > 0  # the policy has moved away from the reference
    assert trainer.global_step == 4


def test_sft_step_lowers_nll(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    config = config_factory({"algorithm_type": "sft", "optimizer": {"lr": 1e-2}})
    trainer = NativeTrainer(config)
    assert trainer.ref_model is None and trainer.advantage_fn is None
    p, r = _ids(tok, "Q: hi\nA:"), _ids(tok, " hello there")
    exps = [Experience(tokens=torch.tensor(p + r), prompt_length=len(p))]
    first = trainer.train_step(exps)["actor/sft_loss"]
    for _ in range(3):
        last = trainer.train_step(exps)["actor/sft_loss"]
    assert last < first - 0.5, (first, last)


def _grads(trainer, exps):
    trainer.train_step(exps)  # lr 0: the gradient is left in .grad, the weights stay put
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(config_factory, tiny_model_path, mode):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    exps = _rollouts(tok, groups=3)
    exps[1].action_mask = torch.tensor([1, 0, 1])  # a masked hole changes the token counts
    algo = {
        "algorithm_type": "grpo",
        "repeat_times": 2,
        "loss_agg_mode": mode,
        "optimizer": {"lr": 0.0},
        "entropy_loss_fn_args": {"entropy_coef": 0.01},
    }
    # float32 on every device: on a GPU the default (bf16 autocast) rounds differently per split.
    full = _grads(NativeTrainer(config_factory(algo, trainer={"dtype": "float32"})), exps)
    split_trainer = {"ppo_micro_batch_size_per_gpu": 4, "dtype": "float32"}
    split = _grads(NativeTrainer(config_factory(algo, trainer=split_trainer)), exps)
    dynamic_trainer = {"use_dynamic_bsz": True, "max_token_len_per_gpu": 12, "dtype": "float32"}
    dynamic = _grads(NativeTrainer(config_factory(algo, trainer=dynamic_trainer)), exps)
    assert full.abs().max() > 0
    torch.testing.assert_close(split, full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dynamic, full, atol=1e-5, rtol=1e-4)


def test_rollout_logprobs_and_ppo_epochs(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    exps = _rollouts(tok)
    for e in exps:
        e.logprobs = torch.full((e.response_length,), -3.0)
    config = config_factory(
        {"algorithm_type": "grpo", "repeat_times": 2}, trainer={"use_rollout_logprobs": True, "ppo_epochs": 2}
    )
    metrics = NativeTrainer(config).train_step(exps)
    # old_logprob = -3 differs from the model's log-probs, so the PPO ratio is not 1.
    assert metrics["actor/ppo_kl"] != pytest.approx(0.0, abs=1e-3)


def test_ppo_trains_a_critic(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    config = config_factory({"algorithm_type": "ppo", "optimizer": {"lr": 1e-2}})
    trainer = NativeTrainer(config)
    assert trainer.critic is not None
    exps = _rollouts(tok)
    losses = [trainer.train_step(exps)["critic/vf_loss"] for _ in range(4)]
    assert losses[-1] < losses[0]


def test_dpo_prefers_chosen(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    p = _ids(tok, "pick:")
    exps = [
        Experience(
            tokens=torch.tensor(p),
            prompt_length=len(p),
            chosen=torch.tensor(_ids(tok, " yes")),
            rejected=torch.tensor(_ids(tok, " no")),
            eid=EID(task=i),
        )
        for i in range(2)
    ]
    config = config_factory(
        {"algorithm_type": "dpo", "optimizer": {"lr": 1e-2}}, trainer={"ppo_micro_batch_size_per_gpu": 1}
    )
    trainer = NativeTrainer(config)
    first = trainer.train_step(exps)
    for _ in range(3):
        last = trainer.train_step(exps)
    assert last["actor/dpo_loss"] < first["actor/dpo_loss"]
    assert last["actor/accuracy"] == 1.0


def test_the_step_measures_how_far_the_rollout_logprobs_are_from_the_trainers(
    config_factory, tiny_model_path
):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    exps = _rollouts(tok)
    config = config_factory({"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-2}})
    trainer = NativeTrainer(config)
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        own, _ = forward_logprobs(trainer.model, batch)
    # The engine's log-probs: the trainer's own, 0.25 nats off on every first response token.
    for row, e in enumerate(exps):
        lp = own[row, : e.response_length].clone()
        lp[0] -= 0.25
        e.logprobs = lp
    metrics = trainer.train_step(exps)
    assert metrics["rollout/logprob_diff/max"] == pytest.approx(0.25, abs=1e-4)
    first = sum(1 for _ in exps)
    tokens = sum(e.response_length for e in exps)
    assert metrics["rollout/logprob_diff/mean"] == pytest.approx(0.25 * first / tokens, abs=1e-4)
    assert metrics["rollout/importance_ratio/max"] == pytest.approx(float(torch.tensor(0.25).exp()), abs=1e-3)
    assert metrics["rollout/importance_ratio/min"] == pytest.approx(1.0, abs=1e-4)
    # With use_rollout_logprobs the trainer never computes its own: nothing to compare.
    config = config_factory(
        {"algorithm_type": "grpo", "repeat_times": 2}, trainer={"use_rollout_logprobs": True}
    )
    assert not any(k.startswith("rollout/") for k in NativeTrainer(config).train_step(exps))


def test_temperature_zero_scores_the_models_own_distribution():
    """Greedy rollouts (temperature 0) are scored without any scaling, never divided by zero."""
    from trinity.trainer.forward import response_logits

    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, **_):
            torch.manual_seed(0)
            return type("Out", (), {"logits": torch.randn(*input_ids.shape, 5)})()

    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4]]),
        "attention_mask": torch.ones(1, 4, dtype=torch.long),
        "position_ids": torch.arange(4).unsqueeze(0),
        "response_mask": torch.tensor([[1, 1]]),
        "prompt_length": 2,
    }
    greedy = response_logits(Model(), batch, 0.0)
    assert torch.isfinite(greedy).all()
    assert torch.equal(greedy, response_logits(Model(), batch, 1.0))
    assert torch.allclose(response_logits(Model(), batch, 0.5), 2 * greedy)
