"""Native trainer step time against a minimal hand-written PyTorch loop, in the same run.

Both sides train the same locally created model (Qwen2 layout, hidden 256, 4 layers) on the
same batch (16 rows: 32 prompt + 96 response tokens; ``--shape quickstart``: the quickstart's GRPO
batch, 16 tasks x 8 rollouts of 24 prompt + 48 response tokens, on its 128-wide, 2-layer model)
with the same work per step: one forward
pass scoring the response tokens, a PPO-style clipped policy-gradient loss with group-normalised
advantages, backward, gradient clipping, AdamW and a scheduler step. The trainer runs GRPO with
the KL loss off (so, like the baseline, it needs no reference model).

    python benchmarks/train_step.py [--steps 10] [--device cpu|cuda] [--shape default|quickstart]

Prints the median step time of each and the ratio trainer / baseline (target <= 1.10).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from trinity.config import resolve_config
from trinity.config.validation import validate_config
from trinity.experience import EID, Experience
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer.batch import build_batch, to_device
from trinity.trainer.native import NativeTrainer


@dataclass(frozen=True)
class Shape:
    """A batch (rows of prompt + response tokens, rollouts per task) and the model it trains."""

    rows: int
    prompt: int
    response: int
    group: int
    hidden: int
    layers: int
    heads: int


SHAPES = {
    "default": Shape(rows=16, prompt=32, response=96, group=4, hidden=256, layers=4, heads=8),
    # The quickstart's GRPO step: 16 tasks x 8 rollouts, "<think>..</think><answer>..</answer>"
    # answers of about 48 tokens after a 24-token chat prompt, its ~300k-parameter model.
    "quickstart": Shape(rows=128, prompt=24, response=48, group=8, hidden=128, layers=2, heads=4),
}


def make_experiences(vocab: int, shape: Shape, seed: int = 0) -> list[Experience]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(shape.rows):
        tokens = torch.randint(4, vocab, (shape.prompt + shape.response,), generator=g)
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=shape.prompt,
                reward=float(i % 2),
                eid=EID(batch=0, task=i // shape.group, run=i % shape.group),
            )
        )
    return out


def make_trainer(model_path: str, job_root: str, device: str, shape: Shape) -> NativeTrainer:
    config = resolve_config(
        validate_config(
            {
                "mode": "train",
                "checkpoint_root_dir": job_root,
                "model": {
                    "model_path": model_path,
                    "max_prompt_tokens": shape.prompt,
                    "max_response_tokens": shape.response,
                },
                "algorithm": {
                    "algorithm_type": "grpo",
                    "repeat_times": shape.group,
                    "kl_loss_fn": "none",
                    "optimizer": {"lr": 1e-5},
                },
                "buffer": {
                    "batch_size": shape.rows // shape.group,
                    "trainer_input": {
                        "experience_buffer": {
                            "name": "exp",
                            "storage_type": "sql",
                            "path": "sqlite:///unused.db",
                        }
                    },
                },
                "trainer": {"trainer_type": "native", "use_dynamic_bsz": False, "dtype": "auto"},
            }
        )
    )
    return NativeTrainer(config, device=device)


class Baseline:
    """The hand-written loop: what a person would write for one PPO/GRPO step."""

    def __init__(self, model_path: str, device: str, dtype: torch.dtype, shape: Shape) -> None:
        self.shape = shape
        from transformers import AutoModelForCausalLM

        self.device, self.dtype = torch.device(device), dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-5, betas=(0.9, 0.999), weight_decay=0.01, fused=device == "cuda"
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def step(self, batch: dict) -> float:
        ids, mask, rmask = batch["input_ids"], batch["attention_mask"], batch["action_mask"]
        rows, prompt, response = self.shape.rows, self.shape.prompt, self.shape.response
        scores = batch["rewards"].view(-1, self.shape.group)
        adv = ((scores - scores.mean(-1, keepdim=True)) / (scores.std(-1, keepdim=True) + 1e-6)).view(-1, 1)
        ctx = (
            torch.autocast(self.device.type, dtype=self.dtype)
            if self.dtype != torch.float32
            else torch.autocast(self.device.type, enabled=False)
        )
        self.optimizer.zero_grad(set_to_none=True)
        with ctx:
            logits = (
                self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=batch["position_ids"],
                    use_cache=False,
                    logits_to_keep=response + 1,
                )
                .logits[:, :-1]
                .float()
            )
        logp = -torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, prompt:].reshape(-1), reduction="none"
        ).view(rows, -1)
        ratio = torch.exp(logp - logp.detach())
        loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        loss = (loss_mat * rmask).sum() / rmask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach())


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    args = parser.parse_args()
    shape = SHAPES[args.shape]

    with tempfile.TemporaryDirectory() as tmp:
        path = str(
            create_tiny_model(
                f"{tmp}/model", hidden_size=shape.hidden, num_layers=shape.layers, num_heads=shape.heads
            )
        )
        trainer = make_trainer(path, f"{tmp}/ckpt", args.device, shape)
        baseline = Baseline(path, args.device, trainer.compute_dtype, shape)
        exps = make_experiences(trainer.model.config.vocab_size, shape)
        batch = to_device(build_batch(exps, trainer.pad_token_id), args.device)
        times: dict[str, list[float]] = {"trainer": [], "baseline": []}
        # Interleaved, so both sides see the same machine load (other processes, clocks).
        for i in range(args.warmup + args.steps):
            for name in ("baseline", "trainer"):
                _sync(args.device)
                start = time.perf_counter()
                if name == "trainer":
                    trainer.train_step(exps)  # includes building the batch from experiences
                else:
                    baseline.step(batch)
                _sync(args.device)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        print(
            f"device={args.device} dtype={trainer.compute_dtype} rows={shape.rows} tokens/row={shape.prompt + shape.response} "
            f"steps={args.steps} threads={torch.get_num_threads()}"
        )
        for label, name in (("baseline (hand-written loop)", "baseline"), ("native trainer", "trainer")):
            print(
                f"{label:<30} median {med[name] * 1000:8.1f} ms/step   min {best[name] * 1000:8.1f} ms/step"
            )
        # The minimum is the least disturbed by other processes on a shared machine.
        print(
            f"ratio trainer/baseline: median {med['trainer'] / med['baseline']:.3f}, "
            f"min {best['trainer'] / best['baseline']:.3f} (target <= 1.10)"
        )


if __name__ == "__main__":
    main()
