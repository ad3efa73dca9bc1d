"""Rubrics as rewards: a judge model rates each answer against the task's rubrics.

Registered names (Trinity-RFT's, with its task format: a ``question`` and ``rubric``, a list of
``{"description": ..., "weight": ..., "title": ...}``, as in RaR-Medicine):

* ``rubric_judge_workflow``  the judge is the first of ``explorer.auxiliary_models``;
* ``rubric_judge_openai_workflow``  the judge is an OpenAI-compatible API:
  ``workflow_args.judge_model_name`` (required), its address in the environment variable named
  by ``judge_api_base_url_env`` (default ``OPENAI_BASE_URL``), its key in
  ``judge_api_key_env`` (default ``OPENAI_API_KEY``).

The policy samples ``repeat_times`` answers; the judge rates each one separately (all at once,
at temperature 0) with a JSON ``{"rating": 1..10}``, and the reward is ``rating / 10``. A
judging that fails (see :mod:`trinity_math.judge`) gives that answer ``fallback_reward``
(0.0), ``info["judge_failure"]`` and the ``judge_<reason>`` metrics, and is counted and logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Task
from trinity_math.judge import (
    FALLBACKS,
    EndpointJudge,
    Judge,
    Verdict,
    ask_judge,
    judge_settings,
    model_judge,
    parse_rating,
    workflow_args_of,
)
from trinity_math.ruler import mark_fallback
from trinity_math.workflows import PromptWorkflow

if TYPE_CHECKING:
    from trinity.experience import Experience

logger = logging.getLogger(__name__)

RUBRIC_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question and the Assistant "
    "answers it, first thinking the reasoning through and then giving the answer."
)

JUDGE_SYSTEM_PROMPT = (
    "You are an expert evaluator. Given a prompt, a response to it and a list of weighted "
    "quality rubrics, rate the overall quality of the response from 1 to 10 by how well it meets "
    "the rubrics taken together: a response that fails several rubrics gets a low rating, one "
    "that meets all of them a high rating.\n"
    'Begin your reply with a JSON object in a ```json code block, with the single key "rating" '
    "and an integer from 1 to 10 as its value, for example:\n"
    '```json\n{"rating": 7}\n```'
)


def rubric_text(rubric: Any) -> str | None:
    """The rubrics as numbered lines (``Rubric 1 (weight: 5): ...``); ``None`` when there are none.
    ``rubric`` is a list of dicts (or of strings), or that list as JSON text."""
    if isinstance(rubric, str):
        try:
            rubric = json.loads(rubric)
        except ValueError:
            rubric = [rubric]
    if not rubric:
        return None
    if isinstance(rubric, dict):
        rubric = [rubric]
    lines = []
    for i, item in enumerate(rubric, 1):
        if isinstance(item, dict):
            weight = item.get("weight")
            text = item.get("description") or item.get("title") or ""
            lines.append(f"Rubric {i}" + (f" (weight: {weight})" if weight is not None else "") + f": {text}")
        else:
            lines.append(f"Rubric {i}: {item}")
    return "\n".join(lines)


def rubric_messages(prompt: str, response: str, rubrics: str | None) -> list[dict[str, str]]:
    """The judge's chat for one response."""
    user = (
        "Rate the response to the prompt below from 1 to 10 by how well it meets the rubrics.\n"
        f"<prompt>\n{prompt}\n</prompt>\n<response>\n{response}\n</response>\n"
        f"<rubrics>\n{rubrics or 'No rubrics are given.'}\n</rubrics>\n"
        "Your JSON evaluation:"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


class RubricJudgeWorkflow(PromptWorkflow):
    """``rubric_judge_workflow``: reward = the judge's 1-10 rating of each answer / 10.

    The policy's chat as ``simple_workflow``'s, with a default system prompt asking it to think
    before answering. ``workflow_args``:
        judge_timeout: seconds one judge call may take (default 600).
        judge_retries: retries of a judge call that timed out or failed (default 1).
        fallback_reward: an answer's reward when its judging fails (default 0.0).
    """

    is_async: ClassVar[bool] = False
    workflow_name: ClassVar[str] = "rubric_judge_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("judge_timeout", "judge_retries", "fallback_reward")
    default_system_prompt: ClassVar[str | None] = RUBRIC_SYSTEM_PROMPT

    @property
    def display_name(self) -> str:
        return self.workflow_name

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        args = workflow_args_of(workflow_args, self.WORKFLOW_ARGS, self.workflow_name)
        self.judge_timeout, self.judge_retries, self.fallback_reward = judge_settings(
            args, self.workflow_name
        )
        self.judge: Judge = self.build_judge(args)

    def build_judge(self, args: dict[str, Any]) -> Judge:
        """The judge: the first auxiliary model."""
        return model_judge(self.auxiliary_models, self.workflow_name)

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.rubrics = rubric_text(task.raw_task.get("rubric"))
        if self.rubrics is None and not getattr(self, "_warned_no_rubric", False):
            self._warned_no_rubric = True
            logger.warning(
                "%s: task %d of taskset %r has no rubric (column 'rubric'); the judge rates without "
                "one (warned once per workflow instance)",
                self.workflow_name,
                task.index,
                task.taskset_name,
            )

    def judge_one(self, response: Experience) -> Verdict:
        """The judge's rating of one answer, as ``scores == [rating]``."""
        return ask_judge(
            self.judge,
            rubric_messages(self.task_desc, response.response_text or "", self.rubrics),
            lambda text: [parse_rating(text)],
            timeout=self.judge_timeout,
            retries=self.judge_retries,
            temperature=0.0,
        )

    def run(self) -> list[Experience]:
        """Sample the answers, have each rated (concurrently), reward = rating / 10."""
        responses = self.model.chat(self.format_messages(), **self.rollout_args)
        if not responses:
            return responses
        with ThreadPoolExecutor(len(responses), thread_name_prefix="trinity-rubric") as pool:
            verdicts = list(pool.map(self.judge_one, responses))
        where = f"task {self.task.index} of taskset {self.task.taskset_name!r}"
        for i, (response, verdict) in enumerate(zip(responses, verdicts)):
            response.eid.run = self.run_id_base + i
            response.metrics.update(verdict.metrics())
            if verdict.ok:
                response.reward = verdict.scores[0] / 10.0  # type: ignore[index]
            else:
                FALLBACKS.record(self.workflow_name, where, verdict, self.fallback_reward)
                mark_fallback(response, verdict, self.fallback_reward)
        return responses

    async def run_async(self) -> list[Experience]:
        """:meth:`run` in a worker thread (the judging is synchronous)."""
        return await asyncio.to_thread(self.run)


class RubricJudgeOpenAIWorkflow(RubricJudgeWorkflow):
    """``rubric_judge_openai_workflow``: the judge is an OpenAI-compatible API.

    ``workflow_args`` besides ``rubric_judge_workflow``'s:
        judge_model_name: the model the API serves (required).
        judge_api_base_url_env: the environment variable holding the API's base URL
            (``http://host:port/v1``; default ``OPENAI_BASE_URL``).
        judge_api_key_env: the one holding its key (default ``OPENAI_API_KEY``; may be unset).
    """

    workflow_name: ClassVar[str] = "rubric_judge_openai_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = (
        *RubricJudgeWorkflow.WORKFLOW_ARGS,
        "judge_model_name",
        "judge_api_base_url_env",
        "judge_api_key_env",
    )

    def build_judge(self, args: dict[str, Any]) -> Judge:
        """The API named by ``workflow_args`` and the environment."""
        model = args.get("judge_model_name")
        if not model:
            raise ValueError(
                f"{self.workflow_name}: set workflow_args.judge_model_name (the judge's model id)"
            )
        url_env = args.get("judge_api_base_url_env", "OPENAI_BASE_URL")
        base_url = os.environ.get(url_env, "")
        if not base_url:
            raise ValueError(
                f"{self.workflow_name}: the judge's address is read from ${url_env}, which is not set "
                "(set it, or name another variable in workflow_args.judge_api_base_url_env)"
            )
        api_key = os.environ.get(args.get("judge_api_key_env", "OPENAI_API_KEY"), "")
        return EndpointJudge(base_url, str(model), api_key, timeout=self.judge_timeout)
