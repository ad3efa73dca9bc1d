"""Turn a list of :class:`~trinity.experience.Experience` into padded training tensors.

The layout is veRL's: prompts are **left**-padded to the longest prompt ``P`` and responses
**right**-padded to the longest response ``T``, so every row's response starts at column ``P``
and the per-token tensors ``(B, T)`` line up with ``input_ids[:, P:]``.

DPO experiences (``chosen`` / ``rejected`` set) expand to two rows each, chosen first, so rows
``2k`` and ``2k + 1`` form a pair (what the ``dpo`` policy loss expects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from trinity.experience import group_ids_of
from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from trinity.experience import Experience
else:
    torch = lazy_import("torch")


@dataclass(frozen=True, eq=False)
class TrainBatch(Mapping[str, Any]):
    """The training batch both back-ends pass around: fixed, typed fields, never changed in place.

    :func:`build_batch` fills the required fields; a step adds the others by making a new batch
    (:meth:`with_`: reference and critic passes, old log-probs, then the KL penalty and the
    advantage). ``(B, T)`` tensors are per response token, ``(B,)`` per row; an optional field is
    ``None`` until a stage sets it.

    It reads as a mapping of its set fields (``batch["advantages"]``, ``"values" in batch``,
    ``batch.get(...)``), which is how the forward passes, the metrics and the veRL conversion read
    it. Plugins (advantage and KL functions) receive :meth:`to_dict`, a plain ``dict`` they may
    change (DESIGN §3: a mapping of tensors); :meth:`from_mapping` turns what they return back
    into a batch. Keys a plugin adds beyond the fields are kept in :attr:`extra` (and reach the
    policy loss like any field).
    """

    # -- from build_batch
    input_ids: torch.Tensor  # (B, P+T) long: prompts left-padded, responses right-padded
    attention_mask: torch.Tensor  # (B, P+T) long
    position_ids: torch.Tensor  # (B, P+T) long, counting real tokens only
    response_mask: torch.Tensor  # (B, T) float: real response tokens
    action_mask: torch.Tensor  # (B, T) float: tokens that count in the loss
    rollout_logprobs: torch.Tensor  # (B, T) float: the explorer's log-probs, zeros where it gave none
    has_rollout_logprobs: bool  # every experience carried log-probs (else rollout_logprobs are not real)
    rewards: torch.Tensor  # (B,) float
    group_ids: torch.Tensor  # (B,) long: equal ids = rollouts of one task
    trajectory_ids: torch.Tensor  # (B,) long: equal ids = the steps (turns) of one episode
    step_ids: torch.Tensor  # (B,) long: the turn index within the episode (eid.step)
    expert_mask: torch.Tensor  # (B,) bool: info["is_expert"]
    model_versions: torch.Tensor  # (B,) long
    info: list[dict[str, Any]]  # one dict per row
    prompt_length: int  # P
    response_length: int  # T
    # (B, T) float: only when every experience has them; after the KL penalty, the penalised rewards
    token_level_rewards: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None  # (B, T) float: only when every experience has them
    # one per row: the experience's pixel inputs (pixel_values, image_grid_thw), None for rows
    # without images; only when some experience has images (see trinity.multimodal)
    multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None
    # -- added by the step
    ref_logprob: torch.Tensor | None = None  # (B, T) reference model
    values: torch.Tensor | None = None  # (B, T) critic
    old_logprob: torch.Tensor | None = None  # (B, T) recomputed, or the rollout's (use_rollout_logprobs)
    old_entropy: torch.Tensor | None = None  # (B, T) the policy's entropy before the update
    old_nec: torch.Tensor | None = None  # (B, T) E[p (H + log p)] before the update (Clip-V)
    token_level_scores: torch.Tensor | None = None  # (B, T) rewards before the KL penalty
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    # (B, T) rollout correction's importance weights, only for a policy loss that declares them
    # (otherwise they are folded into the advantages; see trainer/rollout_correction.py)
    rollout_is_weights: torch.Tensor | None = None
    # -- veRL back-end only (build_verl_batch)
    uids: list[str] | None = None  # the task id of each row
    #: Keys an advantage or KL function set that are not fields above, by name.
    extra: dict[str, Any] = field(default_factory=dict)

    # -- mapping access (the set fields, then ``extra``) ----------------------------------------

    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            value = getattr(self, key)
            if value is not None:
                return value
        elif key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (name for name in _FIELDS if getattr(self, name) is not None)
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # Identity, not Mapping's key-by-key comparison (tensors have no single truth value).
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"TrainBatch(rows={self.num_rows}, P={self.prompt_length}, T={self.response_length}, keys={list(self)})"

    @property
    def num_rows(self) -> int:
        """``B``, the number of rows."""
        return int(self.input_ids.shape[0])

    # -- new batches from this one --------------------------------------------------------------

    def with_(self, **changes: Any) -> TrainBatch:
        """A new batch with ``changes`` (field names; ``None`` unsets an optional field)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A new plain ``dict`` of the set fields and :attr:`extra` (what plugins receive)."""
        return dict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TrainBatch:
        """A batch from a mapping with the field names (e.g. what an advantage function
        returned); keys that are not fields go to :attr:`extra`. Raises ``ValueError`` naming
        the required fields it lacks."""
        if isinstance(data, TrainBatch):
            return data
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise ValueError(
                f"a training batch needs {', '.join(map(repr, missing))}, which the mapping lacks"
            )
        known = {k: v for k, v in data.items() if k in _FIELDS}
        extra = {k: v for k, v in data.items() if k not in _FIELDS and k != "extra"}
        return cls(**known, extra=extra)


_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TrainBatch) if f.name != "extra")
_REQUIRED: tuple[str, ...] = tuple(
    f.name for f in fields(TrainBatch) if f.default is MISSING and f.default_factory is MISSING
)


def _rows(experiences: list[Experience]) -> list[tuple[Experience, torch.Tensor, torch.Tensor]]:
    """``(experience, prompt ids, response ids)`` per training row (two per DPO experience)."""
    rows = []
    for exp in experiences:
        prompt = exp.tokens[: exp.prompt_length]
        if exp.chosen is not None or exp.rejected is not None:
            if exp.chosen is None or exp.rejected is None:
                raise ValueError(
                    f"experience {exp.eid.uid}: a DPO experience needs both chosen and rejected responses"
                )
            rows.append((exp, prompt, exp.chosen))
            rows.append((exp, prompt, exp.rejected))
        else:
            rows.append((exp, prompt, exp.tokens[exp.prompt_length :]))
    return rows


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens (0 at each row's first real token; pads get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def build_batch(experiences: list[Experience], pad_token_id: int = 0) -> TrainBatch:
    """Padded tensors for ``experiences`` (see the module docstring for the layout).

    Returns a :class:`TrainBatch` with ``input_ids (B, P+T)``, ``attention_mask``, ``position_ids``,
    ``response_mask (B, T)`` (real response tokens), ``action_mask (B, T)`` (the experience's
    ``action_mask`` or the response mask), ``rollout_logprobs (B, T)`` (zeros where the explorer
    gave none), ``has_rollout_logprobs`` (whether every experience gave them), ``rewards (B,)``, ``token_level_rewards (B, T)`` (only when every experience has
    one), ``teacher_logprobs (B, T)`` (likewise), ``group_ids (B,)`` (task), ``trajectory_ids (B,)``
    (episode: task and run) and ``step_ids (B,)`` (turn), ``expert_mask (B,)`` (from ``info["is_expert"]``),
    ``model_versions (B,)``, ``info`` (one dict per row), ``prompt_length`` ``P`` and
    ``response_length`` ``T`` (ints), and ``multi_modal_inputs`` (one dict or ``None`` per row)
    when some experience has images.
    """
    if not experiences:
        raise ValueError("cannot build a training batch from an empty list of experiences")
    rows = _rows(experiences)
    is_dpo = len(rows) != len(experiences)
    prompt_len = max(len(p) for _, p, _ in rows)
    response_len = max(len(r) for _, _, r in rows)
    if response_len == 0:
        raise ValueError("every experience has an empty response; there is nothing to train on")
    n = len(rows)
    input_ids = torch.full((n, prompt_len + response_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    response_mask = torch.zeros((n, response_len), dtype=torch.float32)
    action_mask = torch.zeros((n, response_len), dtype=torch.float32)
    rollout_logprobs = torch.zeros((n, response_len), dtype=torch.float32)
    has_token_rewards = all(e.token_level_reward is not None for e, _, _ in rows) and not is_dpo
    token_level_rewards = torch.zeros((n, response_len), dtype=torch.float32) if has_token_rewards else None
    has_teacher = all(e.teacher_logprobs is not None for e, _, _ in rows) and not is_dpo
    teacher_logprobs = torch.zeros((n, response_len), dtype=torch.float32) if has_teacher else None

    for i, (exp, prompt, response) in enumerate(rows):
        p, r = len(prompt), len(response)
        input_ids[i, prompt_len - p : prompt_len] = prompt
        input_ids[i, prompt_len : prompt_len + r] = response
        attention_mask[i, prompt_len - p : prompt_len + r] = 1
        response_mask[i, :r] = 1.0
        # DPO rows always train on the whole response; the experience's masks cover `tokens`.
        if exp.action_mask is not None and not is_dpo:
            action_mask[i, :r] = exp.action_mask.to(torch.float32)
        else:
            action_mask[i, :r] = 1.0
        if exp.logprobs is not None and not is_dpo:
            rollout_logprobs[i, :r] = exp.logprobs.to(torch.float32)
        if token_level_rewards is not None:
            token_level_rewards[i, :r] = exp.token_level_reward.to(torch.float32)
        if teacher_logprobs is not None:
            teacher_logprobs[i, :r] = exp.teacher_logprobs.to(torch.float32)

    row_exps = [e for e, _, _ in rows]
    group_ids = group_ids_of(experiences)
    trajectory_ids = _ids([(e.eid.batch, e.eid.task, e.eid.run) for e in experiences])
    step_ids = torch.tensor([int(e.eid.step) for e in experiences], dtype=torch.long)
    if is_dpo:
        group_ids = group_ids.repeat_interleave(2)
        trajectory_ids = trajectory_ids.repeat_interleave(2)
        step_ids = step_ids.repeat_interleave(2)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        response_mask=response_mask,
        action_mask=action_mask,
        rollout_logprobs=rollout_logprobs,
        has_rollout_logprobs=not is_dpo and all(e.logprobs is not None for e, _, _ in rows),
        rewards=torch.tensor([float(e.reward or 0.0) for e in row_exps], dtype=torch.float32),
        group_ids=group_ids,
        trajectory_ids=trajectory_ids,
        step_ids=step_ids,
        expert_mask=torch.tensor([bool(e.info.get("is_expert", False)) for e in row_exps]),
        model_versions=torch.tensor([int(e.model_version) for e in row_exps], dtype=torch.long),
        info=[dict(e.info) for e in row_exps],
        prompt_length=prompt_len,
        response_length=response_len,
        token_level_rewards=token_level_rewards,
        teacher_logprobs=teacher_logprobs,
        multi_modal_inputs=[e.multi_modal_inputs for e in row_exps]
        if any(e.multi_modal_inputs for e in row_exps)
        else None,
    )


def _ids(keys: list[Any]) -> torch.Tensor:
    """Long tensor ``(B,)``: equal ids for equal keys, numbered in order of first appearance."""
    ids: dict[Any, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def map_rows(
    batch: TrainBatch,
    tensor_fn: Callable[[str, torch.Tensor], torch.Tensor],
    list_fn: Callable[[list[Any]], list[Any]],
) -> TrainBatch:
    """A new batch with every per-row value replaced: tensors whose first dimension is the row
    count through ``tensor_fn(name, tensor)``, per-row lists (``info``, ``uids``, a plugin's) through
    ``list_fn``; other values (``prompt_length``, flags) unchanged."""
    n = batch.num_rows

    def one(key: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            return tensor_fn(key, value)
        if isinstance(value, list) and len(value) == n:
            return list_fn(value)
        return value

    changes = {key: one(key, getattr(batch, key)) for key in _FIELDS if getattr(batch, key) is not None}
    extra = {key: one(key, value) for key, value in batch.extra.items()}
    return batch.with_(**changes, extra=extra)


def select_rows(batch: TrainBatch, index: torch.Tensor | list[int]) -> TrainBatch:
    """The rows ``index`` of ``batch`` (tensors with a batch dimension, and per-row lists)."""
    index = torch.as_tensor(index, dtype=torch.long)
    picked = index.tolist()
    return map_rows(batch, lambda _, v: v[index.to(v.device)], lambda v: [v[i] for i in picked])


def to_device(batch: TrainBatch, device: torch.device | str) -> TrainBatch:
    """``batch`` with every tensor moved to ``device`` (other values unchanged)."""
    changes = {
        key: getattr(batch, key).to(device)
        for key in _FIELDS
        if isinstance(getattr(batch, key), torch.Tensor)
    }
    extra = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.extra.items()}
    return batch.with_(**changes, extra=extra)


__all__ = ["TrainBatch", "build_batch", "map_rows", "position_ids_from_mask", "select_rows", "to_device"]
