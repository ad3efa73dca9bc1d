"""On-policy distillation: the student samples, the teacher scores every sampled token.

Registered names:

* ``on_policy_distill_workflow``  the task's prompt as the user turn (``format.system_prompt``
  and ``format.reply_prefix`` as in ``simple_workflow``); reward 0.0;
* ``on_policy_distill_math_workflow``  a Qwen2.5-Math style prompt (system "You are a helpful
  assistant.", the question followed by "Please reason step by step, and put your final answer
  within \\boxed{}."); reward = ``accuracy`` of the response against the truth (this plugin's
  ``accuracy_reward``: the last ``\\boxed{}``, else math-verify's extraction).

The student (the rollout model) samples ``repeat_times`` responses in one call. The teacher is
the first auxiliary model (``explorer.auxiliary_models[0]``); it must share the student's
tokenizer, since it scores the student's token ids. For each response, the teacher's log-probs
of the response tokens (at ``workflow_args.temperature``, default 1.0) are stored on
``Experience.teacher_logprobs``, aligned with ``Experience.logprobs``; the trainer's advantage
(``on_policy_distill``) is then built from ``teacher_logprobs - logprobs``. Each Experience also
gets ``metrics["kl_divergence"]`` = ``sum(logprobs - teacher_logprobs)`` over the response (a
one-sample estimate of KL(student || teacher)) and ``eid.run = run_id_base + i``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Task
from trinity_math.rewards import AccuracyReward, _require_truth
from trinity_math.workflows import PromptWorkflow

if TYPE_CHECKING:
    import torch

    from trinity.experience import Experience

QWEN_MATH_SYSTEM_PROMPT = "You are a helpful assistant."
QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class OnPolicyDistillWorkflow(PromptWorkflow):
    """Student samples, teacher (``auxiliary_models[0]``) scores: ``teacher_logprobs``, reward 0.

    Messages as ``simple_workflow``'s (:class:`~trinity_math.workflows.PromptWorkflow`).

    ``workflow_args``:
        temperature: temperature of the teacher's log-probs (default 1.0).
    """

    is_async: ClassVar[bool] = True

    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("temperature",)
    #: Registered name, for messages.
    workflow_name: ClassVar[str] = "on_policy_distill_workflow"

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        if not auxiliary_models:
            raise ValueError(
                f"{self.workflow_name} needs a teacher model: configure one in explorer.auxiliary_models "
                "(the first auxiliary model is the teacher)"
            )
        self.teacher = auxiliary_models[0]
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    @property
    def display_name(self) -> str:
        return self.workflow_name

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        unknown = sorted(set(workflow_args) - set(self.WORKFLOW_ARGS))
        if unknown:
            raise ValueError(
                f"{self.workflow_name}: unknown workflow_args {unknown}; valid: {list(self.WORKFLOW_ARGS)}"
            )
        self.temperature = float(workflow_args.get("temperature", 1.0))
        if self.temperature <= 0:
            raise ValueError(
                f"{self.workflow_name}: workflow_args.temperature must be > 0, got {self.temperature}"
            )

    def compute_reward(self, response: Experience) -> float:
        """The reward of one response (0.0 here: the teacher's log-probs are the signal)."""
        return 0.0

    # -- teacher ---------------------------------------------------------------------------

    def _teacher_tokens(self, response: Experience) -> list[int]:
        if response.prompt_length < 1:
            raise ValueError(
                f"{self.workflow_name}: the response has no prompt token before it, so the teacher cannot "
                "score its first token"
            )
        return response.tokens.tolist()

    def _attach(self, i: int, response: Experience, teacher_logprobs: torch.Tensor) -> Experience:
        """Store the teacher's response log-probs, the reward, ``kl_divergence`` and ``eid.run``."""
        import torch

        teacher = torch.as_tensor(teacher_logprobs).detach().float().cpu()[response.prompt_length - 1 :]
        n = response.response_length
        if teacher.shape[0] != n:
            raise ValueError(
                f"{self.workflow_name}: the teacher's log-probs cover {teacher.shape[0]} response tokens but the "
                f"response has {n} (tokens={response.tokens.shape[0]}, prompt_length={response.prompt_length})"
            )
        student = response.logprobs
        if student is not None and student.shape[-1] != n:
            raise ValueError(
                f"{self.workflow_name}: the teacher's log-probs cover {n} response tokens but the student's "
                f"logprobs have {student.shape[-1]}"
            )
        response.teacher_logprobs = teacher
        response.reward = float(self.compute_reward(response))
        if student is not None:
            response.metrics["kl_divergence"] = float((student.float().cpu() - teacher).sum())
        response.eid.run = self.run_id_base + i
        return response

    async def _teacher_logprobs_async(self, tokens: list[int]) -> torch.Tensor:
        scorer = getattr(self.teacher, "logprobs_async", None)
        if scorer is not None:
            return await scorer(tokens, temperature=self.temperature)
        return await asyncio.to_thread(self.teacher.logprobs, tokens, temperature=self.temperature)

    # -- running ---------------------------------------------------------------------------

    def run(self) -> list[Experience]:
        """Sample with ``model.chat``, then score every response with the teacher."""
        responses = self.model.chat(self.format_messages(), **self.rollout_args)
        return [
            self._attach(i, r, self.teacher.logprobs(self._teacher_tokens(r), temperature=self.temperature))
            for i, r in enumerate(responses)
        ]

    async def run_async(self) -> list[Experience]:
        """Same as :meth:`run` through ``model.chat_async``; the teacher scores all responses at once."""
        responses = await self.model.chat_async(self.format_messages(), **self.rollout_args)
        scores = await asyncio.gather(
            *(self._teacher_logprobs_async(self._teacher_tokens(r)) for r in responses)
        )
        return [self._attach(i, r, s) for i, (r, s) in enumerate(zip(responses, scores))]


class OnPolicyDistillMathWorkflow(OnPolicyDistillWorkflow):
    """``on_policy_distill_workflow`` with a Qwen2.5-Math prompt and ``accuracy`` as the reward.

    Messages: ``format.system_prompt`` (default "You are a helpful assistant."), then the
    question followed by "\\nPlease reason step by step, and put your final answer within
    \\boxed{}." and ``format.reply_prefix`` (if any). The reward is ``accuracy_reward``'s
    ``accuracy`` (1.0 / 0.0), also logged as ``metrics["accuracy"]``.
    """

    workflow_name: ClassVar[str] = "on_policy_distill_math_workflow"

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        self.accuracy = AccuracyReward()
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    default_system_prompt: ClassVar[str | None] = QWEN_MATH_SYSTEM_PROMPT

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.truth = _require_truth(self.truth, self.workflow_name)

    def user_content(self) -> str:
        return f"{self.task_desc}\n{QWEN_MATH_INSTRUCTION}"

    def compute_reward(self, response: Experience) -> float:
        accuracy = self.accuracy(response.response_text or "", self.truth)["accuracy"]
        response.metrics["accuracy"] = accuracy
        return accuracy
