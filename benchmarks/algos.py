"""Benchmark: GRPO advantage + PPO policy loss + k2 KL loss through trinity-plugins-algos, against
the same math written directly in torch (no framework), on one realistic batch on CPU.

    python benchmarks/algos.py [--batch 256] [--length 1024] [--repeats 20] [--threads 2]

Prints the median time of each path, their ratio (framework / plain; also best-of-N), and the largest absolute
difference between the two losses and advantages (they must agree).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trinity_algos.advantage import GRPOAdvantageFn
from trinity_algos.kl import K2KLFn
from trinity_algos.policy_loss import PPOPolicyLossFn


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


if __name__ == "__main__":
    main()
