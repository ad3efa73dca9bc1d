"""Benchmark: GRPO advantage + PPO policy loss + k2 KL loss through trinity-plugins-algos, against
the same math written directly in torch (no framework), on one realistic batch on CPU; then each
further loss (topr, sft_is, sft_phi, mix, mix_chord, sppo, rec, sapo, importance_sampling, the
corrected_k3 KL loss and the mix entropy bonus) alone, forward and backward, against its own
inline torch version.

    python benchmarks/algos.py [--batch 256] [--length 1024] [--repeats 20] [--threads 2]

Prints the median time of each path, their ratio (framework / plain; also best-of-N), and the largest absolute
difference between the two losses, advantages and gradients (they must agree).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from trinity_algos.advantage import GRPOAdvantageFn
from trinity_algos.entropy import MixEntropyLossFn
from trinity_algos.kl import CorrectedK3KLFn, K2KLFn
from trinity_algos.policy_loss import (
    ImportanceSamplingPolicyLossFn,
    MIXCHORDPolicyLossFn,
    MIXPolicyLossFn,
    PPOPolicyLossFn,
    RECPolicyLossFn,
    SAPOPolicyLossFn,
    SFTISLossFn,
    SFTPhiLossFn,
    SPPOPolicyLossFn,
    TOPRPolicyLossFn,
)


def make_batch(b: int, t: int, group_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logprob = -torch.rand(b, t, generator=g) * 3
    return {
        "rewards": torch.randint(0, 2, (b,), generator=g).float(),
        "group_ids": torch.arange(b) // group_size,
        "action_mask": mask,
        "logprob": logprob,
        "old_logprob": logprob + 0.05 * torch.randn(b, t, generator=g),
        "ref_logprob": logprob + 0.05 * torch.randn(b, t, generator=g),
    }


def framework_step(data, adv_fn, loss_fn, kl_fn):
    batch = {k: data[k] for k in ("rewards", "group_ids", "action_mask")}
    batch, _ = adv_fn(batch)
    logprob = data["logprob"].clone().requires_grad_(True)
    pg_loss, _ = loss_fn(
        logprob,
        old_logprob=data["old_logprob"],
        action_mask=batch["action_mask"],
        advantages=batch["advantages"],
    )
    kl_loss, _ = kl_fn.calculate_kl_loss(logprob, data["ref_logprob"], batch["action_mask"], "token-mean")
    loss = pg_loss + kl_loss
    loss.backward()
    return loss.detach(), batch["advantages"], logprob.grad


def plain_step(data, eps=1e-6, clip=0.2, clip_c=3.0, kl_coef=0.001):
    mask, rewards, ids = data["action_mask"], data["rewards"], data["group_ids"]
    # GRPO (contiguous equal-size groups, as the explorer emits them)
    groups = rewards.double().view(-1, int((ids == 0).sum()))
    scores = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + eps)
    advantages = scores.view(-1, 1).float() * mask
    logprob = data["logprob"].clone().requires_grad_(True)
    # PPO with dual clip, token-mean
    log_ratio = torch.clamp(logprob - data["old_logprob"], -20, 20)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1 - clip, 1 + clip)
    lmax = torch.maximum(l1, l2)
    pg = torch.where(advantages < 0, torch.minimum(-advantages * clip_c, lmax), lmax)
    n = mask.sum()
    pg_loss = (pg * mask).sum() / n
    with torch.no_grad():  # the same metrics the framework reports
        _ = ((l2 > l1).float() * mask).sum() / n, (-log_ratio * mask).sum() / n
    # k2 KL loss
    kl = 0.5 * (logprob - data["ref_logprob"]).square()
    loss = pg_loss + kl_coef * (kl * mask).sum() / n
    loss.backward()
    return loss.detach(), advantages, logprob.grad


def time_alternating(fns, repeats: int) -> list[list[float]]:
    """Run the callables in turn ``repeats`` times; alternating spreads background load on a
    shared machine evenly over both paths instead of biasing whichever ran during a spike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = make_batch(args.batch, args.length, args.group_size)
    adv_fn, loss_fn, kl_fn = GRPOAdvantageFn(), PPOPolicyLossFn(), K2KLFn()

    fw = framework_step(data, adv_fn, loss_fn, kl_fn)
    pl = plain_step(data)
    diffs = [float((a - b).abs().max()) for a, b in zip(fw, pl)]

    fw_times, pl_times = time_alternating(
        [lambda: framework_step(data, adv_fn, loss_fn, kl_fn), lambda: plain_step(data)], args.repeats
    )
    t_fw, t_pl = statistics.median(fw_times), statistics.median(pl_times)
    print(f"batch {args.batch} x {args.length}, groups of {args.group_size}, {args.threads} threads, CPU")
    print(f"trinity_algos (grpo adv + ppo loss + k2 kl, fwd+bwd): {t_fw * 1e3:8.2f} ms")
    print(f"plain torch   (same math)                           : {t_pl * 1e3:8.2f} ms")
    print(
        f"ratio trinity_algos / plain: {t_fw / t_pl:.3f} (median), {min(fw_times) / min(pl_times):.3f} (best)"
    )
    print(f"max |diff|: loss {diffs[0]:.2e}, advantages {diffs[1]:.2e}, grad {diffs[2]:.2e}")
    print()
    bench_losses(data, args.repeats)


# -- each further loss, forward + backward, against inline torch ----------------------------------


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum()


def plain_ppo(logprob, old, adv, mask, clip=0.2, clip_c=3.0):
    log_ratio = torch.clamp(logprob - old, -20, 20)
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    lmax = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.minimum(-adv * clip_c, lmax), lmax)
    loss = token_mean(pg, mask)
    with torch.no_grad():
        metrics = [token_mean((l2 > l1).float(), mask), token_mean((-log_ratio), mask)]
        metrics.append(token_mean(((lmax > -adv * clip_c) & (adv < 0)).float(), mask))
    return loss, metrics


def plain_topr(lp, d):
    with torch.no_grad():
        log_ratio = lp - d["old_logprob"]
        alpha = torch.where(d["advantages"] <= 0, torch.exp(log_ratio.clamp(max=0)), torch.ones_like(lp))
    loss = token_mean(-alpha * d["advantages"] * lp, d["action_mask"])
    with torch.no_grad():
        metrics = [
            token_mean(alpha, d["action_mask"]),
            token_mean(torch.exp(log_ratio.clamp(-20, 20)), d["action_mask"]),
        ]
    return loss, metrics


def plain_sft_is(lp, d):
    return token_mean(-torch.exp(lp.detach()) * lp, d["action_mask"]), []


def plain_sft_phi(lp, d):
    p = torch.exp(lp.detach())
    return token_mean(-(p * (1 - p)) * lp, d["action_mask"]), []


def plain_mix(lp, d, mu=0.1, phi=False):
    """Usual rows first, expert rows last; parts scaled by their own sample counts (one micro-batch)."""
    expert = d["expert_mask"]
    usual = ~expert
    ppo, metrics = plain_ppo(
        lp[usual], d["old_logprob"][usual], d["advantages"][usual], d["action_mask"][usual]
    )
    e_lp = lp[expert]
    weight = torch.exp(e_lp.detach()) * (1 - torch.exp(e_lp.detach())) if phi else 1.0
    sft = token_mean(-weight * e_lp, d["action_mask"][expert])
    return (1 - mu) * ppo + mu * sft, metrics


def plain_sppo(lp, d, eps=0.3):
    log_ratio = lp - d["old_logprob"]
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        inside = ((ratio >= 1 / (1 + eps)) & (ratio <= 1 + eps)).float()
    loss = token_mean(-d["advantages"] * log_ratio * inside, d["action_mask"])
    with torch.no_grad():
        metrics = [token_mean(1 - inside, d["action_mask"]), token_mean(-log_ratio, d["action_mask"])]
    return loss, metrics


def plain_rec(lp, d, el=0.2, eh=0.2, elp=0.6, ehp=2.0, coef=0.1):
    """clip_mode ring, weight importance_sampling, regularizer k2."""
    adv, old, mask = d["advantages"], d["old_logprob"], d["action_mask"]
    with torch.no_grad():
        log_ratio = lp - old
        ratio = torch.exp(log_ratio.clamp(-20, 20))
        keep = (
            ((ratio >= 1 - el) & (ratio <= 1 + eh))
            | ((adv >= 0) & (ratio <= 1 - elp))
            | ((adv <= 0) & (ratio >= 1 + ehp))
        )
        weighted = adv * ratio
    loss = token_mean(-weighted * lp * keep.float() + coef * (lp - old).square(), mask)
    with torch.no_grad():
        metrics = [token_mean((~keep).float(), mask), token_mean(-log_ratio, mask)]
    return loss, metrics


def plain_sapo(lp, d, tau_pos=1.0, tau_neg=1.05):
    adv, mask = d["advantages"], d["action_mask"]
    log_ratio = torch.clamp(lp - d["old_logprob"], -20, 20)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(lp.dtype)
    gate = torch.sigmoid(tau * (ratio - 1)) * (4 / tau)
    loss = token_mean(-adv * gate, mask)
    with torch.no_grad():
        metrics = [token_mean(-log_ratio, mask), token_mean(gate, mask), token_mean(ratio, mask)]
        metrics.append(token_mean((adv > 0).float(), mask))
    return loss, metrics


def plain_is(lp, d):
    log_ratio = torch.clamp(lp - d["old_logprob"], -20, 20)
    ratio = torch.exp(log_ratio)
    loss = token_mean(-d["advantages"] * ratio, d["action_mask"])
    with torch.no_grad():
        metrics = [token_mean(ratio, d["action_mask"]), token_mean(-log_ratio, d["action_mask"])]
    return loss, metrics


def plain_corrected_k3(lp, d, coef=0.001):
    log_r = d["ref_logprob"] - lp
    ratio = torch.exp(torch.clamp(lp - d["old_logprob"], max=math.log(2.0)))
    kl = token_mean(ratio * (torch.exp(log_r) - 1 - log_r), d["action_mask"])
    return kl * coef, [kl.detach()]


def plain_mix_entropy(ent, d, coef=0.01):
    mask = d["action_mask"] * (~d["expert_mask"]).unsqueeze(-1).float()
    value = token_mean(ent, mask)
    return value * coef, [value.detach()]


def loss_cases(data: dict[str, torch.Tensor]) -> list[tuple[str, Callable, Callable, str]]:
    """``(name, framework(x, d), plain(x, d), input)``: ``x`` is the tensor the gradient flows into."""
    b = data["logprob"].shape[0]
    n_expert = b // 4

    def call(fn: Callable) -> Callable:
        return lambda lp, d: fn(
            lp,
            old_logprob=d["old_logprob"],
            action_mask=d["action_mask"],
            advantages=d["advantages"],
            expert_mask=d["expert_mask"],
            global_step=3,
        )

    mix = MIXPolicyLossFn(train_batch_size_usual=b - n_expert, train_batch_size_expert=n_expert)
    chord = MIXCHORDPolicyLossFn(mu_warmup_steps=0, mu_decay_steps=0, mu_peak=0.1, mu_valley=0.1)
    rec = RECPolicyLossFn(
        clip_mode="ring", weight="importance_sampling", regularizer="k2", regularizer_coef=0.1
    )
    kl, entropy = CorrectedK3KLFn(), MixEntropyLossFn(entropy_coef=0.01)
    return [
        ("topr", call(TOPRPolicyLossFn()), plain_topr, "logprob"),
        ("sft_is", call(SFTISLossFn()), plain_sft_is, "logprob"),
        ("sft_phi", call(SFTPhiLossFn()), plain_sft_phi, "logprob"),
        ("mix", call(mix), plain_mix, "logprob"),
        ("mix_chord", call(chord), lambda lp, d: plain_mix(lp, d, phi=True), "logprob"),
        ("sppo", call(SPPOPolicyLossFn()), plain_sppo, "logprob"),
        ("rec", call(rec), plain_rec, "logprob"),
        ("sapo", call(SAPOPolicyLossFn()), plain_sapo, "logprob"),
        ("importance_sampling", call(ImportanceSamplingPolicyLossFn()), plain_is, "logprob"),
        (
            "corrected_k3 (kl)",
            lambda lp, d: kl.calculate_kl_loss(
                lp, d["ref_logprob"], d["action_mask"], "token-mean", old_logprob=d["old_logprob"]
            ),
            plain_corrected_k3,
            "logprob",
        ),
        (
            "mix (entropy)",
            lambda ent, d: entropy(
                ent, d["action_mask"], loss_agg_mode="token-mean", expert_mask=d["expert_mask"]
            ),
            plain_mix_entropy,
            "entropy",
        ),
    ]


def fwd_bwd(fn: Callable, source: torch.Tensor, data: dict[str, torch.Tensor]):
    x = source.clone().requires_grad_(True)
    loss, metrics = fn(x, data)
    # Both paths read their metrics as Python floats, as a trainer logs them.
    _ = [float(v) for v in (metrics.values() if isinstance(metrics, dict) else metrics)]
    loss.backward()
    return loss.detach(), x.grad


def bench_losses(data: dict[str, torch.Tensor], repeats: int) -> None:
    b, t = data["logprob"].shape
    g = torch.Generator().manual_seed(1)
    mask = data["action_mask"]
    d = dict(data)
    # token-level advantages (as after GRPO), experts last (as the mix sample strategy orders them)
    d["advantages"] = torch.randn(b, 1, generator=g) * mask
    d["expert_mask"] = torch.arange(b) >= b - b // 4
    d["entropy"] = torch.rand(b, t, generator=g) * 2
    print(f"each loss alone, fwd+bwd, token-mean, batch {b} x {t}, median over {repeats} (framework / plain)")
    for name, framework, plain, source_key in loss_cases(d):
        source = d[source_key]
        fw, pl = fwd_bwd(framework, source, d), fwd_bwd(plain, source, d)
        diff_loss = float((fw[0] - pl[0]).abs())
        diff_grad = float((fw[1] - pl[1]).abs().max())
        fw_times, pl_times = time_alternating(
            [lambda f=framework, s=source: fwd_bwd(f, s, d), lambda p=plain, s=source: fwd_bwd(p, s, d)],
            repeats,
        )
        t_fw, t_pl = statistics.median(fw_times), statistics.median(pl_times)
        print(
            f"  {name:<20} {t_fw * 1e3:8.2f} ms vs {t_pl * 1e3:8.2f} ms  ratio {t_fw / t_pl:.3f} "
            f"(best {min(fw_times) / min(pl_times):.3f})  max |diff| loss {diff_loss:.1e}, grad {diff_grad:.1e}"
        )


if __name__ == "__main__":
    main()
