"""Base class of algorithm types: one name that configures a whole algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from trinity.config import Config

Schema = Literal["experience", "sft", "dpo", "cpt"]


class AlgorithmType:
    """Describes an algorithm: which models it needs and which components it uses by default.

    Class attributes:
        use_critic: train a value model (PPO).
        use_reference: keep a frozen reference model (KL terms).
        use_advantage: call the advantage function (SFT and DPO do not).
        can_balance_batch: rows may be reordered when splitting into micro-batches.
        step_wise: each rollout may be several experiences (one per turn, sharing
            ``eid.batch/task/run``, see :class:`~trinity.experience.Experience`); a training step
            then trains on one explorer step's experiences, with ``buffer.train_batch_size`` as
            the upper bound (set it to ``batch_size × repeat_times × the most turns``).
        schema: the experience format: ``experience`` (rollouts), ``sft``, ``dpo`` or
            ``cpt`` (raw text, every token trained).
    """

    use_critic: ClassVar[bool] = False
    use_reference: ClassVar[bool] = False
    use_advantage: ClassVar[bool] = True
    can_balance_batch: ClassVar[bool] = True
    step_wise: ClassVar[bool] = False
    schema: ClassVar[Schema] = "experience"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Defaults for the ``algorithm`` section: ``repeat_times``, ``advantage_fn``,
        ``policy_loss_fn``, ``kl_loss_fn``, ``kl_penalty_fn``, ``entropy_loss_fn``,
        ``sample_strategy``. Values the user sets win."""
        return {}

    @classmethod
    def derived_args(cls, config: Config) -> dict[str, dict[str, Any]]:
        """Component arguments that follow from the resolved config, by ``algorithm`` field
        (e.g. ``{"policy_loss_fn_args": {...}}``): config resolution fills each one the user left
        unset, before :meth:`check_config`. ``config.geometry`` holds the step sizes."""
        return {}

    @classmethod
    def explored_per_train_step(cls, config: Config) -> int:
        """Experiences a train step reads from the explorer's output: ``buffer.train_batch_size``
        unless the algorithm's sample strategy fills part of the batch from elsewhere (``mix``:
        expert rows from an auxiliary buffer). The batch geometry counts explore steps per
        train step with it."""
        return config.buffer.train_batch_size

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Validate cross-field rules on the resolved config (never change it: derived values
        come from :meth:`derived_args`); raise ``ValueError`` with a message naming the
        offending key (e.g. DPO only in ``train`` mode)."""
