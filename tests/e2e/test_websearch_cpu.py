"""End to end: ``agentscope_v1_react_search_workflow`` (trinity-plugins-agents) trains one
``multi_step_grpo`` step in a `trinity run` job on CPU, with the tiny model, over the generated
websites (``python -m trinity_agents.web_corpus``), ``search_client_type: tavily``.

The untrained model never calls a tool or ``generate_response``: each episode is the agent's
``max_turns`` model call plus AgentScope's closing one, recorded through the core's OpenAI
server; its final text is no answer (reward 0). Without an auxiliary model the answer is compared
as text, which the job's log says, as it says once that Tavily is served locally. Agents that
search, read and answer are covered by trinity-plugins-agents/tests/test_websearch.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH, REPEAT, TURNS = 2, 2, 1


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model, trinity_run) -> Path:
    for module in ("agentscope", "bm25s"):
        pytest.importorskip(module, reason="agentscope_v1_react_search_workflow needs the agentscope extra")
    from trinity.testing.jobs import tiny_job, write_job
    from trinity_agents.web_corpus import main as make_tasks

    root = tmp_path_factory.mktemp("websearch")
    make_tasks([str(root / "web"), "--train", "4", "--test", "1", "--seed", "0"])
    config = tiny_job(
        root,
        name="web",
        algorithm={"algorithm_type": "multi_step_grpo", "repeat_times": REPEAT},
        # The system prompt and the three tools' schemas: ~1,500 characters (tokens, here).
        model={"model_path": str(tiny_model()), "max_prompt_tokens": 4000, "max_model_len": 4096},
        buffer={
            "total_steps": 1,
            "batch_size": BATCH,
            "train_batch_size": 64,
            "explorer_input": {
                "taskset": {
                    "path": str(root / "web"),
                    "format": {"prompt_key": "problem", "response_key": "answer", "system_prompt": None},
                    "workflow_args": {"max_turns": TURNS, "search_client_type": "tavily"},
                },
                "default_workflow_type": "agentscope_v1_react_search_workflow",
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


def test_agent_calls_are_trained_step_wise_and_the_local_search_is_logged_once(job):
    from trinity.experience import Experience

    with sqlite3.connect(job / "buffer.db") as db:
        rows = db.execute("select e.consumed, b.blob from exp e join exp_blobs b on b.id = e.id").fetchall()
    exps = [Experience.deserialize(blob) for _, blob in rows]
    assert len(exps) == BATCH * REPEAT * (TURNS + 1) and all(consumed for consumed, _ in rows)
    episodes: dict[tuple, list] = {}
    for exp in exps:
        episodes.setdefault((exp.eid.batch, exp.eid.task, exp.eid.run), []).append(exp)
    assert len(episodes) == BATCH * REPEAT
    for steps in episodes.values():
        steps.sort(key=lambda e: e.eid.step)
        assert [e.eid.step for e in steps] == list(range(TURNS + 1))
        assert {e.reward for e in steps} == {0.0}
        last = steps[-1]
        assert last.info["search_client_type"] == "tavily" and last.info["judge_fallback"] is True
        assert "Web Information Seeking Master" in steps[0].prompt_text
    log = (job / "ckpt" / "e2e" / "web" / "log" / "explorer.log").read_text()
    assert log.count("search_client_type 'tavily' is served locally") == 1
    assert "no judging (no explorer.auxiliary_models configured)" in log
