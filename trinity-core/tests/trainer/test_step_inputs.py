"""What the trainer hands the components beyond the basics: step-wise ids, teacher log-probs,
log-probs / entropy computed *before* the advantage when it asks, the training step, and the
expert mask for the entropy loss."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from trinity import hookimpl
from trinity.algorithm import AdvantageFn, EntropyLossFn, PolicyLossFn
from trinity.experience import EID, Experience
from trinity.testing.plugins import registered_plugin
from trinity.trainer.batch import build_batch, to_device
from trinity.trainer.components import MissingInputError
from trinity.trainer.forward import forward_logprobs, nec_from_logits, response_logits
from trinity.trainer.native import NativeTrainer


def _exp(task: int, run: int, step: int, n_prompt: int = 2, n_resp: int = 3, **kw) -> Experience:
    return Experience(
        tokens=torch.arange(n_prompt + n_resp) + 5,
        prompt_length=n_prompt,
        reward=float(run),
        eid=EID(batch=7, task=task, run=run, step=step),
        **kw,
    )


def test_step_wise_experiences_get_trajectory_and_step_ids():
    exps = [_exp(0, 0, 0), _exp(0, 0, 1), _exp(0, 1, 0), _exp(1, 0, 0), _exp(0, 1, 1), _exp(0, 1, 2)]
    batch = build_batch(exps)
    assert batch["group_ids"].tolist() == [0, 0, 0, 1, 0, 0]
    assert batch["trajectory_ids"].tolist() == [0, 0, 1, 2, 1, 1]
    assert batch["step_ids"].tolist() == [0, 1, 0, 0, 1, 2]
    assert "teacher_logprobs" not in batch


def test_teacher_logprobs_are_padded_like_the_response_and_only_when_every_row_has_them():
    a = _exp(0, 0, 0, n_resp=3, teacher_logprobs=[-0.1, -0.2, -0.3])
    b = _exp(0, 1, 0, n_resp=1, teacher_logprobs=[-0.5])
    batch = build_batch([a, b])
    assert torch.allclose(batch["teacher_logprobs"], torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0]]))
    assert "teacher_logprobs" not in build_batch([a, _exp(0, 2, 0)])
    with pytest.raises(ValueError, match="teacher_logprobs has 2 entries"):
        _exp(0, 0, 0, n_resp=3, teacher_logprobs=[-0.1, -0.2])
    blob = Experience.deserialize(a.serialize())
    assert torch.equal(blob.teacher_logprobs, a.teacher_logprobs)


SEEN: dict[str, list] = {}


class _PeekAdvantage(AdvantageFn):
    """Records what it was given; advantage = the reward on every valid token."""

    required_inputs = ("old_logprob", "old_entropy", "old_nec")

    def __call__(self, batch):
        for name in self.required_inputs:
            SEEN.setdefault(name, []).append(batch[name].detach().cpu().clone())
        adv = batch["rewards"].unsqueeze(-1) * batch["action_mask"]
        batch["advantages"], batch["returns"] = adv, adv.clone()
        return batch, {}


class _TeacherAdvantage(AdvantageFn):
    required_inputs = ("teacher_logprobs",)

    def __call__(self, batch):
        raise AssertionError("never called without teacher_logprobs")


class _StepLoss(PolicyLossFn):
    def __call__(self, logprob, action_mask, advantages, **kwargs):
        SEEN.setdefault("global_step", []).append(kwargs.get("global_step"))
        return -(logprob * advantages * action_mask).sum() / action_mask.sum(), {}


class _MaskEntropy(EntropyLossFn):
    def __call__(self, entropy, action_mask, loss_agg_mode="token-mean", expert_mask=None, **kwargs):
        SEEN.setdefault("expert_mask", []).append(None if expert_mask is None else expert_mask.tolist())
        return entropy.sum() * 0.0, {}


class _Plugin:
    @hookimpl
    def register_advantage_fns(self, register):
        register("peek", _PeekAdvantage)
        register("needs_teacher", _TeacherAdvantage)

    @hookimpl
    def register_policy_loss_fns(self, register):
        register("step_loss", _StepLoss)

    @hookimpl
    def register_entropy_loss_fns(self, register):
        register("mask_entropy", _MaskEntropy)


@pytest.fixture
def plugin():
    SEEN.clear()
    with registered_plugin(_Plugin(), "step-inputs-test"):
        yield


def _rollouts(tok) -> list[Experience]:
    exps = []
    for run, (text, reward) in enumerate([(" 4", 1.0), (" 5!?", 0.0)]):
        p = tok("2+2=", add_special_tokens=False)["input_ids"]
        r = tok(text, add_special_tokens=False)["input_ids"]
        exps.append(
            Experience(
                tokens=torch.tensor(p + r),
                prompt_length=len(p),
                reward=reward,
                eid=EID(batch=0, task=0, run=run),
                info={"is_expert": run == 1},
            )
        )
    return exps


def test_advantage_gets_the_policys_logprobs_and_entropy_before_the_update(
    plugin, config_factory, tiny_model_path
):
    config = config_factory(
        {
            "algorithm_type": "grpo",
            "advantage_fn": "peek",
            "policy_loss_fn": "step_loss",
            "kl_loss_fn": "none",
            "entropy_loss_fn": "mask_entropy",
            "entropy_loss_fn_args": {"entropy_coef": 0.5},
        }
    )
    trainer = NativeTrainer(config)
    exps = _rollouts(AutoTokenizer.from_pretrained(tiny_model_path))
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        want_lp, want_ent = forward_logprobs(trainer.model, batch, entropy="detached")
        want_nec = nec_from_logits(response_logits(trainer.model, batch))
    trainer.train_step(exps)
    trainer.train_step(exps)
    mask = batch["action_mask"].cpu().bool()
    assert torch.allclose(SEEN["old_logprob"][0][mask], want_lp.cpu()[mask], atol=1e-5)
    assert torch.allclose(SEEN["old_entropy"][0][mask], want_ent.cpu()[mask], atol=1e-5)
    assert torch.allclose(SEEN["old_nec"][0][mask], want_nec.cpu()[mask], atol=1e-5)
    # The second step sees the updated policy, not the first step's numbers again.
    assert not torch.allclose(SEEN["old_logprob"][1][mask], SEEN["old_logprob"][0][mask])
    assert SEEN["global_step"] == [1, 2]
    assert SEEN["expert_mask"] == [[False, True], [False, True]]


def test_an_advantage_without_its_teacher_logprobs_is_a_clear_error(plugin, config_factory, tiny_model_path):
    config = config_factory(
        {"algorithm_type": "grpo", "advantage_fn": "needs_teacher", "policy_loss_fn": "step_loss"}
    )
    trainer = NativeTrainer(config)
    with pytest.raises(
        MissingInputError, match=r"advantage_fn 'needs_teacher' needs 'teacher_logprobs'.*workflow"
    ):
        trainer.train_step(_rollouts(AutoTokenizer.from_pretrained(tiny_model_path)))


def test_nec_is_the_policys_expectation_of_the_clip_v_signal():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    got = nec_from_logits(logits)
    for b in range(2):
        for t in range(3):
            p = torch.softmax(logits[b, t], -1).tolist()
            h = -sum(q * math.log(q) for q in p)
            want = sum(q * (q * (h + math.log(q))) for q in p)  # E_v[ p_v (H + log p_v) ]
            assert abs(float(got[b, t]) - want) < 1e-12
