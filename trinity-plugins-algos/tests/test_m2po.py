"""M2PO (``m2po`` policy loss and algorithm type) against Trinity-RFT 0.6's formula written out as
plain float64 loops: the paper's Algorithm 1 as a loop that drops the largest second moment one
token at a time, the surrogate ``-A r`` over the tokens kept divided by every valid token, the
straight-through clamp, and the metrics; hand values from upstream's own tests; masking edge
cases; the algorithm type's defaults and rules; one native training step; a dry run."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import yaml
from algos_testutil import SHAPES, random_mask

from trinity.testing import check_component
from trinity.trainer.micro_batch import micro_batch_weights
from trinity_algos import algorithm_types
from trinity_algos.algorithm_types import ALGORITHM_TYPES, M2POAlgorithm
from trinity_algos.policy_loss import M2POPolicyLossFn
from trinity_algos.policy_loss.m2po import m2po_select

# -- Trinity-RFT 0.6's M2PO, written out ------------------------------------------------------


def upstream_m2po(lp, old, adv, mask, threshold=0.04, clip=20.0):
    """Upstream's loss on nested lists: (loss, d loss / d logprob per token, metrics, kept mask)."""
    cells = [(i, j) for i in range(len(mask)) for j in range(len(mask[0])) if mask[i][j]]
    lr = {c: lp[c[0]][c[1]] - old[c[0]][c[1]] for c in cells}
    a = {c: adv[c[0]][c[1]] for c in cells}
    trust = [c for c in cells if (a[c] > 0 and lr[c] > 0) or (a[c] < 0 and lr[c] < 0)]
    m2 = {c: lr[c] ** 2 for c in trust}
    active = list(trust)  # row-major order
    before = sum(m2.values()) / len(trust) if trust else 0.0
    while active and sum(m2[c] for c in active) / len(active) > threshold:
        top = max(m2[c] for c in active)
        # of equal largest values drop the last: a stable ascending sort keeps the earlier ones
        active.remove([c for c in active if m2[c] == top][-1])
    after = sum(m2[c] for c in active) / len(active) if active else 0.0
    kept = set(cells) - (set(trust) - set(active))
    n = len(cells)
    ratio = {c: math.exp(max(-clip, min(clip, lr[c]))) for c in cells}
    loss = sum(-a[c] * ratio[c] for c in kept) / n if n else 0.0
    grad = [[0.0] * len(mask[0]) for _ in mask]
    for c in kept:
        grad[c[0]][c[1]] = -a[c] * ratio[c] / n  # straight-through: d exp(clamp(x))/dx = exp(clamp(x))
    metrics = {
        "pg_loss": loss,
        "ppo_kl": sum(-max(-clip, min(clip, lr[c])) for c in cells) / n if n else 0.0,
        "ratio/mean": sum(ratio.values()) / n if n else 0.0,
        "m2po/m2_before": before,
        "m2po/m2_after": after,
        "m2po/masked_fraction": (len(trust) - len(active)) / n if n else 0.0,
        "m2po/trust_region_fraction": len(trust) / n if n else 0.0,
    }
    keep = [[(i, j) in kept for j in range(len(mask[0]))] for i in range(len(mask))]
    return loss, grad, metrics, keep


def random_inputs(shape, seed, scale):
    b, t = shape
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(b, t, g)
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logprob - scale * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    adv[torch.rand(b, t, generator=g) < 0.1] = 0.0  # A = 0 is never in the trust region
    return logprob, old, adv, mask


def check_matches_upstream(logprob, old, adv, mask, **args):
    lp = logprob.clone().requires_grad_(True)
    loss, metrics = M2POPolicyLossFn(**args)(lp, old_logprob=old, action_mask=mask, advantages=adv)
    loss.backward()
    names = {"m2_threshold": "threshold", "log_ratio_clip": "clip"}
    ref_loss, ref_grad, ref_metrics, ref_keep = upstream_m2po(
        *(x.tolist() for x in (logprob, old, adv, mask)), **{names[k]: v for k, v in args.items()}
    )
    assert loss.item() == pytest.approx(ref_loss, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert metrics.keys() == ref_metrics.keys()
    for name, value in ref_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    keep, _ = m2po_select(logprob - old, mask, adv, args.get("m2_threshold", 0.04))
    assert keep.tolist() == ref_keep
    return metrics


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scale", [0.05, 0.3, 2.0])
@pytest.mark.parametrize("threshold", [0.0, 0.04, 1.0])
def test_matches_trinity_rft_on_random_inputs(shape, scale, threshold):
    for seed in range(3):
        check_matches_upstream(*random_inputs(shape, seed, scale), m2_threshold=threshold)


def test_the_random_cases_cover_no_masking_some_and_all():
    small = check_matches_upstream(*random_inputs((16, 33), 0, 0.05), m2_threshold=0.04)
    assert small["m2po/masked_fraction"] == 0.0 and small["m2po/m2_after"] == small["m2po/m2_before"]
    some = check_matches_upstream(*random_inputs((16, 33), 0, 2.0), m2_threshold=0.04)
    assert 0.0 < some["m2po/masked_fraction"] < some["m2po/trust_region_fraction"]
    assert some["m2po/m2_after"] <= 0.04 < some["m2po/m2_before"]
    every = check_matches_upstream(*random_inputs((16, 33), 0, 2.0), m2_threshold=0.0)
    assert every["m2po/masked_fraction"] == pytest.approx(every["m2po/trust_region_fraction"])


def test_large_ratios_are_clamped_in_value_not_in_gradient():
    logprob, old, adv, mask = random_inputs((5, 4), 1, 0.3)
    logprob[0, 0], old[0, 0], adv[0, 0], mask[0, 0] = 5.0, -25.0, 1.0, 1.0  # log r = 30 > 20
    logprob[1, 1], old[1, 1], adv[1, 1], mask[1, 1] = -30.0, -2.0, -0.5, 1.0  # log r = -28
    check_matches_upstream(logprob, old, adv, mask, m2_threshold=1e6)  # nothing dropped
    check_matches_upstream(logprob, old, adv, mask, m2_threshold=0.04, log_ratio_clip=3.0)


# -- hand values (Trinity-RFT's own test cases) ------------------------------------------------


def test_drops_the_largest_trust_region_token_until_the_budget_holds():
    log_ratio = torch.tensor([[0.1, 0.2, 0.3]])
    keep, stats = m2po_select(log_ratio, torch.ones(1, 3), torch.ones(1, 3), 0.04)
    assert keep.tolist() == [[True, True, False]]
    assert stats["m2_before"] == pytest.approx((0.01 + 0.04 + 0.09) / 3)
    assert stats["m2_after"] == pytest.approx(0.025)
    assert stats["masked_fraction"] == pytest.approx(1 / 3)


def test_only_the_ppo_clipping_quadrants_are_constrained():
    # (A < 0, r > 1) and (A > 0, r < 1) keep their update whatever their second moment
    log_ratio = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])
    keep, stats = m2po_select(log_ratio, torch.ones(1, 4), adv, 0.1)
    assert keep.tolist() == [[True, True, False, False]]
    assert stats["trust_region_fraction"] == 0.5


def test_dropped_tokens_keep_their_place_in_the_denominator():
    logprob = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss, metrics = M2POPolicyLossFn(m2_threshold=0.1)(
        logprob, old_logprob=torch.zeros(1, 2), action_mask=torch.ones(1, 2), advantages=torch.ones(1, 2)
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.5, 0.0]]))
    assert metrics["m2po/masked_fraction"] == pytest.approx(0.5)


def test_equal_second_moments_keep_the_earlier_token():
    # (values exact in binary floating point)
    keep, _ = m2po_select(torch.full((2, 2), 0.5), torch.ones(2, 2), torch.ones(2, 2), 0.25)
    assert keep.all()  # mean exactly at the threshold: nothing to drop
    keep, stats = m2po_select(torch.full((2, 2), 0.5), torch.ones(2, 2), torch.ones(2, 2), 0.24)
    assert keep.tolist() == [[False, False], [False, False]]
    assert stats["m2_after"] == 0.0
    values = torch.tensor([[0.5, 1.0, 1.0, 1.0]])  # budget for one 1.0 beside the 0.5: the first
    keep, _ = m2po_select(values, torch.ones(1, 4), torch.ones(1, 4), (0.25 + 1.0) / 2)
    assert keep.tolist() == [[True, True, False, False]]


# -- masking edge cases -----------------------------------------------------------------------


def test_no_valid_token_gives_zero_loss_gradient_and_metrics():
    logprob = torch.tensor([[1.0, -1.0]], requires_grad=True)
    loss, metrics = M2POPolicyLossFn()(
        logprob, old_logprob=torch.zeros(1, 2), action_mask=torch.zeros(1, 2), advantages=torch.ones(1, 2)
    )
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logprob.grad, torch.zeros(1, 2))
    assert set(metrics.values()) == {0.0}


def test_padding_with_infinite_logprobs_never_reaches_the_gradient():
    logprob = torch.tensor([[-0.5, -math.inf], [-1.0, -0.2]], requires_grad=True)
    old = torch.tensor([[-0.7, -1.0], [math.nan, -0.1]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, metrics = M2POPolicyLossFn()(
        logprob, old_logprob=old, action_mask=mask, advantages=torch.ones(2, 2)
    )
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logprob.grad).all()
    assert logprob.grad[0, 1] == 0.0 and logprob.grad[1, 0] == 0.0
    assert all(math.isfinite(v) for v in metrics.values())


def test_a_non_finite_ratio_on_a_trained_token_is_an_error():
    with pytest.raises(ValueError, match="1 trained token"):
        M2POPolicyLossFn()(
            torch.tensor([[math.nan, 0.0]]),
            old_logprob=torch.zeros(1, 2),
            action_mask=torch.ones(1, 2),
            advantages=torch.ones(1, 2),
        )


def test_a_given_mask_is_used_as_given():
    logprob, old, adv, mask = random_inputs((8, 7), 2, 2.0)
    selected, _ = m2po_select(logprob - old, mask, adv, 0.04)
    fn = M2POPolicyLossFn()
    own = fn(logprob, old_logprob=old, action_mask=mask, advantages=adv)
    given = fn(logprob, old_logprob=old, action_mask=mask, advantages=adv, m2po_mask=selected)
    assert given[0].item() == own[0].item() and given[1] == pytest.approx(own[1])
    # a different mask changes the loss (it is not recomputed)
    everything = fn(logprob, old_logprob=old, action_mask=mask, advantages=adv, m2po_mask=mask.bool())
    assert everything[0].item() != pytest.approx(own[0].item())
    assert everything[1]["m2po/masked_fraction"] == 0.0
    with pytest.raises(ValueError, match="outside action_mask"):
        fn(logprob, old_logprob=old, action_mask=mask, advantages=adv, m2po_mask=torch.ones(8, 7))
    with pytest.raises(ValueError, match="shape"):
        fn(logprob, old_logprob=old, action_mask=mask, advantages=adv, m2po_mask=torch.ones(8, 6))


def test_a_whole_batch_mask_over_micro_batches_gives_the_whole_batch_loss():
    # What upstream's global pre-pass does: one selection over the batch, each token counted once in
    # the batch's denominator; here the trainer's token-share weights give that denominator.
    logprob, old, adv, mask = random_inputs((8, 7), 4, 0.2)
    selected, _ = m2po_select(logprob - old, mask, adv, 0.04)
    fn = M2POPolicyLossFn()
    full_lp = logprob.clone().requires_grad_(True)
    full, _ = fn(full_lp, old_logprob=old, action_mask=mask, advantages=adv)
    full.backward()
    groups = [[0, 1, 2], [3, 4], [5, 6, 7]]
    acc_lp = logprob.clone().requires_grad_(True)
    total = 0.0
    for rows, weight in zip(groups, micro_batch_weights(mask, groups, "token-mean")):
        idx = torch.tensor(rows)
        part, _ = fn(
            acc_lp[idx],
            old_logprob=old[idx],
            action_mask=mask[idx],
            advantages=adv[idx],
            m2po_mask=selected[idx],
        )
        total = total + weight * part
    total.backward()
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(acc_lp.grad, full_lp.grad, rtol=1e-12, atol=1e-15)
    # without the whole-batch mask each micro-batch selects on its own: other tokens, another loss
    own = [
        m2po_select((logprob - old)[idx], mask[idx], adv[idx], 0.04)[0] for idx in map(torch.tensor, groups)
    ]
    assert not torch.equal(torch.cat(own), selected)
    per_call = sum(
        w * fn(logprob[idx], old_logprob=old[idx], action_mask=mask[idx], advantages=adv[idx])[0]
        for idx, w in zip(map(torch.tensor, groups), micro_batch_weights(mask, groups, "token-mean"))
    )
    assert per_call.item() != pytest.approx(full.item())


@pytest.mark.parametrize(
    "args,match",
    [
        ({"m2_threshold": -0.01}, "m2_threshold"),
        ({"m2_threshold": math.nan}, "m2_threshold"),
        ({"log_ratio_clip": math.inf}, "log_ratio_clip"),
        ({"log_ratio_clip": 0.0}, "log_ratio_clip"),
        ({"loss_agg_mode": "seq-mean-token-mean"}, "token-mean"),
    ],
)
def test_rejects_invalid_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        M2POPolicyLossFn(**args)


def test_conformance_and_defaults():
    check_component("policy_loss_fn", M2POPolicyLossFn)
    assert M2POPolicyLossFn.default_args() == {
        "m2_threshold": 0.04,
        "loss_agg_mode": "token-mean",
        "log_ratio_clip": 20.0,
    }


# -- the algorithm type -----------------------------------------------------------------------


def test_algorithm_type_has_trinity_rft_defaults():
    assert ALGORITHM_TYPES["m2po"] is M2POAlgorithm
    assert M2POAlgorithm.default_config() == {
        "repeat_times": 8,
        "advantage_fn": "grpo",
        "sample_strategy": "default",
        "policy_loss_fn": "m2po",
        "kl_penalty_fn": "none",
        "kl_loss_fn": "none",
        "entropy_loss_fn": "none",
    }
    assert not M2POAlgorithm.use_reference and not M2POAlgorithm.use_critic


def _config(factory, algorithm=None, **trainer):
    algorithm = {"algorithm_type": "m2po", **(algorithm or {})}
    return factory(algorithm, trainer={"use_rollout_logprobs": True, **trainer})


@pytest.fixture
def config_factory(algos_manager, tiny_model, tmp_path):
    from trinity.config import resolve_config
    from trinity.config.validation import validate_config

    model = str(tiny_model(hidden_size=32, num_layers=2))

    def factory(algorithm, trainer):
        data = {
            "mode": "train",
            "project": "test",
            "name": "m2po",
            "checkpoint_root_dir": str(tmp_path / "ckpt"),
            "model": {"model_path": model, "max_prompt_tokens": 16, "max_response_tokens": 16},
            "algorithm": algorithm,
            "buffer": {
                "batch_size": 2,
                "trainer_input": {
                    "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
                },
            },
            "trainer": {"trainer_type": "native", **trainer},
        }
        return resolve_config(validate_config(data))

    return factory


def test_the_ratio_must_be_against_the_rollout_policy(config_factory):
    from trinity.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer\.use_rollout_logprobs: true"):
        _config(config_factory, use_rollout_logprobs=False)
    # the rule follows the loss into other algorithm types
    for other in ("grpo", "reinforceplusplus"):
        with pytest.raises(ConfigError, match=r"trainer\.use_rollout_logprobs: true"):
            config_factory({"algorithm_type": other, "policy_loss_fn": "m2po"}, trainer={})
    config = _config(config_factory)
    assert (config.algorithm.policy_loss_fn, config.algorithm.repeat_times) == ("m2po", 8)
    assert config.algorithm.policy_loss_fn_args == M2POPolicyLossFn.default_args()


def test_rollout_correction_bypass_mode_also_gives_the_rollout_logprobs():
    from types import SimpleNamespace

    def stand_in(correction):
        algorithm = SimpleNamespace(
            algorithm_type="m2po", repeat_times=8, policy_loss_fn="m2po", rollout_correction=correction
        )
        return SimpleNamespace(algorithm=algorithm, trainer=SimpleNamespace(use_rollout_logprobs=False))

    M2POAlgorithm.check_config(stand_in({"bypass_mode": True}))
    for off in ({"bypass_mode": False}, None):
        with pytest.raises(ValueError, match="use_rollout_logprobs"):
            M2POAlgorithm.check_config(stand_in(off))


def test_a_split_step_is_warned_about_once(config_factory, caplog, monkeypatch):
    monkeypatch.setattr(algorithm_types, "_M2PO_WARNED", set())
    caplog.set_level(logging.WARNING, logger="trinity_algos.algorithm_types")
    # 16 experiences x 32 tokens fit a 512-token micro-batch: the selection is over the whole step
    _config(config_factory, max_token_len_per_gpu=512)
    _config(config_factory, use_dynamic_bsz=False)
    assert "m2po" not in caplog.text
    _config(config_factory, max_token_len_per_gpu=64)
    _config(config_factory, max_token_len_per_gpu=64)
    assert caplog.text.count("within each micro-batch") == 1
    assert "raise trainer.max_token_len_per_gpu to 512" in caplog.text
    caplog.clear()
    _config(config_factory, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=4)
    assert "leave trainer.ppo_micro_batch_size_per_gpu unset" in caplog.text


def test_one_native_step_uses_the_rollout_logprobs(config_factory):
    from transformers import AutoTokenizer

    from trinity.testing.conformance import make_rollouts
    from trinity.trainer.batch import build_batch, to_device
    from trinity.trainer.forward import forward_logprobs
    from trinity.trainer.native import NativeTrainer

    config = _config(config_factory, {"repeat_times": 2}, use_dynamic_bsz=False)
    trainer = NativeTrainer(config)
    tok = AutoTokenizer.from_pretrained(config.model.model_path)
    exps = make_rollouts(tok)
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        own, _ = forward_logprobs(trainer.model, batch)
    # Stale rollouts: the sampling policy gave every token 1 nat less than the trainer does now, so
    # r = e on every token, and the rewarded responses (A > 0) are all in the trust region, with
    # M2 = 1 > 0.04: all of them are dropped; the unrewarded ones (A < 0, r > 1) keep their update.
    for row, e in enumerate(exps):
        e.logprobs = own[row, : e.response_length].clone() - 1.0
    metrics = trainer.train_step(exps)
    rewarded = sum(e.response_length for e in exps if e.reward == 1.0)
    total = sum(e.response_length for e in exps)
    assert metrics["actor/m2po/trust_region_fraction"] == pytest.approx(rewarded / total)
    assert metrics["actor/m2po/masked_fraction"] == pytest.approx(rewarded / total)
    assert metrics["actor/m2po/m2_before"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["actor/ppo_kl"] == pytest.approx(-1.0, abs=1e-4)


def test_trinity_run_dry_run_names_m2po(algos_manager, tmp_path, tiny_model):
    from click.testing import CliRunner

    from trinity.cli import cli
    from trinity.testing.jobs import tiny_job

    job = tiny_job(
        tmp_path,
        algorithm={
            "algorithm_type": "m2po",
            "repeat_times": 4,
            "policy_loss_fn_args": {"m2_threshold": 0.02},
        },
        trainer={"use_rollout_logprobs": True},
    )
    job["model"]["model_path"] = str(tiny_model(hidden_size=32, num_layers=2))
    # The trainer's half of a decoupled job, as Trinity-RFT's m2po_gsm8k/trainer.yaml (its workflows
    # come from another plugin).
    job["mode"] = "train"
    del job["buffer"]["explorer_input"]
    path = tmp_path / "m2po.yaml"
    path.write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(cli, ["run", "--config", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output[-2000:]
    assert "policy_loss_fn: m2po" in result.output and "m2_threshold: 0.02" in result.output
