"""RULER on math tasks: a judge scores the whole group of answers to a question at once.

Registered names (Trinity-RFT's, with its task format: a question and a reference answer):

* ``math_ruler_workflow``  the policy samples ``repeat_times`` answers (``math_workflow``'s
  prompt); the judge, the first of ``explorer.auxiliary_models``, reads them all and ends its
  reply with a list of one score in ``[0, 1]`` per answer (:func:`ruler_messages`), which
  become the rewards. The reference answer is only measured: ``math_reward``'s parts
  (``accuracy``, ``format_score``) and their sum ``gold_reward`` go to ``metrics``.
* ``math_trainable_ruler_workflow``  the policy is its own judge and learns to judge. With
  probability ``ground_truth_probability`` (0.2) a task's reference answer is taken as known:
  the answers are rewarded with ``gold_reward``, the policy judges the group ``repeat_times``
  times, and each judging is an experience too, rewarded by its agreement with the reference
  (``1 - mean |score - (gold_reward + 0.1) / 1.2|``, the gold reward scaled from
  ``math_reward``'s ``[-0.1, 1.1]``; 0 for a judging whose scores cannot be read), in a group of
  its own (``eid.task`` label ``-ruler``). Otherwise the policy judges once, the mean scores of
  the readable judgings are the answers' rewards, and the judging is not trained. Eval tasks
  always take the second branch.

A judging that fails (no reply in ``judge_timeout`` seconds after ``judge_retries`` retries, an
error, a refusal, a reply without a list of exactly as many scores: see
:mod:`trinity_math.judge`) gives every answer ``fallback_reward`` (0.0, Trinity-RFT's value: a
group of equal rewards has no advantage), sets ``info["judge_failure"]`` and the
``judge_<reason>`` metrics, and is counted and logged.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Task
from trinity_math.judge import (
    FAILURES,
    FALLBACKS,
    Judge,
    JudgeFailure,
    Verdict,
    ask_judge,
    judge_settings,
    model_judge,
    parse_scores,
    workflow_args_of,
)
from trinity_math.workflows import MathWorkflow

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trinity.experience import Experience

#: Trinity-RFT's chance that a task's reference answer is used (math_trainable_ruler_workflow).
GROUND_TRUTH_PROBABILITY = 0.2
#: ``eid.task`` label of the trainable judge's experiences: a group of their own in the task.
JUDGE_GROUP = "-ruler"


def ruler_messages(question: str, answers: list[str]) -> list[dict[str, str]]:
    """The judge's chat: the question and the numbered answers; the reply must end with the
    list of ``len(answers)`` scores in ``[0, 1]``, in answer order."""
    n = len(answers)
    system = (
        f"You judge solutions to a problem. You get a question and {n} candidate solutions to it. "
        "Compare them, decide how well each one solves the question, and give each a score "
        "between 0 and 1."
    )
    solutions = "\n\n".join(f"Candidate solution {i + 1}: {text}" for i, text in enumerate(answers))
    user = (
        f"Question: {question}\n\n"
        "The solutions were asked to reason inside <think> </think> and to give the final answer "
        "inside <answer> </answer>.\n\n"
        f"{solutions}\n\n"
        "Score each solution between 0 (wrong) and 1 (correct and well reasoned). You may compare "
        "them and reason briefly first. End your reply with the scores as one list, in solution "
        f"order: [score of solution 1, ..., score of solution {n}]"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _where(task: Task) -> str:
    return f"task {task.index} of taskset {task.taskset_name!r}"


def mark_fallback(experience: Experience, verdict: Verdict, fallback: float) -> None:
    """Give ``experience`` the fallback reward and say why in ``info["judge_failure"]``."""
    experience.reward = fallback
    experience.info["judge_failure"] = f"{verdict.reason}: {verdict.detail}"


class MathRULERWorkflow(MathWorkflow):
    """``math_ruler_workflow``: answers as ``math_workflow``'s, rewarded by a judge model's scores.

    ``workflow_args``:
        judge_timeout: seconds one judge call may take (default 600).
        judge_retries: retries of a judge call that timed out or failed (default 1).
        fallback_reward: every answer's reward when the judging fails (default 0.0).
    """

    workflow_name: ClassVar[str] = "math_ruler_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("judge_timeout", "judge_retries", "fallback_reward")

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        self.judge: Judge = self.make_judge(auxiliary_models)
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def make_judge(self, auxiliary_models: list[Any] | None) -> Judge:
        """The judge: the first auxiliary model (a subclass may bring its own :class:`Judge`)."""
        return model_judge(auxiliary_models, self.workflow_name)

    @property
    def display_name(self) -> str:
        return self.workflow_name

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        args = workflow_args_of(workflow_args, self.WORKFLOW_ARGS, self.workflow_name)
        self.judge_timeout, self.judge_retries, self.fallback_reward = judge_settings(
            args, self.workflow_name
        )

    def judge_group(self, responses: list[Experience]) -> Verdict:
        """The judge's scores of ``responses`` (one judging of the whole group)."""
        n = len(responses)
        return ask_judge(
            self.judge,
            ruler_messages(self.task_desc, [r.response_text or "" for r in responses]),
            lambda text: parse_scores(text, n),
            timeout=self.judge_timeout,
            retries=self.judge_retries,
        )

    def _gold(self, responses: list[Experience]) -> list[Experience]:
        responses = self.score(responses)  # math_reward's parts in metrics, reward = their sum
        for response in responses:
            response.metrics["gold_reward"] = float(response.reward)
        return responses

    def run(self) -> list[Experience]:
        """Sample the group, measure it against the reference, reward it with the judge's scores."""
        self._start_verifier()
        responses = self._gold(self.model.chat(self.format_messages(), **self.rollout_args))
        verdict = self.judge_group(responses)
        if not verdict.ok:
            FALLBACKS.record(self.workflow_name, _where(self.task), verdict, self.fallback_reward)
        for i, response in enumerate(responses):
            response.metrics.update(verdict.metrics())
            if verdict.ok:
                response.reward = verdict.scores[i]  # type: ignore[index]
            else:
                mark_fallback(response, verdict, self.fallback_reward)
        return responses

    async def run_async(self) -> list[Experience]:
        """:meth:`run` in a worker thread (the judging is synchronous)."""
        return await asyncio.to_thread(self.run)


class MathTrainableRULERWorkflow(MathWorkflow):
    """``math_trainable_ruler_workflow``: the policy judges its own group, and learns to.

    ``workflow_args``:
        ground_truth_probability: chance that a training task's reference answer is used
            (its judgings trained, the answers rewarded with ``gold_reward``); default 0.2.
        fallback_reward: the answers' reward when no judging could be read (default 0.0).

    Which tasks use their reference answer is drawn from the task (taskset, index), the
    weights' version and ``run_id_base``: a rerun of a job draws the same.
    """

    workflow_name: ClassVar[str] = "math_trainable_ruler_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("ground_truth_probability", "fallback_reward")

    @property
    def display_name(self) -> str:
        return self.workflow_name

    @classmethod
    def _ground_truth_probability(cls, args: Mapping[str, Any]) -> float:
        p = float(args.get("ground_truth_probability", GROUND_TRUTH_PROBABILITY))
        if not 0.0 <= p <= 1.0:
            raise ValueError(
                f"{cls.workflow_name}: workflow_args.ground_truth_probability must be in [0, 1], got {p}"
            )
        return p

    @classmethod
    def experiences_per_rollout(cls, workflow_args: Mapping[str, Any]) -> float:
        """Each answer, and with probability ``ground_truth_probability`` a judging beside it
        (a task that uses its reference is judged ``repeat_times`` times, each trained)."""
        return 1.0 + cls._ground_truth_probability(workflow_args)

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        args = workflow_args_of(workflow_args, self.WORKFLOW_ARGS, self.workflow_name)
        self.ground_truth_probability = self._ground_truth_probability(args)
        _, _, self.fallback_reward = judge_settings(
            {"fallback_reward": args.get("fallback_reward", 0.0)}, self.workflow_name
        )

    def uses_ground_truth(self) -> bool:
        """Whether this run trains the judging on the reference answer (never for eval tasks)."""
        if self.task.is_eval:
            return False
        version = getattr(self.model, "model_version", 0)
        draw = random.Random(f"{self.task.taskset_name}/{self.task.index}/{version}/{self.run_id_base}")
        return draw.random() < self.ground_truth_probability

    def _read(self, judging: Experience, n: int) -> Verdict:
        text = judging.response_text or ""
        try:
            return Verdict(parse_scores(text, n), reply=text)
        except JudgeFailure as failure:
            return Verdict(None, reply=text, reason=failure.reason, detail=failure.detail)

    def run(self) -> list[Experience]:
        """Answers, then the policy's judging(s) of them; see the module's docstring."""
        self._start_verifier()
        responses = self.score(self.model.chat(self.format_messages(), **self.rollout_args))
        gold = [float(r.reward) for r in responses]
        for response, value in zip(responses, gold):
            response.metrics["gold_reward"] = value
        with_gold = self.uses_ground_truth()
        args = dict(self.rollout_args)
        if not with_gold:
            args["n"] = 1
        n = len(responses)
        judgings = self.model.chat(
            ruler_messages(self.task_desc, [r.response_text or "" for r in responses]), **args
        )
        # math_reward's [-0.1, 1.1] scaled to the judge's [0, 1].
        targets = [min(1.0, max(0.0, (g + 0.1) / 1.2)) for g in gold]
        verdicts = [self._read(judging, n) for judging in judgings]
        for j, (judging, verdict) in enumerate(zip(judgings, verdicts)):
            agreement = 0.0
            if with_gold and verdict.ok:
                agreement = 1.0 - math.fsum(abs(s - t) for s, t in zip(verdict.scores, targets)) / n  # type: ignore[arg-type]
            judging.reward = agreement
            judging.metrics.update(verdict.metrics())
            judging.metrics["reward_for_judge"] = agreement
            judging.info["ruler"] = "judge"
            if not verdict.ok:
                judging.info["judge_failure"] = f"{verdict.reason}: {verdict.detail}"
                FALLBACKS.record(
                    self.workflow_name, _where(self.task), verdict, 0.0 if with_gold else self.fallback_reward
                )
            judging.eid.task = JUDGE_GROUP  # the explorer keeps it apart: "<task>-ruler"
            judging.eid.run = self.run_id_base + j
        read = [v.scores for v in verdicts if v.ok]
        shares = {
            "judge_success": len(read) / len(verdicts) if verdicts else 0.0,
            **{f"judge_{r}": sum(v.reason == r for v in verdicts) / max(1, len(verdicts)) for r in FAILURES},
        }
        for i, response in enumerate(responses):
            response.metrics.update(shares)
            if with_gold:
                continue  # rewarded with gold_reward by score()
            if read:
                response.reward = math.fsum(scores[i] for scores in read) / len(read)  # type: ignore[index]
            else:
                failed = (
                    verdicts[0] if verdicts else Verdict(None, reason="error", detail="no judging sampled")
                )
                mark_fallback(response, failed, self.fallback_reward)
        return responses + judgings if with_gold else responses

    async def run_async(self) -> list[Experience]:
        """:meth:`run` in a worker thread (the judging is synchronous)."""
        return await asyncio.to_thread(self.run)
