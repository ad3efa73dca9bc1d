"""The algorithm runtime both back-ends share (``trinity.trainer.components``): one actor loss,
the ``none`` rules, and clear errors for missing inputs, in the native and the veRL paths."""

from __future__ import annotations

import pickle

import pytest
import torch
from transformers import AutoTokenizer

from trinity import hookimpl, plugins
from trinity.algorithm import NoEntropyLossFn, NoKLFn, PolicyLossFn
from trinity.experience import EID, Experience
from trinity.trainer.batch import build_batch, to_device
from trinity.trainer.components import AlgorithmComponents, MissingInputError
from trinity.trainer.forward import forward_logprobs
from trinity.trainer.native import NativeTrainer
from trinity.trainer.verl.dataproto import VERL_TO_TRINITY, verl_tensors
from trinity.trainer.verl.loss import ActorLoss


def _rollouts(tok, logprobs: bool = True) -> list[Experience]:
    exps = []
    for task in range(2):
        for run, (text, reward) in enumerate([(" 4", 1.0), (" 5!?", 0.0)]):
            p = tok(f"2+2={task}", add_special_tokens=False)["input_ids"]
            r = tok(text, add_special_tokens=False)["input_ids"]
            exps.append(
                Experience(
                    tokens=torch.tensor(p + r),
                    prompt_length=len(p),
                    reward=reward,
                    logprobs=-torch.rand(len(r)) if logprobs else None,
                    eid=EID(batch=0, task=task, run=run),
                )
            )
    exps[1].action_mask = torch.ones(exps[1].response_length, dtype=torch.long)
    exps[1].action_mask[0] = 0  # a tool token: out of the loss
    return exps


def _grpo(config_factory, **trainer):
    return config_factory(
        {
            "algorithm_type": "grpo",
            "repeat_times": 2,
            "kl_loss_fn": "low_var_kl",
            "kl_loss_fn_args": {"kl_coef": 0.1},
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
        },
        trainer=trainer,
    )


def _step_inputs(trainer: NativeTrainer, exps: list[Experience]):
    """A batch with every tensor the loss reads, and the model's log-probs/entropy on it."""
    batch = build_batch(exps, trainer.pad_token_id)
    shape = batch["action_mask"].shape
    gen = torch.Generator().manual_seed(0)
    batch = batch.with_(
        old_logprob=-torch.rand(shape, generator=gen),
        ref_logprob=-torch.rand(shape, generator=gen),
        advantages=torch.randn(shape, generator=gen),
        returns=torch.randn(shape, generator=gen),
    )
    batch = to_device(batch, trainer.device)  # where the trainer runs (a GPU when there is one)
    logprob, entropy = forward_logprobs(trainer.model, batch, entropy="grad")
    return batch, logprob, entropy


def _grads(loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def test_both_backends_loss_paths_give_the_same_loss_and_gradients(config_factory, tiny_model_path):
    config = _grpo(config_factory)
    trainer = NativeTrainer(config)
    batch, logprob, entropy = _step_inputs(trainer, _rollouts(AutoTokenizer.from_pretrained(tiny_model_path)))

    # Native: the whole micro-batch, as NativeTrainer.update_actor hands it over.
    native_loss, native_metrics = trainer._actor_loss(logprob, entropy, batch)
    # veRL: the loss shipped to a worker as names, fed the tensors the worker receives (veRL's
    # key names mapped back, what ActorLoss.__call__ does after unpadding).
    loss_fn = pickle.loads(pickle.dumps(ActorLoss.from_config(config)))
    sent = verl_tensors(batch)
    tensors = {VERL_TO_TRINITY[k]: v for k, v in sent.items() if k in VERL_TO_TRINITY}
    tensors["action_mask"] = tensors["action_mask"].to(logprob.dtype)
    verl_loss, verl_metrics = loss_fn.compute(logprob, entropy, tensors)

    assert torch.equal(native_loss, verl_loss)
    torch.testing.assert_close(
        _grads(verl_loss, trainer.model), _grads(native_loss, trainer.model), rtol=0, atol=0
    )
    assert _grads(native_loss, trainer.model).abs().max() > 0
    assert native_metrics == {f"actor/{k}": v for k, v in verl_metrics.items()}
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/entropy"} <= set(native_metrics)


def test_a_missing_ref_logprob_names_the_component_in_both_backends(config_factory, tiny_model_path):
    config = _grpo(config_factory)
    trainer = NativeTrainer(config)
    batch, logprob, entropy = _step_inputs(trainer, _rollouts(AutoTokenizer.from_pretrained(tiny_model_path)))
    batch = batch.with_(ref_logprob=None)
    expected = "kl_loss_fn 'low_var_kl' needs 'ref_logprob'"
    with pytest.raises(MissingInputError, match=expected):
        trainer._actor_loss(logprob, entropy, batch)
    sent = verl_tensors(batch)
    tensors = {VERL_TO_TRINITY[k]: v for k, v in sent.items() if k in VERL_TO_TRINITY}
    with pytest.raises(MissingInputError, match=expected):
        ActorLoss.from_config(config).compute(logprob, entropy, tensors)


def test_a_kl_term_without_a_reference_model_fails_at_construction(config_factory):
    # dapo declares no reference model: a KL loss would silently do nothing.
    config = config_factory({"algorithm_type": "dapo", "repeat_times": 2, "kl_loss_fn": "k2"})
    with pytest.raises(MissingInputError, match=r"kl_loss_fn 'k2' needs 'ref_logprob'.*'dapo'"):
        NativeTrainer(config)
    with pytest.raises(MissingInputError, match="kl_loss_fn 'k2'"):
        AlgorithmComponents.from_config(config.algorithm)


def test_rollout_logprobs_that_are_missing_are_an_error_when_needed(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    config = config_factory(
        {"algorithm_type": "grpo", "repeat_times": 2}, trainer={"use_rollout_logprobs": True}
    )
    exps = _rollouts(tok)
    exps[2].logprobs = None
    with pytest.raises(
        MissingInputError, match=r"policy_loss_fn 'ppo' needs 'old_logprob'.*use_rollout_logprobs"
    ):
        NativeTrainer(config).train_step(exps)


def test_sft_needs_no_old_logprob_even_with_rollout_logprobs_set(config_factory, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    config = config_factory({"algorithm_type": "sft"}, trainer={"use_rollout_logprobs": True})
    trainer = NativeTrainer(config)
    assert not trainer.components.needs_old_logprob
    p, r = (
        tok("Q: hi\nA:", add_special_tokens=False)["input_ids"],
        tok(" hello", add_special_tokens=False)["input_ids"],
    )
    metrics = trainer.train_step([Experience(tokens=torch.tensor(p + r), prompt_length=len(p))])
    assert "actor/sft_loss" in metrics


def test_none_and_unset_are_the_null_components(config_factory):
    from trinity_algos.entropy import NoEntropyLossFn as PluginNoEntropy
    from trinity_algos.kl import NoKLFn as PluginNoKL

    assert PluginNoKL is NoKLFn and PluginNoEntropy is NoEntropyLossFn  # one class, registered as `none`
    sft = AlgorithmComponents.from_config(config_factory({"algorithm_type": "sft"}).algorithm)
    assert isinstance(sft.kl_loss_fn, NoKLFn) and isinstance(sft.kl_penalty_fn, NoKLFn)
    assert isinstance(sft.entropy_loss_fn, NoEntropyLossFn)
    assert not (sft.uses_kl_loss or sft.uses_kl_penalty or sft.uses_entropy_bonus or sft.needs_ref_logprob)
    grpo = AlgorithmComponents.from_config(
        config_factory({"algorithm_type": "grpo", "repeat_times": 2}).algorithm
    )
    # grpo's default entropy_coef is 0: a bonus that adds nothing is off.
    assert grpo.uses_kl_loss and not grpo.uses_entropy_bonus and grpo.use_reference


class _Loss(PolicyLossFn):
    def __call__(self, logprob, action_mask, **kwargs):
        return (logprob * action_mask).mean(), {}


def test_none_works_without_the_plugin_that_registers_it():
    class OnlyALoss:
        @hookimpl
        def register_policy_loss_fns(self, register):
            register("mine", _Loss)

    manager = plugins.TrinityPluginManager(autoload=False)
    manager.register_plugin(OnlyALoss(), "only-a-loss")
    previous = plugins.set_manager(manager)
    try:
        comps = AlgorithmComponents.from_spec(
            {
                "policy_loss_fn": "mine",
                "kl_loss_fn": "none",
                "entropy_loss_fn": "none",
                "kl_penalty_fn": "none",
            }
        )
        assert isinstance(comps.kl_loss_fn, NoKLFn) and isinstance(comps.entropy_loss_fn, NoEntropyLossFn)
        logprob = torch.zeros(2, 3, requires_grad=True)
        loss, metrics = comps.actor_loss(logprob, None, {"action_mask": torch.ones(2, 3)})
        assert float(loss.detach()) == 0.0 and "entropy" not in metrics
        with pytest.raises(plugins.UnknownComponentError):
            AlgorithmComponents.from_spec({"policy_loss_fn": "mine", "kl_loss_fn": "k2"})
    finally:
        plugins.set_manager(previous)


def test_a_policy_loss_input_that_is_missing_names_the_loss():
    comps = AlgorithmComponents(policy_loss_fn=_Loss(), names={"policy_loss_fn": "mine"})
    with pytest.raises(MissingInputError, match="policy_loss_fn 'mine' needs 'action_mask'"):
        comps.actor_loss(torch.zeros(2, 3), None, {})
