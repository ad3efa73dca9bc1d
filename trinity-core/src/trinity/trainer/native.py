"""The native trainer (``trainer.trainer_type: native``): plain PyTorch on CPU or one GPU.

One :meth:`NativeTrainer.train_step` does what veRL's PPO trainer does per step, with the
algorithm's components built once by :class:`~trinity.trainer.components.AlgorithmComponents`
(the runtime the veRL back-end shares):

1. build padded tensors from the experiences (:mod:`trinity.trainer.batch`);
2. reference log-probs (frozen reference model) and critic values, without gradients;
3. KL penalty on the rewards (``kl_penalty_fn``), then the advantage (``advantage_fn``, when the
   algorithm type ``use_advantage``);
4. critic update (``use_critic``), then ``ppo_epochs`` actor updates, each one optimizer step
   accumulated over micro-batches: ``loss = policy_loss + kl_loss - entropy_loss``
   (:meth:`~trinity.trainer.components.AlgorithmComponents.actor_loss`).

``old_logprob`` is the rollout's own log-probs with ``trainer.use_rollout_logprobs`` (an error
when some experience carries none and a component needs it). Otherwise
it is recomputed: in a separate pass when the KL penalty needs it before the advantage, else
taken (detached) from the first epoch's forward pass, which runs on the same, not yet updated
weights and so gives the same numbers without a second forward pass.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.batch import TrainBatch, build_batch, to_device
from trinity.trainer.components import AlgorithmComponents
from trinity.trainer.critic import load_critic, value_loss
from trinity.trainer.forward import forward_logprobs, forward_values, policy_stats
from trinity.trainer.metrics import MetricAccumulator, logprob_agreement, step_summary
from trinity.trainer.micro_batch import make_micro_batches, micro_batch, micro_batch_weights
from trinity.trainer.schedule import build_scheduler

if TYPE_CHECKING:
    import torch

    from trinity.config import Config
    from trinity.experience import Experience
else:
    torch = lazy_import("torch")

logger = logging.getLogger(__name__)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Compute dtype: ``auto`` is bfloat16 on a GPU that supports it, float32 elsewhere."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class NativeTrainer:
    """Trains ``config.model.model_path`` with ``config.algorithm`` (see the module docstring).

    Args:
        config: a resolved :class:`~trinity.config.Config` (``load_config`` resolves).
        device: torch device; default CUDA when available, else CPU.
        total_steps: number of training steps, for warm-up ratios and the cosine schedule;
            default ``trainer.total_steps``, then ``buffer.total_steps``.
    """

    def __init__(self, config: Config, *, device: str | None = None, total_steps: int | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        t, algo = config.trainer, config.algorithm
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.compute_dtype = resolve_dtype(t.dtype, self.device)
        self.total_steps = total_steps or t.total_steps or getattr(config.buffer, "total_steps", None)
        torch.manual_seed(t.seed)
        self.components = comps = AlgorithmComponents.from_config(algo)
        self.algorithm_type = comps.algorithm_type
        self.loss_agg_mode = comps.loss_agg_mode
        self.policy_loss_fn = comps.policy_loss_fn
        self.advantage_fn = comps.advantage_fn
        # DPO losses average over pairs: weight micro-batches by rows and never split a pair.
        self.pairs = self.algorithm_type.schema == "dpo"
        self.use_ref = comps.use_reference
        self.share_prompt = t.share_prompt_forward

        model_path, trust = config.model.model_path, config.model.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust)
        self.pad_token_id = self.tokenizer.pad_token_id or 0
        # Parameters stay float32 (the optimizer's master copy); bf16 comes from autocast.
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, trust_remote_code=trust
        )
        self.model.to(self.device).train()
        self.model.config.use_cache = False
        if t.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.ref_model = None
        if self.use_ref:
            self.ref_model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=self.compute_dtype, trust_remote_code=trust
            )
            self.ref_model.to(self.device).eval().requires_grad_(False)
        self.critic = self.critic_optimizer = self.critic_scheduler = None
        if self.algorithm_type.use_critic:
            self.critic = load_critic(config.model.critic_model_path or model_path, trust_remote_code=trust)
            self.critic.to(self.device).train()
            self.critic_optimizer = self._optimizer(self.critic)
            self.critic_scheduler = build_scheduler(self.critic_optimizer, algo.optimizer, self.total_steps)
        self.optimizer = self._optimizer(self.model)
        self.scheduler = build_scheduler(self.optimizer, algo.optimizer, self.total_steps)
        opt = algo.optimizer
        # trainer.grad_clip is the documented key; an explicitly set optimizer.clip_grad wins.
        self.grad_clip = opt.clip_grad if "clip_grad" in opt.model_fields_set else t.grad_clip
        self.global_step = 0

    # -- construction helpers -------------------------------------------------------------------

    def _optimizer(self, model: Any) -> torch.optim.Optimizer:
        opt = self.config.algorithm.optimizer
        params = [p for p in model.parameters() if p.requires_grad]
        if opt.optimizer_type == "sgd":
            return torch.optim.SGD(params, lr=opt.lr, weight_decay=opt.weight_decay)
        if opt.optimizer_type not in ("adam", "adamw"):
            raise ValueError(
                f"algorithm.optimizer.optimizer_type {opt.optimizer_type!r}: use 'adam' or 'sgd'"
            )
        # The fused kernel is faster on GPU and unavailable on some CPU builds.
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(
            params, lr=opt.lr, betas=tuple(opt.betas), weight_decay=opt.weight_decay, fused=fused
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def _micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        t = self.config.trainer
        return make_micro_batches(
            batch,
            micro_batch_size=t.ppo_micro_batch_size_per_gpu,
            max_token_len=t.max_token_len_per_gpu,
            use_dynamic_bsz=t.use_dynamic_bsz,
            pair_rows=self.pairs,
        )

    @torch.no_grad()
    def _infer(
        self, model: Any, batch: TrainBatch, groups: list[list[int]], values: bool = False
    ) -> torch.Tensor:
        out = torch.zeros_like(batch["action_mask"], dtype=torch.float32)
        temperature = self.config.model.temperature
        for rows in groups:
            mb = micro_batch(batch, rows)
            with self._autocast():
                if values:
                    result = forward_values(model, mb)
                else:
                    result, _ = forward_logprobs(
                        model, mb, temperature=temperature, share_prompt=self.share_prompt
                    )
            out[torch.as_tensor(rows, device=out.device)] = result.float()
        return out

    @torch.no_grad()
    def _infer_policy(
        self, batch: TrainBatch, groups: list[list[int]], names: tuple[str, ...]
    ) -> dict[str, torch.Tensor]:
        """The policy's ``old_logprob`` / ``old_entropy`` / ``old_nec`` (those in ``names``)
        before the update, each ``(B, T)`` float, from one forward pass per micro-batch."""
        out = {n: torch.zeros_like(batch["action_mask"], dtype=torch.float32) for n in names}
        for rows in groups:
            mb = micro_batch(batch, rows)
            with self._autocast():
                stats = policy_stats(
                    self.model,
                    mb,
                    names,
                    temperature=self.config.model.temperature,
                    share_prompt=self.share_prompt,
                )
            index = torch.as_tensor(rows, device=batch["action_mask"].device)
            for name, value in stats.items():
                out[name][index] = value.float()
        return out

    # -- one training step ----------------------------------------------------------------------

    def train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """Train on one batch of experiences; returns metrics with Trinity-RFT names."""
        start = time.perf_counter()
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        batch = to_device(build_batch(experiences, self.pad_token_id), self.device)
        groups = self._micro_batches(batch)
        was_training = self.model.training
        self.model.eval()
        if self.ref_model is not None:
            tick = time.perf_counter()
            batch["ref_logprob"] = self._infer(self.ref_model, batch, groups)
            timing["timing/ref"] = time.perf_counter() - tick
        if self.critic is not None:
            tick = time.perf_counter()
            self.critic.eval()
            batch["values"] = self._infer(self.critic, batch, groups, values=True)
            self.critic.train()
            timing["timing/values"] = time.perf_counter() - tick
        comps = self.components
        from_rollout = self.config.trainer.use_rollout_logprobs and comps.rollout_old_logprob(batch)
        wanted = set(comps.pre_update_inputs)
        if from_rollout:
            wanted.discard("old_logprob")
        elif comps.uses_kl_penalty:
            wanted.add("old_logprob")
        if wanted:
            # Before the advantage: the KL penalty, or an advantage that reads the policy's own
            # log-probs / entropy (on-policy distillation, Clip-B/V), needs them now; otherwise
            # the first epoch of the update provides old_logprob for free.
            tick = time.perf_counter()
            batch.update(self._infer_policy(batch, groups, tuple(sorted(wanted))))
            timing["timing/old_log_prob"] = time.perf_counter() - tick
        self.model.train(was_training)

        tick = time.perf_counter()
        batch, shaping_metrics = comps.shape_rewards_and_advantages(batch)
        metrics.update(shaping_metrics)
        timing["timing/adv"] = time.perf_counter() - tick

        if self.critic is not None:
            tick = time.perf_counter()
            metrics.update(self._update_critic(batch, groups))
            timing["timing/update_critic"] = time.perf_counter() - tick
        if self.global_step >= self.config.trainer.critic_warmup:
            tick = time.perf_counter()
            metrics.update(self._update_actor(batch, groups))
            timing["timing/update_actor"] = time.perf_counter() - tick
        if not from_rollout:
            # old_logprob is this trainer's forward of the weights the rollouts were sampled with.
            metrics.update(logprob_agreement(batch))
        self.global_step += 1

        timing["timing/step"] = time.perf_counter() - start
        metrics.update(step_summary(batch, timing, self.global_step, self.config.model.max_response_tokens))
        return metrics

    def _loss_weights(self, batch: TrainBatch, groups: list[list[int]]) -> list[float]:
        mode = "rows" if self.pairs else getattr(self.policy_loss_fn, "loss_agg_mode", self.loss_agg_mode)
        return micro_batch_weights(batch["action_mask"], groups, mode)

    def _update_actor(self, batch: TrainBatch, groups: list[list[int]]) -> dict[str, float]:
        acc = MetricAccumulator()
        weights = self._loss_weights(batch, groups)
        temperature = self.config.model.temperature
        entropy_mode = "grad" if self.components.uses_entropy_bonus else "detached"
        fill_old = "old_logprob" not in batch
        if fill_old:
            batch["old_logprob"] = torch.zeros_like(batch["action_mask"])
        params = [p for p in self.model.parameters() if p.requires_grad]
        lr = self.optimizer.param_groups[0]["lr"]
        for epoch in range(self.config.trainer.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for rows, weight in zip(groups, weights):
                mb = micro_batch(batch, rows)
                with self._autocast():
                    logprob, entropy = forward_logprobs(
                        self.model,
                        mb,
                        temperature=temperature,
                        entropy=entropy_mode,
                        share_prompt=self.share_prompt,
                    )
                if fill_old and epoch == 0:
                    mb["old_logprob"] = logprob.detach()
                    batch["old_logprob"][torch.as_tensor(rows, device=self.device)] = logprob.detach()
                loss, step_metrics = self._actor_loss(logprob, entropy, mb)
                (loss * weight).backward()
                acc.add(step_metrics, weight)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            else:
                # veRL's rule: a non-finite gradient skips the update instead of corrupting weights.
                logger.warning(
                    "step %d: gradient norm is %s, skipping the update", self.global_step, grad_norm
                )
                self.optimizer.zero_grad(set_to_none=True)
            acc.add({"actor/grad_norm": float(grad_norm)}, 1.0)
        self.scheduler.step()
        out = acc.result()
        out["actor/lr"] = lr
        return out

    def _actor_loss(
        self, logprob: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The shared :meth:`AlgorithmComponents.actor_loss` on one micro-batch, metrics under
        ``actor/``: every tensor of the micro-batch but ``input_ids`` reaches the loss, and ``info``."""
        tensors = {k: v for k, v in mb.items() if isinstance(v, torch.Tensor) and k not in ("input_ids",)}
        tensors["info"] = mb["info"]
        loss, metrics = self.components.actor_loss(
            logprob, entropy, tensors, global_step=self.global_step + 1
        )
        return loss, {f"actor/{k}": v for k, v in metrics.items()}

    def _update_critic(self, batch: TrainBatch, groups: list[list[int]]) -> dict[str, float]:
        acc = MetricAccumulator()
        weights = micro_batch_weights(batch["action_mask"], groups, self.loss_agg_mode)
        params = [p for p in self.critic.parameters() if p.requires_grad]
        lr = self.critic_optimizer.param_groups[0]["lr"]
        for _ in range(self.config.trainer.ppo_epochs):
            self.critic_optimizer.zero_grad(set_to_none=True)
            for rows, weight in zip(groups, weights):
                mb = micro_batch(batch, rows)
                with self._autocast():
                    values = forward_values(self.critic, mb)
                loss, vm = value_loss(
                    values, mb["values"], mb["returns"], mb["action_mask"], loss_agg_mode=self.loss_agg_mode
                )
                (loss * weight).backward()
                acc.add({f"critic/{k}": v for k, v in vm.items()}, weight)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            if torch.isfinite(grad_norm):
                self.critic_optimizer.step()
            acc.add({"critic/grad_norm": float(grad_norm)}, 1.0)
        self.critic_scheduler.step()
        out = acc.result()
        out["critic/lr"] = lr
        return out

    # -- weights and checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's weights as detached CPU tensors (what weight sync sends to the explorer)."""
        from trinity.sync.memory import pack_weights

        return pack_weights(self.model)

    def save_checkpoint(self, step: int | None = None, extra_state: dict[str, Any] | None = None) -> str:
        """Save ``<job_dir>/global_step_<step>/`` (default: the current step); returns its path.

        ``extra_state`` (sample strategy, buffer positions, ...) is stored with the trainer state
        and returned by :meth:`load_checkpoint`.
        """
        step = self.global_step if step is None else step
        t = self.config.trainer
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "trainer_step": self.global_step,
            "extra": extra_state or {},
        }
        if self.critic is not None:
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        keep = t.max_actor_ckpt_to_keep or t.max_checkpoints_to_keep
        return ckpt.save_checkpoint(
            self.config.job_dir,
            step,
            model=self.model,
            tokenizer=self.tokenizer,
            state=state,
            critic=self.critic,
            max_to_keep=keep,
        )

    def load_checkpoint(self, path: str | None = None) -> dict[str, Any] | None:
        """Restore weights, optimizer, scheduler, RNG and step from ``path`` (default: the latest
        checkpoint of the job); returns the saved ``extra_state``, or ``None`` if there is none."""
        import os

        from transformers import AutoModelForCausalLM

        if path is None:
            found = ckpt.find_latest_checkpoint(self.config.job_dir)
            if found is None:
                return None
            path = found[1]
        state = ckpt.load_trainer_state(path)
        # Load into the existing modules so the optimizer keeps pointing at the same parameters.
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.load_state_dict(loaded.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(load_critic(os.path.join(path, ckpt.CRITIC_DIR)).state_dict())
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.global_step = int(state["trainer_step"])
        return state.get("extra", {})


__all__ = ["NativeTrainer", "resolve_dtype"]
