"""math_ruler_workflow, math_trainable_ruler_workflow and rubric_judge_workflow(/_openai) with
scripted models: group scores -> rewards, the trainable judge's experiences, rubric ratings, and
the counted fallback when the judge fails."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from trinity.config import FormatConfig, GenerationConfig
from trinity.experience import Experience
from trinity.workflow import Task
from trinity_math.judge import FAILURES, FALLBACKS
from trinity_math.rubric import RubricJudgeOpenAIWorkflow, RubricJudgeWorkflow, rubric_text
from trinity_math.ruler import (
    JUDGE_GROUP,
    MathRULERWorkflow,
    MathTrainableRULERWorkflow,
    ruler_messages,
)
from trinity_math.workflows import R1_SYSTEM_PROMPT

RIGHT = "<think>3+4=7</think><answer>7</answer>"  # math_reward: accuracy 1 + format 0.1
WRONG = "<think>3+4=8</think><answer>8</answer>"  # accuracy 0 + format 0.1
SLOPPY = "8"  # accuracy 0, format -0.1


class ScriptedModel:
    """``chat`` answers with ``policy(messages, i)`` for sample ``i``; records each call."""

    def __init__(self, policy, model_version: int = 0) -> None:
        self.policy = policy
        self.model_version = model_version
        self.calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    def chat(self, messages, **args):
        self.calls.append((messages, args))
        out = []
        for i in range(args.get("n", 1)):
            text = self.policy(messages, i)
            out.append(
                Experience(
                    tokens=torch.arange(5 + len(text)) % 50,
                    prompt_length=5,
                    logprobs=torch.full((len(text),), -0.5),
                    response_text=text,
                )
            )
        return out


def answers(*texts):
    return lambda messages, i: texts[i % len(texts)]


def make_task(workflow, *, repeat_times=2, workflow_args=None, is_eval=False, row=None) -> Task:
    return Task(
        workflow=workflow,
        raw_task=row or {"question": "3+4", "answer": "3 and 4 make 7.\n#### 7"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(temperature=1.0, max_tokens=64),
        workflow_args=workflow_args or {},
        repeat_times=repeat_times,
        is_eval=is_eval,
        taskset_name="gsm8k",
        index=3,
    )


def run(workflow_cls, policy, judge=None, run_id_base=0, **task_args):
    task = make_task(workflow_cls, **task_args)
    workflow = task.to_workflow(policy, [judge] if judge is not None else None)
    workflow.set_repeat_times(task.repeat_times, run_id_base)
    return workflow.run()


# -- math_ruler_workflow ------------------------------------------------------------------------


def test_ruler_rewards_are_the_judges_scores_and_the_gold_is_measured():
    policy = ScriptedModel(answers(RIGHT, WRONG, SLOPPY))
    judge = ScriptedModel(lambda m, i: "Solution 1 is right.\n[0.9, 0.3, 0.05]")
    exps = run(MathRULERWorkflow, policy, judge, run_id_base=4, repeat_times=3)
    assert [e.reward for e in exps] == [0.9, 0.3, 0.05]
    assert [e.eid.run for e in exps] == [4, 5, 6]
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0, 0.0]
    assert [e.metrics["gold_reward"] for e in exps] == pytest.approx([1.1, 0.1, -0.1])
    assert all(e.metrics["judge_success"] == 1.0 and "judge_failure" not in e.info for e in exps)
    # the policy got math_workflow's chat; the judge one call with the question and the 3 answers
    [(messages, args)] = policy.calls
    assert messages[0] == {"role": "system", "content": R1_SYSTEM_PROMPT} and args["n"] == 3
    [(judged, judge_args)] = judge.calls
    assert judged == ruler_messages("3+4", [RIGHT, WRONG, SLOPPY]) and judge_args == {"n": 1}
    assert (
        "Candidate solution 3: 8" in judged[1]["content"] and "score of solution 3]" in judged[1]["content"]
    )


@pytest.mark.parametrize(
    ("reply", "reason"),
    [("I'm sorry, I cannot judge these.", "refused"), ("[0.5]", "malformed"), ("", "malformed")],
)
def test_a_judge_that_fails_gives_the_counted_fallback(reply, reason, caplog):
    before = FALLBACKS.total("math_ruler_workflow")
    with caplog.at_level(logging.WARNING, logger="trinity_math.judge"):
        exps = run(
            MathRULERWorkflow,
            ScriptedModel(answers(RIGHT, WRONG)),
            ScriptedModel(lambda m, i: reply),
            workflow_args={"fallback_reward": 0.25},
        )
    assert [e.reward for e in exps] == [0.25, 0.25]
    for e in exps:
        assert e.metrics["judge_success"] == 0.0 and e.metrics[f"judge_{reason}"] == 1.0
        assert sum(e.metrics[f"judge_{r}"] for r in FAILURES) == 1.0
        assert e.info["judge_failure"].startswith(f"{reason}: ")
        assert e.metrics["accuracy"] in (0.0, 1.0)  # the gold is still measured
    assert FALLBACKS.total("math_ruler_workflow") == before + 1  # one judging of the group
    if FALLBACKS.counts[("math_ruler_workflow", reason)] <= FALLBACKS.full:
        assert "math_ruler_workflow: the judge failed on task 3 of taskset 'gsm8k'" in caplog.text


def test_a_judge_that_hangs_times_out_into_the_fallback():
    slow = ScriptedModel(lambda m, i: time.sleep(5) or "[1, 1]")
    start = time.monotonic()
    exps = run(
        MathRULERWorkflow,
        ScriptedModel(answers(RIGHT)),
        slow,
        workflow_args={"judge_timeout": 0.2, "judge_retries": 1},
    )
    assert time.monotonic() - start < 3
    assert [e.reward for e in exps] == [0.0, 0.0]
    assert exps[0].metrics["judge_timeout"] == 1.0 and exps[0].metrics["judge_attempts"] == 2.0


def test_ruler_settings_errors_are_one_line():
    policy = ScriptedModel(answers(RIGHT))
    with pytest.raises(
        ValueError,
        match=r"math_ruler_workflow needs a judge model: configure one in explorer\.auxiliary_models",
    ):
        make_task(MathRULERWorkflow).to_workflow(policy, [])
    with pytest.raises(ValueError, match=r"unknown workflow_args \['judge_timout'\]"):
        make_task(MathRULERWorkflow, workflow_args={"judge_timout": 3}).to_workflow(policy, [policy])


# -- math_trainable_ruler_workflow -------------------------------------------------------------


def _judging(replies):
    """The policy: math answers to the question, ``replies`` to the judging chat."""

    def policy(messages, i):
        if messages[0]["content"].startswith("You judge solutions"):
            return replies[i]
        return [RIGHT, WRONG, SLOPPY][i]

    return policy


def test_with_the_reference_the_judgings_are_trained_on_their_agreement():
    policy = ScriptedModel(_judging(["[1, 0, 0]", "[0.5, 0.5, 0.5]", "they are all fine"]))
    exps = run(
        MathTrainableRULERWorkflow,
        policy,
        run_id_base=2,
        repeat_times=3,
        workflow_args={"ground_truth_probability": 1.0},
    )
    answers_, judgings = exps[:3], exps[3:]
    assert len(judgings) == 3
    # the policy judged its own group repeat_times times
    assert (
        policy.calls[1][0] == ruler_messages("3+4", [RIGHT, WRONG, SLOPPY]) and policy.calls[1][1]["n"] == 3
    )
    # answers: the gold reward (math_reward), in the task's own group
    assert [e.reward for e in answers_] == pytest.approx([1.1, 0.1, -0.1])
    assert all(e.eid.task == 0 for e in answers_)
    assert all(e.metrics["judge_success"] == pytest.approx(2 / 3) for e in answers_)
    # judgings: 1 - mean |score - (gold + 0.1) / 1.2|, targets [1, 1/6, 0]; unreadable: 0
    targets = [1.0, 0.2 / 1.2, 0.0]
    expected = [
        1 - (0 + abs(0 - targets[1]) + 0) / 3,
        1 - (0.5 + abs(0.5 - targets[1]) + 0.5) / 3,
        0.0,
    ]
    assert [e.reward for e in judgings] == pytest.approx(expected)
    assert [e.metrics["reward_for_judge"] for e in judgings] == pytest.approx(expected)
    assert [e.metrics["judge_success"] for e in judgings] == [1.0, 1.0, 0.0]
    assert judgings[2].metrics["judge_malformed"] == 1.0 and judgings[2].info["judge_failure"].startswith(
        "malformed"
    )
    assert all(e.eid.task == JUDGE_GROUP and e.info["ruler"] == "judge" for e in judgings)
    assert [e.eid.run for e in judgings] == [2, 3, 4]
    assert all("accuracy" not in e.metrics for e in judgings)  # eval accuracy reads answers only


def test_without_the_reference_one_judging_rewards_the_answers():
    policy = ScriptedModel(_judging(["[0.8, 0.1, 0.6]"]))
    exps = run(
        MathTrainableRULERWorkflow, policy, repeat_times=3, workflow_args={"ground_truth_probability": 0.0}
    )
    assert len(exps) == 3 and policy.calls[1][1]["n"] == 1
    assert [e.reward for e in exps] == [0.8, 0.1, 0.6]
    assert [e.metrics["gold_reward"] for e in exps] == pytest.approx([1.1, 0.1, -0.1])


def test_without_the_reference_an_unreadable_judging_is_the_counted_fallback():
    before = FALLBACKS.total("math_trainable_ruler_workflow")
    exps = run(
        MathTrainableRULERWorkflow,
        ScriptedModel(_judging(["[0.8, 0.1]"])),
        repeat_times=3,
        workflow_args={"ground_truth_probability": 0.0, "fallback_reward": -1.0},
    )
    assert [e.reward for e in exps] == [-1.0] * 3
    assert all(
        e.info["judge_failure"] == "malformed: a list of 2 scores, 3 expected: '[0.8, 0.1]'" for e in exps
    )
    assert all(e.metrics["judge_malformed"] == 1.0 for e in exps)
    assert FALLBACKS.total("math_trainable_ruler_workflow") == before + 1


def test_eval_tasks_never_train_the_judge():
    policy = ScriptedModel(_judging(["[1, 0, 0]"] * 3))
    exps = run(
        MathTrainableRULERWorkflow,
        policy,
        repeat_times=3,
        is_eval=True,
        workflow_args={"ground_truth_probability": 1.0},
    )
    assert len(exps) == 3 and policy.calls[1][1]["n"] == 1 and [e.reward for e in exps] == [1.0, 0.0, 0.0]


def test_which_tasks_use_the_reference_is_drawn_from_the_task_at_the_configured_rate():
    def draws(version):
        out = []
        for index in range(2000):
            task = make_task(MathTrainableRULERWorkflow)
            task.index = index
            workflow = task.to_workflow(ScriptedModel(answers(RIGHT), model_version=version))
            out.append(workflow.uses_ground_truth())
        return out

    first = draws(0)
    assert first == draws(0)  # the same tasks on the same weights: the same draws
    assert first != draws(1)
    assert 0.17 < sum(first) / len(first) < 0.23  # Trinity-RFT's 0.2
    with pytest.raises(ValueError, match=r"ground_truth_probability must be in \[0, 1\], got 2.0"):
        make_task(MathTrainableRULERWorkflow, workflow_args={"ground_truth_probability": 2}).to_workflow(
            ScriptedModel(answers(RIGHT))
        )


# -- rubric_judge_workflow ---------------------------------------------------------------------

RUBRIC = [
    {"description": "Names non-contrast CT.", "title": "Modality", "weight": 5},
    {"description": "Mentions ultrasound in pregnancy.", "title": "Pregnancy", "weight": 2},
]
ROW = {
    "question": "Best imaging for a ureteric stone?",
    "reference_answer": "Non-contrast CT.",
    "rubric": RUBRIC,
}


def _rater(messages, i):
    response = messages[1]["content"].split("<response>\n", 1)[1].split("\n</response>", 1)[0]
    return {
        "CT scan.": '```json\n{"rating": 9}\n```',
        "X-ray.": 'Weak answer.\n```json\n{"rating": 2}\n```',
    }.get(response, "Sorry, I won't rate this.")


def test_rubric_rewards_are_the_ratings_over_ten():
    policy = ScriptedModel(answers("CT scan.", "X-ray.", "Ask a doctor."))
    judge = ScriptedModel(_rater)
    exps = run(RubricJudgeWorkflow, policy, judge, run_id_base=1, repeat_times=3, row=ROW)
    assert [e.reward for e in exps] == pytest.approx([0.9, 0.2, 0.0])
    assert [e.eid.run for e in exps] == [1, 2, 3]
    assert [e.metrics["judge_success"] for e in exps] == [1.0, 1.0, 0.0]
    assert exps[2].metrics["judge_refused"] == 1.0 and exps[2].info["judge_failure"].startswith("refused")
    # one judging per answer, greedy, with the rubrics in the prompt
    assert len(judge.calls) == 3 and all(args == {"temperature": 0.0, "n": 1} for _, args in judge.calls)
    prompt = judge.calls[0][0][1]["content"]
    assert "Rubric 1 (weight: 5): Names non-contrast CT.\nRubric 2 (weight: 2): Mentions ultrasound" in prompt
    assert "<prompt>\nBest imaging for a ureteric stone?\n</prompt>" in prompt
    assert policy.calls[0][0][0]["role"] == "system" and "thinking" in policy.calls[0][0][0]["content"]


def test_rubric_text_reads_json_text_and_plain_items():
    assert rubric_text(json.dumps(RUBRIC)) == rubric_text(RUBRIC)
    assert rubric_text(["Be brief."]) == "Rubric 1: Be brief."
    assert rubric_text([]) is None and rubric_text(None) is None


def test_a_task_without_rubric_is_warned_once(caplog):
    policy, judge = ScriptedModel(answers("CT scan.")), ScriptedModel(_rater)
    with caplog.at_level(logging.WARNING, logger="trinity_math.rubric"):
        task = make_task(RubricJudgeWorkflow, row={"question": "q"})
        workflow = task.to_workflow(policy, [judge])
        workflow.reset(make_task(RubricJudgeWorkflow, row={"question": "q2"}))
        exps = workflow.run()
    assert caplog.text.count("has no rubric") == 1
    assert "No rubrics are given." in judge.calls[0][0][1]["content"] and exps[0].reward == pytest.approx(0.9)


@pytest.fixture
def judge_api(monkeypatch):
    """An OpenAI-compatible judge at $JUDGE_URL that rates 'CT scan.' 8 and the rest 3."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"auth": self.headers.get("Authorization"), **body})
            rating = 8 if "<response>\nCT scan.\n</response>" in body["messages"][1]["content"] else 3
            content = f'```json\n{{"rating": {rating}}}\n```'
            data = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUDGE_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    yield seen
    server.shutdown()
    server.server_close()


def test_rubric_judge_openai_workflow_asks_the_endpoint(judge_api):
    args = {
        "judge_model_name": "gpt-judge",
        "judge_api_base_url_env": "JUDGE_URL",
        "judge_api_key_env": "JUDGE_KEY",
    }
    exps = run(
        RubricJudgeOpenAIWorkflow,
        ScriptedModel(answers("CT scan.", "X-ray.")),
        row=ROW,
        workflow_args=args,
    )
    assert [e.reward for e in exps] == pytest.approx([0.8, 0.3])
    assert {s["model"] for s in judge_api} == {"gpt-judge"} and {s["auth"] for s in judge_api} == {
        "Bearer sk-judge"
    }
    assert all(s["temperature"] == 0.0 for s in judge_api)


def test_rubric_judge_openai_workflow_settings_errors(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    policy = ScriptedModel(answers("x"))
    with pytest.raises(ValueError, match=r"set workflow_args\.judge_model_name"):
        make_task(RubricJudgeOpenAIWorkflow, row=ROW).to_workflow(policy)
    with pytest.raises(ValueError, match=r"read from \$OPENAI_BASE_URL, which is not set"):
        make_task(RubricJudgeOpenAIWorkflow, row=ROW, workflow_args={"judge_model_name": "m"}).to_workflow(
            policy
        )
    with pytest.raises(ValueError, match=r"rubric_judge_workflow needs a judge model"):
        make_task(RubricJudgeWorkflow, row=ROW).to_workflow(policy)
