"""Experience: one trajectory (or one SFT / DPO sample) on its way from explorer to trainer.

Also the reading side of the buffers as components see it (:class:`BufferReader`,
:class:`BufferExhausted`): sample strategies draw Experiences through it without depending on
the buffer layer (:mod:`trinity.buffer` implements it and re-exports both names).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# Per-token tensors are indexed over the *response* part: tokens[prompt_length:].
_RESPONSE_TENSORS = (
    "logprobs",
    "action_mask",
    "advantages",
    "returns",
    "token_level_reward",
    "teacher_logprobs",
    "token_versions",
)
_TENSOR_FIELDS = ("tokens", "chosen", "rejected", *_RESPONSE_TENSORS)


@dataclass
class EID:
    """Where an experience comes from: explorer ``batch`` (step), ``task`` within it, ``run``
    (repeat index) and ``step`` (turn, for workflows that emit one experience per step)."""

    batch: int | str = 0
    task: int | str = 0
    run: int = 0
    step: int = 0
    suffix: str = ""

    @property
    def tid(self) -> str:
        """Task id: experiences with the same ``tid`` are rollouts of one task (one group)."""
        return f"{self.batch}/{self.task}"

    @property
    def explorer_step(self) -> int | None:
        """``batch`` when it is an explorer step number (the explorer sets it), else ``None``
        (a label such as a test's or ``expert/<step>``)."""
        batch = self.batch
        if isinstance(batch, bool):
            return None
        if isinstance(batch, int):
            return batch
        return int(batch) if isinstance(batch, str) and batch.isdigit() else None

    @property
    def uid(self) -> str:
        """Unique id of this experience."""
        base = f"{self.batch}/{self.task}/{self.run}/{self.step}"
        return f"{base}/{self.suffix}" if self.suffix else base


@dataclass
class Experience:
    """One sample for the trainer.

    ``tokens`` holds prompt and response token ids; ``prompt_length`` splits them. Per-token
    tensors (``logprobs``, ``action_mask``, ``advantages``, ``returns``,
    ``token_level_reward``, ``teacher_logprobs``) cover the response part only. ``action_mask`` marks the tokens
    produced by the policy (multi-turn: assistant turns only); ``None`` means all response
    tokens. ``teacher_logprobs`` are a teacher model's log-probs of the response tokens
    (on-policy distillation records them; see ``ModelWrapper.logprobs``). ``token_versions`` is
    the model version each response token was sampled with, where they differ (a partial rollout
    resumed under new weights, ``explorer.over_rollout.partial_rollout``); ``None`` means all were
    sampled with ``model_version``. DPO samples keep the
    prompt in ``tokens`` and the two responses in ``chosen`` / ``rejected``.

    A multi-step (step-wise) episode is one Experience per model call, all with the same
    ``eid.batch`` / ``eid.task`` / ``eid.run`` and ``eid.step`` counting the turns: the trainer
    sees them as one trajectory (``trajectory_ids``) inside the task's group (``group_ids``).

    A prompt with images (:mod:`trinity.multimodal`) carries the images' encoded bytes in
    ``images`` and the image processor's output for them (``pixel_values``,
    ``image_grid_thw``) in ``multi_modal_inputs``, which the trainer's forward pass takes as is:
    both buffers keep them bit for bit.
    """

    tokens: torch.Tensor
    prompt_length: int
    logprobs: torch.Tensor | None = None
    reward: float | None = None
    action_mask: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    token_level_reward: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_text: str | None = None
    response_text: str | None = None
    eid: EID = field(default_factory=EID)
    model_version: int = 0
    chosen: torch.Tensor | None = None
    rejected: torch.Tensor | None = None
    messages: list[dict[str, Any]] | None = None
    teacher_logprobs: torch.Tensor | None = None
    token_versions: torch.Tensor | None = None
    multi_modal_inputs: dict[str, torch.Tensor] | None = None
    images: list[bytes] | None = None

    def __post_init__(self) -> None:
        for name in _TENSOR_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                setattr(self, name, torch.as_tensor(value))
        if self.multi_modal_inputs is not None:
            self.multi_modal_inputs = {
                k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
                for k, v in self.multi_modal_inputs.items()
            }
        # shape[0], not len(): Tensor.__len__ is a Python-level call, and the buffers build
        # tens of thousands of experiences per second.
        if self.prompt_length < 0 or self.prompt_length > self.tokens.shape[0]:
            raise ValueError(f"prompt_length {self.prompt_length} is outside the {len(self.tokens)} tokens")
        if self.chosen is None:
            n = self.response_length
            for name in _RESPONSE_TENSORS:
                value = getattr(self, name)
                if value is not None and value.shape[-1] != n:
                    raise ValueError(
                        f"Experience.{name} has {value.shape[-1]} entries but the response has "
                        f"{n} tokens (len(tokens) - prompt_length)"
                    )

    @property
    def response_length(self) -> int:
        return self.tokens.shape[0] - self.prompt_length

    # -- serialisation (SQL / file buffers, Ray object store) -------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python view: tensors become numpy arrays, ``eid`` a dict."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _TENSOR_FIELDS and value is not None:
                value = value.detach().cpu().numpy()
            elif f.name == "multi_modal_inputs" and value is not None:
                value = {k: v.detach().cpu().numpy() for k, v in value.items()}
            elif f.name == "eid":
                value = vars(value).copy()
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Experience:
        data = dict(data)
        eid = data.pop("eid", None) or {}
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Experience fields: {sorted(unknown)}")
        return cls(eid=EID(**eid), **data)

    def serialize(self) -> bytes:
        """Compact binary form: raw tensor bytes plus pickled small fields (see
        :mod:`trinity.experience_codec`). Trusted storage only."""
        from trinity.experience_codec import encode

        return encode(self, _TENSOR_FIELDS, _PLAIN_FIELDS)

    @classmethod
    def deserialize(cls, blob: bytes) -> Experience:
        """The experience :meth:`serialize` made (also reads the older pickled-dict blobs)."""
        from trinity.experience_codec import MAGIC, decode

        if bytes(blob[:4]) != MAGIC:
            return cls.from_dict(pickle.loads(blob))
        data = decode(blob)
        eid = data.pop("eid", None)
        if not data.keys() <= _FIELD_DEFAULTS.keys():  # a field this version does not know
            return cls.from_dict({**data, "eid": dict(zip(_EID_FIELDS, eid)) if eid else {}})
        # The blob was made by serialize() from a validated Experience, so __init__'s checks
        # are skipped: they cost a quarter of the read path of the SQL buffer.
        exp = cls.__new__(cls)
        exp.__dict__.update(_FIELD_DEFAULTS)
        exp.__dict__.update(data)
        exp.eid = EID(*eid) if eid else EID()
        return exp


_EID_FIELDS = ("batch", "task", "run", "step", "suffix")


# Computed once: ``dataclasses.fields`` is slow enough to show in the buffers' throughput.
_PLAIN_FIELDS = tuple(f.name for f in fields(Experience) if f.name not in _TENSOR_FIELDS)
# Fields absent from a blob were None when it was written (serialize() leaves out only those).
_FIELD_DEFAULTS: dict[str, Any] = {f.name: None for f in fields(Experience)}


def group_ids_of(experiences: list[Experience]) -> torch.Tensor:
    """Long tensor ``(B,)``: equal ids for experiences of the same task (same ``eid.tid``)."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(e.eid.tid, len(ids)) for e in experiences], dtype=torch.long)


# -- reading experiences ---------------------------------------------------------------------


class BufferExhausted(Exception):
    """Raised by a reader when no more data will ever come (finite source, writers done)."""


# Why a read returned fewer experiences than asked (BufferReader.short_reason).
STEP_ENDED = "step ended"  # the writers ended the expected step: nothing more is coming for it
TIMED_OUT = "timed out"  # the read's timeout passed first


@runtime_checkable
class BufferReader(Protocol):
    """Where a sample strategy (or the explorer) reads Experiences from."""

    short_reason: str | None

    def read(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Return up to ``batch_size`` unread experiences, each exactly once.

        Blocks until ``batch_size`` are available, or the writers ended the step given to
        :meth:`expect_step` and nothing is left unread, or ``timeout`` seconds pass; then
        returns what it has (possibly nothing; :attr:`short_reason` says why it is short:
        :data:`STEP_ENDED` or :data:`TIMED_OUT`).
        Raises :class:`BufferExhausted` when nothing more can come.
        """

    def expect_step(self, step: int | None) -> None:
        """The next reads wait for the experiences of the writers' steps up to ``step``
        (``None``: for a full batch), and take none of a later explorer step (experiences
        whose ``eid.explorer_step`` is unknown are not held back): a step's groups and
        episodes are never split between reads. Readers of storages without writers ignore it."""

    def state_dict(self) -> dict[str, Any]:
        """Reader position, saved in checkpoints."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Experience buffers (``sql``, and ``queue`` with an SQL mirror) also make the
        experiences this reader consumed *after* saving ``state`` unread again: the trainer
        steps that trained on them were lost with the crash. Readers may offer
        ``set_step(step)`` to record which trainer step consumed each experience.
        """
