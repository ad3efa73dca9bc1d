"""Experiences → veRL's batch (``verl.DataProto``) with veRL's key names.

The tensors come from :func:`trinity.trainer.batch.build_batch` (veRL's layout already: prompts
left-padded, responses right-padded); this module only renames and adds what veRL expects:

=====================  =======================================================================
veRL key               from
=====================  =======================================================================
``input_ids``          ``input_ids`` ``(B, P+T)``; ``attention_mask``, ``position_ids`` likewise
``prompts``            ``input_ids[:, :P]``
``responses``          ``input_ids[:, P:]``
``response_mask``      ``action_mask`` (veRL's loss mask: 0 on tool / environment tokens)
``rollout_log_probs``  the explorer's log-probs (only when every experience has them)
``old_log_probs``      ``old_logprob`` (recomputed or rollout log-probs)
``ref_log_prob``       ``ref_logprob``
``values``             ``values`` (critic)
``token_level_scores`` the experience's token-level reward, else its reward on the last
                       action token (veRL's reward-manager convention, our KL penalty's too)
``token_level_rewards`` the scores after the KL penalty (``token_level_rewards`` of our batch)
``advantages``         ``advantages``; ``returns`` likewise
``uid``                non-tensor: the task id shared by a task's rollouts (veRL's GRPO group key)
=====================  =======================================================================

Trinity-only tensors (``group_ids``, ``expert_mask``) travel under their own names, so the loss in
the workers gets the same tensors as the native trainer's. :data:`VERL_TO_TRINITY` is the way
back (worker side). The tensor part needs no veRL; only :func:`experiences_to_dataproto` and
:func:`batch_to_dataproto` import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import torch

    from trinity.experience import Experience
    from trinity.trainer.batch import TrainBatch
else:
    torch = lazy_import("torch")
    np = lazy_import("numpy")

# Our batch key → veRL key, for per-token (B, T) tensors and per-row (B,) tensors.
TRINITY_TO_VERL: dict[str, str] = {
    "action_mask": "response_mask",
    "rollout_logprobs": "rollout_log_probs",
    "old_logprob": "old_log_probs",
    "ref_logprob": "ref_log_prob",
    "values": "values",
    "token_level_rewards": "token_level_rewards",
    "advantages": "advantages",
    "returns": "returns",
    "rollout_is_weights": "rollout_is_weights",  # rollout correction, for a loss that declares them
    "group_ids": "group_ids",
    "expert_mask": "expert_mask",
}
# veRL key → the keyword our PolicyLossFn / KLFn / EntropyLossFn receive it as.
VERL_TO_TRINITY: dict[str, str] = {v: k for k, v in TRINITY_TO_VERL.items()}
# Keys with one value per row rather than per response token.
ROW_KEYS = ("group_ids", "expert_mask")


def token_level_scores(batch: TrainBatch) -> torch.Tensor:
    """``(B, T)`` scores before any KL penalty: ``token_level_scores`` when the KL penalty has set
    them, else the experiences' token-level rewards, else each row's reward on its last action
    token (where veRL's reward manager and our KL penalty put a sequence score)."""
    from trinity.algorithm.kl import rewards_to_token_level

    for key in ("token_level_scores", "token_level_rewards"):
        if key in batch:
            return batch[key]
    return rewards_to_token_level(batch["rewards"], batch["action_mask"])


def verl_tensors(batch: TrainBatch) -> dict[str, torch.Tensor]:
    """veRL's tensors for a batch built by :func:`~trinity.trainer.batch.build_batch` (and possibly
    extended with ``old_logprob``, ``ref_logprob``, ``values``, ``advantages``, ``returns``).

    ``rollout_log_probs`` is included only when ``batch["has_rollout_logprobs"]`` is true (set by
    :func:`~trinity.trainer.batch.build_batch`), so zeros never pass for log-probs.
    """
    p = batch["prompt_length"]
    input_ids = batch["input_ids"]
    out = {
        "input_ids": input_ids,
        "attention_mask": batch["attention_mask"],
        "position_ids": batch["position_ids"],
        "prompts": input_ids[:, :p],
        "responses": input_ids[:, p:],
        "token_level_scores": token_level_scores(batch),
    }
    for ours, theirs in TRINITY_TO_VERL.items():
        if ours in batch:
            out[theirs] = batch[ours]
    if not batch.get("has_rollout_logprobs", False):
        out.pop("rollout_log_probs", None)
    # veRL's masks are integer tensors (it derives them from attention_mask).
    out["response_mask"] = batch["action_mask"].to(torch.long)
    if "token_level_rewards" not in out:
        out["token_level_rewards"] = out["token_level_scores"]
    return out


def verl_non_tensors(batch: TrainBatch, experiences: list[Experience] | None = None) -> dict[str, np.ndarray]:
    """veRL's non-tensor batch: ``uid`` (object array), one task id per row."""
    if experiences is not None:
        uids = [str(e.eid.tid) for e in experiences]
    else:
        uids = [str(int(g)) for g in batch["group_ids"]]
    return {"uid": np.array(uids, dtype=object)}


def build_verl_batch(experiences: list[Experience], pad_token_id: int = 0) -> TrainBatch:
    """:func:`~trinity.trainer.batch.build_batch` plus the rows' task ids (``uids``, veRL's group
    key). DPO pairs are rejected (veRL's dynamic batching may separate a pair; train DPO with
    ``trainer_type: native``)."""
    from trinity.trainer.batch import build_batch

    if any(e.chosen is not None or e.rejected is not None for e in experiences):
        raise ValueError(
            "the veRL trainer does not train DPO pairs (its dynamic batching may split a pair); "
            "use trainer.trainer_type: native"
        )
    if any(e.prompt_length <= 0 for e in experiences):
        raise ValueError(
            "the veRL trainer needs at least one prompt token per experience (veRL's unpadding assumes it)"
        )
    return build_batch(experiences, pad_token_id).with_(uids=[str(e.eid.tid) for e in experiences])


def pad_rows(batch: TrainBatch, multiple: int) -> tuple[TrainBatch, int]:
    """``batch`` padded to a multiple of ``multiple`` rows, and its real row count.

    veRL splits a batch evenly over data-parallel ranks. A padding row copies the last real row
    (so every forward pass sees a well-formed sequence) with its ``action_mask``, ``rewards``,
    ``advantages`` and ``returns`` zeroed, so it adds nothing to any loss or token count;
    outputs for padding rows are dropped with ``[:n]``.
    """
    n = batch.num_rows
    extra = (-n) % max(1, multiple)
    if extra == 0:
        return batch, n
    from trinity.trainer.batch import map_rows

    index = torch.cat([torch.arange(n), torch.full((extra,), n - 1)])

    def pad(key: str, value: torch.Tensor) -> torch.Tensor:
        value = value[index.to(value.device)].clone()
        if key in ("action_mask", "rewards", "advantages", "returns"):
            value[n:] = 0
        return value

    return map_rows(batch, pad, lambda rows: list(rows) + [rows[-1]] * extra), n


def meta_info(batch: TrainBatch, temperature: float) -> dict[str, Any]:
    """veRL's ``meta_info``: sampling temperature (log-probs are taken at it) and tokens per row."""
    return {
        "temperature": temperature,
        "global_token_num": batch["attention_mask"].sum(-1).tolist(),
    }


def batch_to_dataproto(batch: TrainBatch, temperature: float = 1.0) -> Any:
    """A ``verl.DataProto`` of ``batch`` (see :func:`build_verl_batch`). Imports veRL."""
    from verl import DataProto

    tensors = verl_tensors(batch)
    non_tensors = {"uid": np.array(batch.get("uids") or verl_non_tensors(batch)["uid"], dtype=object)}
    return DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info=meta_info(batch, temperature)
    )


def experiences_to_dataproto(
    experiences: list[Experience], pad_token_id: int = 0, temperature: float = 1.0
) -> Any:
    """``experiences`` as a ``verl.DataProto`` with veRL's key names (see the module docstring)."""
    return batch_to_dataproto(build_verl_batch(experiences, pad_token_id), temperature)


__all__ = [
    "ROW_KEYS",
    "TRINITY_TO_VERL",
    "VERL_TO_TRINITY",
    "batch_to_dataproto",
    "build_verl_batch",
    "experiences_to_dataproto",
    "meta_info",
    "pad_rows",
    "token_level_scores",
    "verl_non_tensors",
    "verl_tensors",
]
