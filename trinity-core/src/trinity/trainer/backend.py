"""What :class:`~trinity.trainer.trainer.Trainer` calls on a back-end: :class:`TrainerBackend`.

Both :class:`~trinity.trainer.native.NativeTrainer` (``trainer_type: native``) and
:class:`~trinity.trainer.verl.trainer.VerlTrainer` (``trainer_type: verl``) implement it; a test
or a new back-end passes its own object to ``Trainer(config, backend=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from trinity.experience import Experience


@runtime_checkable
class TrainerBackend(Protocol):
    """A trainer back-end: one gradient step per batch of experiences, weights, checkpoints."""

    #: The model's tokenizer (the trainer's buffer readers use it to tokenise SFT/DPO datasets).
    tokenizer: Any
    #: Steps trained so far; the Trainer advances it itself on an empty step.
    global_step: int

    def train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """Train on one batch; returns metrics with Trinity-RFT names."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's full weights as CPU tensors with Hugging Face names (for weight sync)."""
        ...

    def save_checkpoint(self, step: int | None = None, extra_state: dict[str, Any] | None = None) -> str:
        """Save ``<job_dir>/global_step_<step>/`` with ``extra_state``; returns its path."""
        ...

    def load_checkpoint(self, path: str | None = None) -> dict[str, Any] | None:
        """Restore from ``path`` (default: the job's latest checkpoint); returns the saved
        ``extra_state``, or ``None`` when there is no checkpoint."""
        ...


__all__ = ["TrainerBackend"]
