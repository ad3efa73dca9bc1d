"""End to end: ``email_search_workflow`` (trinity-plugins-agents) trains one ``multi_step_grpo``
step in a `trinity run` job on CPU, with the tiny model, over a generated mailbox
(``python -m trinity_agents.tasks email_search``).

The untrained model never calls a tool or ``generate_response``: each episode is the agent's
``max_turns`` model calls plus AgentScope's closing call, recorded through the core's OpenAI
server, with no final answer (reward -1 on every step, Trinity-RFT's rubric). Playing agents
that search, read and answer are covered by trinity-plugins-agents/tests/test_email_search.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH, REPEAT, TURNS = 2, 2, 1


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model, trinity_run) -> Path:
    pytest.importorskip("agentscope", reason="email_search_workflow needs the agentscope extra")
    from trinity.testing.jobs import tiny_job, write_job
    from trinity_agents.tasks import main as make_tasks

    root = tmp_path_factory.mktemp("email_search")
    make_tasks(["email_search", str(root / "mail"), "--train", "4", "--test", "1", "--seed", "0"])
    config = tiny_job(
        root,
        name="email",
        algorithm={"algorithm_type": "multi_step_grpo", "repeat_times": REPEAT},
        # The system prompt and the three tools' schemas: ~2,300 characters (tokens, here).
        model={"model_path": str(tiny_model()), "max_prompt_tokens": 4000, "max_model_len": 4096},
        buffer={
            "total_steps": 1,
            "batch_size": BATCH,
            "train_batch_size": 64,
            "explorer_input": {
                "taskset": {
                    "path": str(root / "mail"),
                    "format": {"prompt_key": "question", "response_key": "answer", "system_prompt": None},
                    "workflow_args": {"max_turns": TURNS, "db_path": str(root / "mail" / "emails.db")},
                    "reward_fn_args": {"llm_as_a_judge": True},
                },
                "default_workflow_type": "email_search_workflow",
                "default_reward_fn_type": None,
            },
        },
        explorer={
            "rollout_model": {
                "enable_openai_api": True,
                "enable_history": True,
                "tool_call_parser": "hermes",
                "enable_auto_tool_choice": True,
            }
        },
    )
    trinity_run(write_job(root / "job.yaml", config))
    return root


def test_agent_calls_reach_the_buffer_step_wise_and_are_trained(job):
    from trinity.experience import Experience

    with sqlite3.connect(job / "buffer.db") as db:
        rows = db.execute("select e.consumed, b.blob from exp e join exp_blobs b on b.id = e.id").fetchall()
    exps = [Experience.deserialize(blob) for _, blob in rows]
    # per episode: TURNS calls of the agent and AgentScope's closing one
    assert len(exps) == BATCH * REPEAT * (TURNS + 1) and all(consumed for consumed, _ in rows)
    episodes: dict[tuple, list] = {}
    for exp in exps:
        episodes.setdefault((exp.eid.batch, exp.eid.task, exp.eid.run), []).append(exp)
    assert len(episodes) == BATCH * REPEAT
    for steps in episodes.values():
        steps.sort(key=lambda e: e.eid.step)
        assert [e.eid.step for e in steps] == list(range(TURNS + 1))
        assert {e.reward for e in steps} == {-1.0}  # no final answer
        last = steps[-1]
        assert last.info["answer"] is None and last.info["actual_turns"] == TURNS + 1
        # the agent's system prompt: the task's inbox (the tiny model's template shows no tools)
        assert "You are an email search agent" in steps[0].prompt_text
        assert "@northwind-energy.com" in steps[0].prompt_text
        assert all(bool(e.action_mask.all()) for e in steps)


def test_the_steps_metrics_are_logged(job):
    from trinity.monitor.tensorboard import read_scalars

    monitor = job / "ckpt" / "e2e" / "email" / "monitor" / "tensorboard"
    explorer = read_scalars(monitor / "explorer")
    assert [v for _, v in explorer["rollout/format"]] == [-1.0]
    assert [v for _, v in explorer["rollout/actual_turns"]] == [TURNS + 1]
    trainer = read_scalars(monitor / "trainer")
    # one training step on every recorded call of the four episodes
    assert [v for _, v in trainer["advantage/experience_count"]] == [BATCH * REPEAT * (TURNS + 1)]
    assert [v for _, v in trainer["advantage/episode_count"]] == [BATCH * REPEAT]
