"""The native trainer (``trainer.trainer_type: native``): plain PyTorch on CPU or one GPU.

It provides the primitives of the one training step every back-end shares
(:mod:`trinity.trainer.step`), with the algorithm's components built once by
:class:`~trinity.trainer.components.AlgorithmComponents`:

- :meth:`~NativeTrainer.prepare`: padded tensors from the experiences (:mod:`trinity.trainer.batch`)
  on the trainer's device, and the micro-batches (row groups) every pass of the step uses;
- :meth:`~NativeTrainer.ref_logprobs`, :meth:`~NativeTrainer.values`,
  :meth:`~NativeTrainer.policy_stats`: no-grad passes of the frozen reference model, the critic
  and the policy, one micro-batch at a time;
- :meth:`~NativeTrainer.update_critic`, then :meth:`~NativeTrainer.update_actor`: ``ppo_epochs``
  optimizer steps, each accumulated over micro-batches, the actor's with
  ``loss = policy_loss + kl_loss - entropy_loss``
  (:meth:`~trinity.trainer.components.AlgorithmComponents.actor_loss`). When the batch has no
  ``old_logprob`` yet, the first epoch's forward pass gives it (detached): it runs on the same, not
  yet updated weights, so it gives the same numbers without a second forward pass.

With ``model.lora_configs`` the model is a PEFT LoRA model (:mod:`trinity.trainer.lora`): only the
adapter trains, the reference log-probs come from the same model with the adapter disabled, weight
sync sends the adapter alone to transformers engines and the merged weights of the adapted
modules to vLLM, and a checkpoint holds the adapter and a merged export.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.trainer import checkpoint as ckpt
from trinity.trainer import lora as lora_mod
from trinity.trainer.batch import TrainBatch, build_batch, to_device
from trinity.trainer.components import AlgorithmComponents
from trinity.trainer.critic import load_critic, value_loss
from trinity.trainer.forward import forward_logprobs, forward_values
from trinity.trainer.forward import policy_stats as forward_policy_stats
from trinity.trainer.metrics import MetricAccumulator
from trinity.trainer.micro_batch import make_micro_batches, micro_batch, micro_batch_weights
from trinity.trainer.schedule import build_scheduler
from trinity.trainer.step import POLICY_STATS, train_step

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
        from transformers import AutoTokenizer

        from trinity.multimodal import ProcessorFiles, auto_model_class, is_vision_model

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
        self.lora = lora_mod.lora_config_of(config.model.lora_configs)
        # Parameters stay float32 (the optimizer's master copy); bf16 comes from autocast. With
        # LoRA the frozen base needs no master copy: it is kept in the compute dtype, the
        # adapter in float32 (PEFT's default).
        # Vision-language checkpoints (Qwen2-VL) load with AutoModelForImageTextToText.
        self.model_class = auto_model_class(model_path, trust)
        # What checkpoints save besides the weights: for a vision-language model, its image
        # processor too, so that a checkpoint loads like the original folder.
        self.processor_files: Any = self.tokenizer
        if is_vision_model(model_path, trust):
            self.processor_files = ProcessorFiles(model_path, self.tokenizer)
        self.model = self.model_class.from_pretrained(
            model_path,
            dtype=self.compute_dtype if self.lora else torch.float32,
            trust_remote_code=trust,
        )
        self.model.config.use_cache = False
        self.sync_adapter_only = False
        if self.lora:
            from trinity.rollout import resolve_engine_type

            self.model = lora_mod.apply_lora(self.model, self.lora)
            # The transformers engine folds adapters in itself and vLLM serves them as its LoRA
            # adapter; over nccl vLLM's workers reload plain weights only: merged ones.
            engine = resolve_engine_type(config.explorer.rollout_model.engine_type)
            self.sync_adapter_only = engine == "transformers" or (
                engine == "vllm" and config.synchronizer.sync_method != "nccl"
            )
        self.model.to(self.device).train()
        if t.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.lora:
                # Re-entrant checkpointing needs an input that requires grad; the frozen
                # embeddings give none.
                self.model.enable_input_require_grads()
        self.ref_model = None
        if self.use_ref and not self.lora:  # with LoRA: the same model with the adapter off
            self.ref_model = self.model_class.from_pretrained(
                model_path, dtype=self.compute_dtype, trust_remote_code=trust
            )
            self.ref_model.to(self.device).eval().requires_grad_(False)
        self.critic = self.critic_optimizer = self.critic_scheduler = None
        self.use_critic = bool(self.algorithm_type.use_critic)
        if self.use_critic:
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

    # -- the step's primitives (trinity.trainer.step runs them) ----------------------------------

    #: All three: the forward pass gives the whole distribution.
    policy_stats_names = POLICY_STATS
    #: The first epoch's forward pass runs on the not yet updated weights: old_logprob for free.
    old_logprob_from_update = True

    def train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """Train on one batch of experiences (:func:`trinity.trainer.step.train_step`); returns
        metrics with Trinity-RFT names (with LoRA also ``lora/sync_bytes``: the bytes a memory or
        nccl weight sync sends, and ``lora/trainable_params``)."""
        metrics = train_step(self, experiences)
        if self.lora:
            metrics["lora/sync_bytes"] = float(
                lora_mod.sync_bytes(self.model, adapter_only=self.sync_adapter_only)
            )
            metrics["lora/trainable_params"] = float(
                sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            )
        return metrics

    def prepare(self, experiences: list[Experience]) -> tuple[TrainBatch, list[list[int]]]:
        """The batch on this trainer's device and its micro-batches (row groups), fixed for the step."""
        batch = to_device(build_batch(experiences, self.pad_token_id), self.device)
        t = self.config.trainer
        groups = make_micro_batches(
            batch,
            micro_batch_size=t.ppo_micro_batch_size_per_gpu,
            max_token_len=t.max_token_len_per_gpu,
            use_dynamic_bsz=t.use_dynamic_bsz,
            pair_rows=self.pairs,
        )
        return batch, groups

    def ref_logprobs(self, batch: TrainBatch, groups: list[list[int]]) -> torch.Tensor:
        """The reference model's log-probs ``(B, T)`` (with LoRA: the base weights, adapter off)."""
        if self.lora:
            with lora_mod.adapter_disabled(self.model):
                return self._infer(batch, groups, lambda mb: self._logprobs(self.model, mb))
        return self._infer(batch, groups, lambda mb: self._logprobs(self.ref_model, mb))

    def values(self, batch: TrainBatch, groups: list[list[int]]) -> torch.Tensor:
        """The critic's values ``(B, T)`` (in eval mode)."""
        self.critic.eval()
        try:
            return self._infer(batch, groups, lambda mb: forward_values(self.critic, mb))
        finally:
            self.critic.train()

    def policy_stats(
        self, batch: TrainBatch, groups: list[list[int]], names: tuple[str, ...]
    ) -> dict[str, torch.Tensor]:
        """The policy's ``old_logprob`` / ``old_entropy`` / ``old_nec`` (those in ``names``)
        before the update, each ``(B, T)`` float, from one forward pass per micro-batch (in eval
        mode)."""
        temperature, share = self.config.model.temperature, self.share_prompt
        out = {n: torch.zeros_like(batch.action_mask, dtype=torch.float32) for n in names}
        was_training = self.model.training
        self.model.eval()
        try:
            for rows in groups:
                mb = micro_batch(batch, rows)
                with torch.no_grad(), self._autocast():
                    stats = forward_policy_stats(
                        self.model, mb, names, temperature=temperature, share_prompt=share
                    )
                index = torch.as_tensor(rows, device=batch.action_mask.device)
                for name, value in stats.items():
                    out[name][index] = value.float()
        finally:
            self.model.train(was_training)
        return out

    def _logprobs(self, model: Any, mb: TrainBatch) -> torch.Tensor:
        result, _ = forward_logprobs(
            model, mb, temperature=self.config.model.temperature, share_prompt=self.share_prompt
        )
        return result

    @torch.no_grad()
    def _infer(self, batch: TrainBatch, groups: list[list[int]], forward: Any) -> torch.Tensor:
        """``forward(micro_batch)`` over the micro-batches, as one ``(B, T)`` float tensor."""
        out = torch.zeros_like(batch.action_mask, dtype=torch.float32)
        for rows in groups:
            with self._autocast():
                result = forward(micro_batch(batch, rows))
            out[torch.as_tensor(rows, device=out.device)] = result.float()
        return out

    def _loss_weights(self, batch: TrainBatch, groups: list[list[int]]) -> list[float]:
        mode = "rows" if self.pairs else getattr(self.policy_loss_fn, "loss_agg_mode", self.loss_agg_mode)
        return micro_batch_weights(batch.action_mask, groups, mode)

    def update_actor(
        self, batch: TrainBatch, groups: list[list[int]]
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """``ppo_epochs`` optimizer steps, each accumulated over the micro-batches; metrics, and
        ``old_logprob`` from the first epoch's forward pass when ``batch`` has none."""
        acc = MetricAccumulator()
        weights = self._loss_weights(batch, groups)
        temperature = self.config.model.temperature
        entropy_mode = "grad" if self.components.uses_entropy_bonus else "detached"
        # Filled row by row during the first epoch; the later epochs read it from `source`.
        old = torch.zeros_like(batch.action_mask) if batch.old_logprob is None else None
        source = batch
        params = [p for p in self.model.parameters() if p.requires_grad]
        lr = self.optimizer.param_groups[0]["lr"]
        for epoch in range(self.config.trainer.ppo_epochs):
            if old is not None and epoch == 1:
                source = batch.with_(old_logprob=old)
            self.optimizer.zero_grad(set_to_none=True)
            for rows, weight in zip(groups, weights):
                mb = micro_batch(source, rows)
                with self._autocast():
                    logprob, entropy = forward_logprobs(
                        self.model,
                        mb,
                        temperature=temperature,
                        entropy=entropy_mode,
                        share_prompt=self.share_prompt,
                    )
                if old is not None and epoch == 0:
                    mb = mb.with_(old_logprob=logprob.detach())
                    old[torch.as_tensor(rows, device=self.device)] = logprob.detach()
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
        return out, old

    def _actor_loss(
        self, logprob: torch.Tensor, entropy: torch.Tensor, mb: TrainBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The shared :meth:`AlgorithmComponents.actor_loss` on one micro-batch, metrics under
        ``actor/``: every tensor of the micro-batch but ``input_ids`` reaches the loss, and ``info``."""
        tensors = {k: v for k, v in mb.items() if isinstance(v, torch.Tensor) and k not in ("input_ids",)}
        tensors["info"] = mb["info"]
        loss, metrics = self.components.actor_loss(
            logprob, entropy, tensors, global_step=self.global_step + 1
        )
        return loss, {f"actor/{k}": v for k, v in metrics.items()}

    def update_critic(self, batch: TrainBatch, groups: list[list[int]]) -> dict[str, float]:
        """``ppo_epochs`` critic optimizer steps with the value loss; metrics under ``critic/``."""
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
        """The actor's weights as detached CPU tensors (what weight sync sends to the explorer).

        With LoRA: only what the adapter changes, under the base model's names
        (:func:`trinity.trainer.lora.sync_weights`): the adapter alone for a transformers rollout
        engine, else the adapted modules' merged weights; the other weights never change.
        """
        from trinity.sync.memory import pack_weights

        if self.lora:
            return lora_mod.sync_weights(self.model, adapter_only=self.sync_adapter_only)
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
            tokenizer=self.processor_files,
            state=state,
            critic=self.critic,
            max_to_keep=keep,
            lora=bool(self.lora),
        )

    def load_checkpoint(self, path: str | None = None) -> dict[str, Any] | None:
        """Restore weights, optimizer, scheduler, RNG and step from ``path`` (default: the latest
        checkpoint of the job); returns the saved ``extra_state``, or ``None`` if there is none."""
        import os

        if path is None:
            found = ckpt.find_latest_checkpoint(self.config.job_dir)
            if found is None:
                return None
            path = found[1]
        state = ckpt.load_trainer_state(path)
        # Load into the existing modules so the optimizer keeps pointing at the same parameters.
        if self.lora:
            lora_mod.load_adapter(self.model, path)
        else:
            loaded = self.model_class.from_pretrained(path, dtype=torch.float32)
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
