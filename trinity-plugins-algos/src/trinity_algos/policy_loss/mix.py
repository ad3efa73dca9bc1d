"""MIX (Trinity-RFT): PPO on the policy's own rollouts plus SFT on expert rows, in one loss.

``loss = (1 - mu) * usual_part + mu * expert_part``, where ``expert_mask (B,)`` (from
``info["is_expert"]``, set by the ``mix`` sample strategy) picks the expert rows.

**One micro-batch, or no batch sizes given.** Each part is aggregated over its own rows of the
micro-batch (``grpo_loss_agg_mode`` / ``sft_loss_agg_mode``); a part with no rows contributes 0.
With the whole batch in one micro-batch this is exactly ``(1 - mu) * PPO(usual rows) + mu *
SFT(expert rows)``. Over several micro-batches it is not: the trainer weights each micro-batch by
its share of the batch, so a micro-batch holding few expert rows would give them the weight of
all its rows.

**Batch sizes given** (``train_batch_size_usual`` and ``train_batch_size_expert``, Trinity-RFT's
arguments). Each part is then averaged over *its own* count of samples in the mini-batch, however
the rows fall into micro-batches. Trinity-RFT gets this under veRL's gradient accumulation by
scaling a micro-batch's part ``x`` by ``n_x / N_x`` (its rows of that part over the part's
mini-batch count) divided by veRL's own micro-batch scale; after veRL sums micro-batches and
averages data-parallel ranks, the mini-batch loss is

    (1 - mu) * sum_mb (n_usual,mb / N_usual) * agg(PPO, usual rows of mb)
      +   mu * sum_mb (n_expert,mb / N_expert) * agg(SFT, expert rows of mb)

Here the trainer weights micro-batch losses by :func:`trinity.trainer.micro_batch.micro_batch_weights`
with this loss's ``loss_agg_mode``, which is set to ``"rows"`` in this case: weight
``n_mb / N`` (rows of the micro-batch over rows of the batch, ``N = N_usual + N_expert``), which
is veRL's dynamic-batch scale. The micro-batch loss is therefore
``(N / n_mb) * [(1 - mu) (n_usual,mb / N_usual) agg_usual + mu (n_expert,mb / N_expert) agg_expert]``
and the accumulated gradient is the expression above, term for term, for the same micro-batches.
For ``seq-mean-token-mean`` / ``seq-mean-token-sum`` it equals the one-batch
``(1 - mu) * PPO(all usual rows) + mu * SFT(all expert rows)`` whatever the split; for
``token-mean`` it is, as in Trinity-RFT, a row-weighted mean of micro-batch token means (and
``seq-mean-token-sum-norm`` likewise depends on the split). The counts are global (all
data-parallel ranks): Trinity-RFT divides them by ``ngpus_trainer`` only to undo veRL's
averaging over ranks, which this trainer's weights already account for. Trinity-RFT's two
formulas are its ``use_dynamic_bsz`` branch (the one above) and a fixed-size branch that assumes
``ppo_micro_batch_size_per_gpu`` rows per micro-batch and, with several GPUs, over-scales the
loss by ``ngpus_trainer`` (it divides the global mini-batch by the micro size where veRL divides
the per-rank one); we use the actual rows of each micro-batch, i.e. the dynamic branch, for both.
So ``ngpus_trainer``, ``ppo_micro_batch_size_per_gpu`` and ``use_dynamic_bsz`` do not change the
result; the veRL back-end must weight micro-batches by this loss's ``loss_agg_mode`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.algorithm import PolicyLossFn
from trinity.lazy import lazy_import
from trinity_algos.policy_loss.ppo import ppo_clipped_loss, resolve_clip_range
from trinity_algos.policy_loss.sft import SFTLossFn

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# The micro-batch weighting (see trinity.trainer.micro_batch.loss_denominator) under which the
# batch-size-aware MIX loss is exact: each micro-batch weighs its share of the batch's rows.
ROW_WEIGHTING = "rows"


class ExpertMixLossFn(PolicyLossFn):
    """Shared machinery of ``mix`` and ``mix_chord``: splitting rows by ``expert_mask``, the two
    parts, and the batch-size-aware part scales (see the module docstring)."""

    def _setup_mix(
        self,
        who: str,
        clip_range: float | None,
        clip_range_low: float | None,
        clip_range_high: float | None,
        clip_ratio_c: float,
        use_dynamic_bsz: bool | None,
        ppo_mini_batch_size: int | None,
        ppo_micro_batch_size_per_gpu: int | None,
        ngpus_trainer: int | None,
        train_batch_size_usual: int | None,
        train_batch_size_expert: int | None,
        loss_agg_mode: str,
        sft_loss: PolicyLossFn,
        grpo_loss_agg_mode: str | None,
    ) -> None:
        self.who = who
        self.clip_range_low, self.clip_range_high = resolve_clip_range(
            who, clip_range, clip_range_low, clip_range_high
        )
        if clip_ratio_c <= 1.0:
            raise ValueError(
                f"policy_loss_fn {who!r}: clip_ratio_c must be > 1.0 (dual clip), got {clip_ratio_c}"
            )
        self.clip_ratio_c = clip_ratio_c
        self.ppo_loss_agg_mode = grpo_loss_agg_mode or loss_agg_mode
        self.sft_loss = sft_loss
        # Kept for reference: they only convert veRL's per-rank micro-batch scale (module docstring).
        self.use_dynamic_bsz = use_dynamic_bsz
        self.ppo_micro_batch_size_per_gpu = ppo_micro_batch_size_per_gpu
        self.ngpus_trainer = ngpus_trainer
        for name, value in (
            ("ppo_mini_batch_size", ppo_mini_batch_size),
            ("ppo_micro_batch_size_per_gpu", ppo_micro_batch_size_per_gpu),
            ("ngpus_trainer", ngpus_trainer),
        ):
            if value is not None and value < 1:
                raise ValueError(f"policy_loss_fn {who!r}: {name} must be >= 1, got {value}")
        if (train_batch_size_usual is None) != (train_batch_size_expert is None):
            raise ValueError(
                f"policy_loss_fn {who!r}: set both train_batch_size_usual and train_batch_size_expert "
                "(the rollout and expert samples of a batch), or neither"
            )
        self.train_batch_size_usual = train_batch_size_usual
        self.train_batch_size_expert = train_batch_size_expert
        self.batch_rows: int | None = None
        if train_batch_size_usual is not None and train_batch_size_expert is not None:
            if train_batch_size_usual < 0 or train_batch_size_expert < 0:
                raise ValueError(f"policy_loss_fn {who!r}: train_batch_size_usual/expert must be >= 0")
            rows = train_batch_size_usual + train_batch_size_expert
            if rows == 0:
                raise ValueError(
                    f"policy_loss_fn {who!r}: train_batch_size_usual + train_batch_size_expert is 0"
                )
            if ppo_mini_batch_size is not None and ppo_mini_batch_size != rows:
                raise ValueError(
                    f"policy_loss_fn {who!r}: ppo_mini_batch_size ({ppo_mini_batch_size}) must equal "
                    f"train_batch_size_usual + train_batch_size_expert ({rows}): the trainer takes one "
                    "optimizer step per batch, so the mini-batch is the whole batch"
                )
            self.batch_rows = rows
            self.loss_agg_mode = ROW_WEIGHTING
        self.ppo_mini_batch_size = ppo_mini_batch_size

    def _part_scales(self, n_rows: int, n_usual: int, n_expert: int) -> tuple[float, float]:
        """Factors on the usual and expert part of a micro-batch (1, 1 without batch sizes)."""
        if self.batch_rows is None:
            return 1.0, 1.0

        def scale(n_part: int, batch_part: int, name: str) -> float:
            if n_part == 0:
                return 0.0
            if batch_part == 0:
                raise ValueError(
                    f"policy_loss_fn {self.who!r}: the micro-batch has {name} rows but "
                    f"train_batch_size_{name} is 0"
                )
            return self.batch_rows * n_part / (n_rows * batch_part)

        return (
            scale(n_usual, self.train_batch_size_usual or 0, "usual"),
            scale(n_expert, self.train_batch_size_expert or 0, "expert"),
        )

    def _mix(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        expert_mask: torch.Tensor | None,
        mu: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        n_rows = logprob.shape[0]
        if expert_mask is None:
            expert_mask = torch.zeros(n_rows, dtype=torch.bool, device=logprob.device)
        expert_mask = expert_mask.to(device=logprob.device, dtype=torch.bool).reshape(-1)
        if expert_mask.shape[0] != n_rows:
            raise ValueError(
                f"policy_loss_fn {self.who!r}: expert_mask has {expert_mask.shape[0]} rows, logprob has {n_rows}"
            )
        n_expert = int(expert_mask.sum())
        n_usual = n_rows - n_expert
        usual_scale, expert_scale = self._part_scales(n_rows, n_usual, n_expert)
        usual_rows, expert_rows = _row_parts(expert_mask, n_usual, n_expert)
        metrics: dict[str, float] = {}
        if not (n_usual and n_expert):
            zero = logprob.sum() * 0.0  # keeps the graph (and device) when a part is empty
            ppo_loss = sft_loss = zero
        if not n_expert:
            usual_logprob = logprob
        elif not n_usual:
            expert_logprob = logprob
        elif isinstance(usual_rows, slice):
            # One split node: its backward concatenates the two parts' gradients, where two
            # views or index selections would each scatter into a zero tensor of the full size.
            if usual_rows.start == 0:
                usual_logprob, expert_logprob = torch.split(logprob, [n_usual, n_expert])
            else:
                expert_logprob, usual_logprob = torch.split(logprob, [n_expert, n_usual])
        else:
            usual_logprob, expert_logprob = logprob[usual_rows], logprob[expert_rows]
        if n_usual:
            ppo_loss, ppo_metrics = ppo_clipped_loss(
                usual_logprob,
                old_logprob[usual_rows],
                action_mask[usual_rows],
                advantages[usual_rows],
                self.clip_range_low,
                self.clip_range_high,
                self.clip_ratio_c,
                self.ppo_loss_agg_mode,
            )
            metrics.update({f"usual/{k}": v for k, v in ppo_metrics.items()})
        if n_expert:
            sft_loss, sft_metrics = self.sft_loss(expert_logprob, action_mask=action_mask[expert_rows])
            metrics.update({f"expert/{k}": v for k, v in sft_metrics.items()})
        loss = (1.0 - mu) * usual_scale * ppo_loss + mu * expert_scale * sft_loss
        metrics["loss"] = loss.item()
        metrics["expert_fraction"] = n_expert / n_rows if n_rows else 0.0
        return loss, metrics


def _row_parts(expert_mask: torch.Tensor, n_usual: int, n_expert: int) -> tuple[Any, Any]:
    """Row selectors ``(usual, expert)`` for ``tensor[selector]``: slices (views, no copies) when
    the expert rows are one block at the end or the start of the batch (how the ``mix`` sample
    strategy lays them out), else the boolean masks."""
    n_rows = n_usual + n_expert
    if n_expert == 0:
        return slice(0, n_rows), slice(n_rows, n_rows)
    if n_usual == 0:
        return slice(0, 0), slice(0, n_rows)
    if bool(expert_mask[n_usual:].all()):
        return slice(0, n_usual), slice(n_usual, n_rows)
    if bool(expert_mask[:n_expert].all()):
        return slice(n_expert, n_rows), slice(0, n_expert)
    return ~expert_mask, expert_mask


class MIXPolicyLossFn(ExpertMixLossFn):
    """``(1 - mu) * PPO(rows with expert_mask False) + mu * SFT(rows with expert_mask True)``.

    PPO is the dual-clip surrogate of ``ppo`` (``clip_range`` / ``clip_range_low`` /
    ``clip_range_high`` / ``clip_ratio_c``), aggregated with ``grpo_loss_agg_mode`` (default
    ``loss_agg_mode``); SFT is ``agg(-logprob)`` with ``sft_loss_agg_mode`` (default
    ``loss_agg_mode``). Give ``train_batch_size_usual`` and ``train_batch_size_expert`` (the
    rollout and expert samples per batch) so each part is averaged over its own sample count
    across micro-batches, as in Trinity-RFT (``loss_agg_mode`` then reads ``"rows"``, so that the
    trainer weights micro-batches by their rows); ``use_dynamic_bsz``, ``ppo_mini_batch_size``
    (must equal their sum if given), ``ppo_micro_batch_size_per_gpu`` and ``ngpus_trainer`` are
    accepted for Trinity-RFT configs and do not change the result (module docstring). Metrics are
    prefixed ``usual/`` and ``expert/``, plus ``loss`` and ``expert_fraction``.
    """

    def __init__(
        self,
        mu: float = 0.1,
        clip_range: float | None = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        use_dynamic_bsz: bool | None = None,
        ppo_mini_batch_size: int | None = None,
        ppo_micro_batch_size_per_gpu: int | None = None,
        ngpus_trainer: int | None = None,
        train_batch_size_usual: int | None = None,
        train_batch_size_expert: int | None = None,
        loss_agg_mode: str = "token-mean",
        sft_loss_agg_mode: str | None = None,
        grpo_loss_agg_mode: str | None = None,
    ) -> None:
        super().__init__(loss_agg_mode=loss_agg_mode)
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"policy_loss_fn 'mix': mu must be in [0, 1], got {mu}")
        self.mu = mu
        self._setup_mix(
            "mix",
            clip_range,
            clip_range_low,
            clip_range_high,
            clip_ratio_c,
            use_dynamic_bsz,
            ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu,
            ngpus_trainer,
            train_batch_size_usual,
            train_batch_size_expert,
            loss_agg_mode,
            SFTLossFn(loss_agg_mode=sft_loss_agg_mode or loss_agg_mode),
            grpo_loss_agg_mode,
        )

    def __call__(
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted sum of the PPO loss on usual rows and the SFT loss on expert rows."""
        return self._mix(logprob, old_logprob, action_mask, advantages, expert_mask, self.mu)


__all__ = ["ROW_WEIGHTING", "ExpertMixLossFn", "MIXPolicyLossFn"]
