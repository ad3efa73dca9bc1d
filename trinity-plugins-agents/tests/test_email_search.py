"""email_search_workflow over the synthetic mailbox: the generator (seeded, grounded questions,
Trinity-RFT's schema and rows), the search / read tools over SQLite FTS5, Trinity-RFT's rubric,
the judge through an auxiliary model's OpenAI API and its counted fallback, oracle and random
agents played by a scripted model behind the core's OpenAI server, and Trinity-RFT's
email_search.yaml (stored unchanged in upstream_configs/) reading the generated rows."""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from pathlib import Path

import pytest

from trinity.config import FormatConfig, load_config
from trinity.plugins import get_component
from trinity.workflow import Task
from trinity_agents import email_search as es
from trinity_agents.agents import (
    email_search_oracle,
    email_search_random,
    text_judge,
    tool_call,
    tool_results,
)
from trinity_agents.email_inbox import generate_corpus, write_email_search
from trinity_agents.email_search import (
    EmailDatabase,
    EmailDatabaseError,
    EmailSearchReward,
    EmailSearchWorkflow,
    EmailTools,
    Rubric,
    answers_match,
    read_verdict,
)
from trinity_agents.scripted import scripted_openai_model

UPSTREAM = Path(__file__).parent / "upstream_configs"
ROW_KEYS = {"id", "question", "answer", "message_ids", "how_realistic", "inbox_address", "query_date"}


@pytest.fixture(scope="module")
def mailbox(tmp_path_factory):
    """A generated mailbox: (directory, database path, train rows, test rows)."""
    out = tmp_path_factory.mktemp("mail")
    db, _ = write_email_search(out, train=24, test=8, seed=3)
    rows = {
        s: [json.loads(x) for x in (out / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "test")
    }
    return out, db, rows["train"], rows["test"]


@pytest.fixture
def agentscope():
    from trinity_agents.agentscope_react import agentscope_install_hint

    return pytest.importorskip(
        "agentscope", reason="email_search_workflow needs the extra: " + agentscope_install_hint()
    )


@pytest.fixture
def serve():
    models = []

    def make(policy):
        model = scripted_openai_model(policy)
        models.append(model)
        return model

    yield make
    for model in models:
        model.close()


def email_task(row, db, reward_fn_args=None, **workflow_args):
    return Task(
        workflow=EmailSearchWorkflow,
        raw_task=dict(row),
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        workflow_args={"max_turns": 10, "db_path": str(db), **workflow_args},
        reward_fn_args=dict(reward_fn_args or {}),
    )


def tokens(text):
    """The words FTS5's default tokenizer indexes (letters and digits, lower case)."""
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def all_emails(db):
    with sqlite3.connect(db) as conn:
        emails = conn.execute(
            "select id, message_id, subject, from_address, date, body from emails"
        ).fetchall()
        recipients = conn.execute(
            "select email_id, recipient_address, recipient_type from recipients"
        ).fetchall()
    return emails, recipients


# -- the generator ---------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_files_and_another_seed_other_ones(tmp_path, mailbox):
    out, db, _, _ = mailbox
    write_email_search(tmp_path / "again", train=24, test=8, seed=3)
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()
    assert all_emails(tmp_path / "again" / "emails.db") == all_emails(db)
    write_email_search(tmp_path / "other", train=24, test=8, seed=4)
    assert (tmp_path / "other" / "train.jsonl").read_text() != (out / "train.jsonl").read_text()


def test_rows_are_in_trinity_rfts_format_and_every_question_is_grounded(mailbox):
    _, db, train, test = mailbox
    rows = train + test
    assert len(train) == 24 and len(test) == 8
    assert {r["id"] for r in train}.isdisjoint({r["id"] for r in test})
    assert len({r["question"] for r in rows}) == len(rows)
    database = EmailDatabase(db)
    for row in rows:
        assert set(row) == ROW_KEYS and 0.6 <= row["how_realistic"] <= 1.0
        [source] = row["message_ids"]
        email = database.read(source)
        # the source states the answer, is in the question's inbox and dated before the query
        assert row["answer"] in email["body"]
        participants = {email["from_address"], *email["to_addresses"], *email["cc_addresses"]}
        assert row["inbox_address"] in participants
        assert email["date"][:10] < row["query_date"]
        assert database.read(source, inbox=row["inbox_address"], before=row["query_date"]) == email


def test_a_corpus_is_threads_among_people_and_more_mail_around_them():
    corpus = generate_corpus(40, seed=0)
    subjects = [e.subject for e in corpus.emails]
    replies = [s for s in subjects if s.startswith("RE: ")]
    assert len(replies) >= 40  # every fact is a reply to a request, some acknowledged
    assert len(corpus.emails) >= 40 * 2 + 40 * 3  # and three unrelated emails per fact
    senders = {e.from_address for e in corpus.emails}
    assert len(senders) > 15 and any(not s.endswith("@northwind-energy.com") for s in senders)
    assert len({r["inbox_address"] for r in corpus.questions}) == 6
    assert len({e.message_id for e in corpus.emails}) == len(corpus.emails)
    assert all(e.to and e.date[:4] in ("2001", "2002") for e in corpus.emails)


def test_the_database_has_trinity_rfts_schema_and_full_text_index(mailbox):
    _, db, _, _ = mailbox
    with sqlite3.connect(db) as conn:
        columns = {
            t: [r[1] for r in conn.execute(f"pragma table_info({t})")] for t in ("emails", "recipients")
        }
        assert columns == {
            "emails": ["id", "message_id", "subject", "from_address", "date", "body", "file_name"],
            "recipients": ["email_id", "recipient_address", "recipient_type"],
        }
        (count,) = conn.execute("select count(*) from emails_fts where emails_fts match 'agreed'").fetchone()
        (direct,) = conn.execute("select count(*) from emails where body like '%agreed%'").fetchone()
        assert count == direct > 0


def test_tasks_cli_writes_the_mailbox(tmp_path, capsys):
    from trinity_agents.tasks import main

    main(["email_search", str(tmp_path / "out"), "--train", "3", "--test", "2", "--seed", "1"])
    assert len((tmp_path / "out" / "train.jsonl").read_text().splitlines()) == 3
    assert f"DEFAULT_EMAIL_DB_PATH={(tmp_path / 'out' / 'emails.db').resolve()}" in capsys.readouterr().out


# -- the tools -------------------------------------------------------------------------------


def test_search_filters_by_inbox_keywords_sender_and_dates(mailbox):
    _, db, train, _ = mailbox
    database = EmailDatabase(db)
    emails, recipients = all_emails(db)
    row = train[0]
    source = database.read(row["message_ids"][0])
    word = source["subject"].split()[1]
    inbox = row["inbox_address"]
    hits = database.search(inbox, [word])
    ids = [h["message_id"] for h in hits]
    assert source["message_id"] in ids and len(ids) <= 10
    # exactly the inbox's emails holding the word (subject or body), newest first
    in_inbox = {i for i, _, _, f, _, _ in emails if f == inbox} | {i for i, a, _ in recipients if a == inbox}
    expected = sorted(
        (e for e in emails if e[0] in in_inbox and word.lower() in tokens(e[2] + " " + e[5])),
        key=lambda e: e[4],
        reverse=True,
    )
    assert ids == [e[1] for e in expected][:10]
    assert all("<b>" in h["snippet"] for h in hits)
    dates = [database.read(i)["date"] for i in ids]
    assert dates == sorted(dates, reverse=True)
    # every keyword must appear
    assert database.search(inbox, [word, "zzzunlikely"]) == []
    # sender and date range
    assert all(
        database.read(h["message_id"])["from_address"] == source["from_address"]
        for h in database.search(inbox, [word], from_address=source["from_address"])
    )
    day = source["date"][:10]
    assert source["message_id"] not in [
        h["message_id"] for h in database.search(inbox, [word], sent_before=day)
    ]
    assert source["message_id"] in [h["message_id"] for h in database.search(inbox, [word], sent_after=day)]
    # another inbox does not see it unless it took part
    outsider = next(a for a in {e[3] for e in emails} if a not in {source["from_address"], *source["to_addresses"], *source["cc_addresses"]})  # fmt: skip
    assert source["message_id"] not in [h["message_id"] for h in database.search(outsider, [word])]


def test_keywords_are_text_never_fts_syntax_and_arguments_are_checked(mailbox):
    _, db, train, _ = mailbox
    database = EmailDatabase(db)
    inbox = train[0]["inbox_address"]
    for odd in ['a"b', "OR", "NEAR(x y)", "*", "budget:"]:
        database.search(inbox, [odd])  # no sqlite3.OperationalError
    with pytest.raises(ValueError, match="keyword"):
        database.search(inbox, [" "])
    with pytest.raises(ValueError, match="max_results"):
        database.search(inbox, ["budget"], max_results=11)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        database.search(inbox, ["budget"], sent_after="May 3")


def test_the_agents_tools_stay_in_its_inbox_and_before_today(mailbox):
    _, db, train, _ = mailbox
    row = train[0]
    database = EmailDatabase(db)
    source = database.read(row["message_ids"][0])
    words = source["subject"].split()[1:3]
    # "today" is the day before the source email: it is not there yet, whatever date is asked
    yesterday = (es.dt.date.fromisoformat(source["date"][:10]) - es.dt.timedelta(days=1)).isoformat()
    tools = EmailTools(database, row["inbox_address"], yesterday, char_limit=10_000)
    out = tools.search_emails(keywords=words, inbox_address=row["inbox_address"], query_date="2002-12-31")
    assert source["message_id"] not in out
    assert "not found" in tools.read_email(message_id=source["message_id"])
    tools = EmailTools(database, row["inbox_address"], row["query_date"], char_limit=10_000)
    assert source["message_id"] in tools.search_emails(keywords=" ".join(words))  # text: split in words
    assert json.loads(tools.read_email(message_id=source["message_id"]))["body"] == source["body"]
    assert tools.found_ids and tools.read_ids == [source["message_id"]]
    assert tools.search_emails(keywords=words, inbox_address="someone@else.com").startswith(
        "Error: you can search only"
    )
    assert tools.search_emails(keywords=[]).startswith("Error: give at least one keyword")
    assert tools.read_email(message_id="<nope>").startswith("Error: email")
    assert tools.search_emails(keywords=words, colour="red").startswith("Error: unknown argument")
    assert tools.errors == 4 and tools.calls == {"search_emails": 4, "read_email": 2}
    small = EmailTools(database, row["inbox_address"], row["query_date"], char_limit=50)
    text = small.read_email(message_id=source["message_id"])
    assert text.endswith("[cut at 50 characters]") and len(text) < 90


def test_a_missing_database_is_one_line_naming_the_fix(tmp_path, monkeypatch, mailbox):
    with pytest.raises(EmailDatabaseError) as info:
        EmailDatabase(tmp_path / "none.db")
    assert "\n" not in str(info.value) and "python -m trinity_agents.tasks email_search" in str(info.value)
    bad = tmp_path / "bad.db"
    sqlite3.connect(bad).execute("create table t (x)").connection.commit()
    with pytest.raises(EmailDatabaseError, match="not an email database"):
        EmailDatabase(bad)
    monkeypatch.delenv(es.DB_PATH_ENV, raising=False)
    _, db, train, _ = mailbox
    workflow = EmailSearchWorkflow(task=email_task(train[0], db, db_path=None), model=None)
    with pytest.raises(EmailDatabaseError, match="DEFAULT_EMAIL_DB_PATH"):
        workflow.database()
    monkeypatch.setenv(es.DB_PATH_ENV, str(db))
    assert (
        EmailSearchWorkflow(task=email_task(train[0], db, db_path=None), model=None).database().path
        == db.resolve()
    )


def test_a_mailbox_written_anew_at_the_same_path_is_read_anew(tmp_path):
    from trinity_agents.email_search import open_database

    db, _ = write_email_search(tmp_path, train=2, test=0, seed=0)
    first = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert open_database(db).read(first["message_ids"][0]) is not None
    write_email_search(tmp_path, train=2, test=0, seed=1)
    assert open_database(db).read(first["message_ids"][0]) is None


# -- the reward ------------------------------------------------------------------------------


def test_rubric_follows_trinity_rfts_reward():
    reward = EmailSearchReward()
    found = dict(ever_found_right_email=True, ever_read_right_email=True, sources_correct=True)
    right = Rubric(answer="$5", sources=["<a>"], answer_correct=True, num_turns=3, **found)
    parts = reward(right, max_turns=10)
    assert parts["accuracy"] == 1.0
    assert parts["format"] == pytest.approx(1 + 0.3 + 0.1 / 1 + 0.1 * (1 - 3 / 10))
    two_sources = Rubric(answer="$5", sources=["<a>", "<b>"], answer_correct=True, num_turns=10, **found)
    assert reward(two_sources, 10)["format"] == pytest.approx(1 + 0.3 + 0.1 / 2)
    wrong = Rubric(answer="$6", sources=["<a>"], ever_found_right_email=True, num_turns=3)
    assert reward(wrong, 10) == {"accuracy": -1.0, "format": pytest.approx(0.1)}
    dont_know = Rubric(
        answer="I don't know.", sources=[], ever_found_right_email=True, ever_read_right_email=True
    )
    assert dont_know.returned_i_dont_know and not dont_know.attempted_answer
    assert reward(dont_know, 10) == {"accuracy": 0.0, "format": pytest.approx(0.2)}
    assert reward(Rubric(answer=None), 10) == {"accuracy": 0.0, "format": -1.0}
    # without the judge: the accuracy alone
    assert EmailSearchReward(llm_as_a_judge=False)(right, 10) == {"accuracy": 1.0, "format": 0.0}
    with pytest.raises(ValueError, match="llm_as_a_judge"):
        EmailSearchReward(llm_as_a_judge="maybe")


def test_text_comparison_and_judge_verdicts():
    assert answers_match("The approved budget is $2,150,000.", "$2,150,000")
    assert answers_match("ecs 4102", "ECS 4102")
    assert not answers_match("ECS 41020", "ECS 4102")  # not inside a longer word
    assert not answers_match("2001", "May 27, 2001")  # a fragment of the reference is not enough
    assert not answers_match("", "x") and not answers_match("x", "")
    assert read_verdict("True") is True and read_verdict("**false**, the date differs") is False
    assert read_verdict("It is untrue") is None and read_verdict("") is None


# -- the workflow, played ---------------------------------------------------------------------


def run_episode(row, db, policy, serve, judge_policy=text_judge, **kwargs):
    model = serve(policy)
    judges = [serve(judge_policy)] if judge_policy else []
    workflow = EmailSearchWorkflow(task=email_task(row, db, **kwargs), model=model, auxiliary_models=judges)
    return model, judges, workflow.run()


def test_oracle_searches_reads_and_answers_for_the_top_reward(agentscope, serve, mailbox):
    _, db, _, test = mailbox
    row = test[0]
    model, [judge], exps = run_episode(row, db, email_search_oracle(row, db), serve)
    calls = model.engine.calls
    assert len(exps) == len(calls) == 3  # search, read, answer
    assert [t["function"]["name"] for t in calls[0]["tools"]] == [
        "search_emails",
        "read_email",
        "generate_response",
    ]
    system = calls[0]["messages"][0]["content"]
    assert row["inbox_address"] in system and row["query_date"] in system and "10 turns" in system
    assert calls[0]["messages"][1]["content"] == row["question"]
    assert row["message_ids"][0] in tool_results(calls[1]["messages"])[0]
    assert row["answer"] in tool_results(calls[2]["messages"])[1]  # the email read back
    expected = 1.0 + (1 + 0.3 + 0.1 + 0.1 * (1 - 3 / 10))
    for step, exp in enumerate(exps):
        assert (exp.eid.run, exp.eid.step) == (0, step) and exp.reward == pytest.approx(expected)
        assert bool(exp.action_mask.all()) and exp.tokens[: exp.prompt_length].numel() > 0
    last = exps[-1]
    assert last.info["answer"] == row["answer"] and last.info["sources"] == row["message_ids"]
    assert (
        last.info["sources_correct"]
        and last.info["ever_read_right_email"]
        and last.info["ever_found_right_email"]
    )
    assert last.metrics["judge_success"] == 1.0 and last.metrics["judge_fallback"] == 0.0
    assert last.metrics["accuracy"] == 1.0 and last.metrics["actual_turns"] == 3.0
    assert last.metrics["search_calls"] == 1.0 and last.metrics["read_calls"] == 1.0
    # the judge got the question, the reference and the agent's answer, and said true
    [judging] = judge.engine.calls
    asked = judging["messages"][-1]["content"]
    assert row["question"] in asked and f"Reference answer: {row['answer']}" in asked
    assert last.info["judge_reply"] == "true"


def test_oracle_and_random_policies_score_as_expected(agentscope, serve, mailbox):
    _, db, _, test = mailbox
    agent, judge = serve(None), serve(text_judge)  # one server each, the agent's policy swapped
    rewards: dict[str, list[float]] = {"oracle": [], "random": []}
    for i, row in enumerate(test):
        for name, policy in (("oracle", email_search_oracle(row, db)), ("random", email_search_random(i))):
            agent.engine.policy = policy
            workflow = EmailSearchWorkflow(task=email_task(row, db), model=agent, auxiliary_models=[judge])
            rewards[name].append(workflow.run()[-1].reward)
    assert rewards["oracle"] == [pytest.approx(2.47)] * len(test)
    # random answers are judged wrong (-1 plus partial credit) or "I don't know" (0 plus some)
    assert all(-1.0 <= r <= 0.3 for r in rewards["random"]) and statistics.fmean(rewards["random"]) < 0


def test_judge_failures_fall_back_to_the_text_comparison_counted(agentscope, serve, mailbox, caplog):
    _, db, _, test = mailbox
    row = test[1]
    before = dict(es.JUDGE_FALLBACKS)
    # no auxiliary model
    _, _, exps = run_episode(row, db, email_search_oracle(row, db), serve, judge_policy=None)
    last = exps[-1]
    assert last.info["judge_failure"] == "no_judge" and last.metrics["judge_fallback"] == 1.0
    assert last.metrics["accuracy"] == 1.0  # the text comparison accepts the oracle's answer
    # a judge that answers neither true nor false
    _, _, exps = run_episode(row, db, email_search_oracle(row, db), serve, judge_policy=lambda m: "Hmm.")
    assert exps[-1].info["judge_failure"] == "malformed" and exps[-1].info["judge_reply"] == "Hmm."
    assert es.JUDGE_FALLBACKS["no_judge"] == before.get("no_judge", 0) + 1
    assert es.JUDGE_FALLBACKS["malformed"] == before.get("malformed", 0) + 1
    assert "judging failed" in caplog.text
    # a judge that rejects decides, even against the text comparison
    _, _, exps = run_episode(row, db, email_search_oracle(row, db), serve, judge_policy=lambda m: "false")
    assert exps[-1].reward == pytest.approx(-1.0 + 0.3) and exps[-1].metrics["judge_success"] == 1.0


def test_i_dont_know_no_answer_and_judge_free_reward(agentscope, serve, mailbox):
    _, db, _, test = mailbox
    row = test[2]
    judge_calls = []

    def judge(messages):
        judge_calls.append(messages)
        return "true"

    def give_up(messages):
        return tool_call("generate_response", answer="I don't know", sources=[])

    _, _, exps = run_episode(row, db, give_up, serve, judge_policy=judge)
    assert exps[-1].reward == 0.0 and not judge_calls  # no judging of "I don't know"

    def aimless(messages):
        return "Let me think."

    _, _, exps = run_episode(row, db, aimless, serve, max_turns=2)
    assert len(exps) == 3 and exps[-1].reward == -1.0 and exps[-1].info["answer"] is None

    _, _, exps = run_episode(
        row,
        db,
        email_search_oracle(row, db),
        serve,
        judge_policy=judge,
        reward_fn_args={"llm_as_a_judge": False},
    )
    assert exps[-1].reward == 1.0 and not judge_calls


def test_workflow_checks_its_arguments_and_rows(mailbox):
    _, db, train, _ = mailbox
    row = train[0]
    with pytest.raises(ValueError, match="max_turns"):
        EmailSearchWorkflow(task=email_task(row, db, max_turns=0), model=None)
    with pytest.raises(TypeError, match="judge"):
        EmailSearchWorkflow(task=email_task(row, db, reward_fn_args={"judge": 1}), model=None)
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    assert EmailSearchWorkflow.row_problem(row, fmt) is None
    assert "message_ids" in EmailSearchWorkflow.row_problem({**row, "message_ids": "x"}, fmt)
    assert "YYYY-MM-DD" in EmailSearchWorkflow.row_problem({**row, "query_date": "soon"}, fmt)
    assert "'answer'" in EmailSearchWorkflow.row_problem({**row, "answer": None}, fmt)


# -- Trinity-RFT's config ---------------------------------------------------------------------


@pytest.fixture
def email_env(monkeypatch, tmp_path, mailbox):
    out, db, _, _ = mailbox
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(out))
    monkeypatch.setenv(es.DB_PATH_ENV, str(db))
    return out


def test_upstream_config_loads_unchanged_and_reads_the_generated_rows(email_env, mailbox):
    from trinity.buffer.taskset import TasksetReader

    _, db, train, test = mailbox
    config = load_config(UPSTREAM / "email_search.yaml")
    inputs = config.buffer.explorer_input
    assert get_component("workflow", "email_search_workflow") is EmailSearchWorkflow
    assert config.algorithm.algorithm_type == "multi_step_grpo"
    rollout = config.explorer.rollout_model
    assert rollout.enable_openai_api and rollout.enable_history and rollout.tool_call_parser == "hermes"
    assert config.explorer.auxiliary_models[0].model_path == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    readers = [TasksetReader(t, config.buffer) for t in (inputs.tasksets[0], inputs.eval_tasksets[0])]
    assert [len(r) for r in readers] == [len(train), len(test)] and not any(r.skipped for r in readers)
    for reader in readers:
        task = reader.read_batch(1)[0]
        assert task.workflow is EmailSearchWorkflow and task.reward_fn_args == {"llm_as_a_judge": True}
        workflow = EmailSearchWorkflow(task=task, model=None)
        assert workflow.max_turns == 10 and workflow.database().path == db.resolve()
        assert workflow.reward_fn.llm_as_a_judge is True


def test_config_keys_the_workflow_does_not_read_fail_at_load(email_env, tmp_path):
    import yaml

    config = yaml.safe_load((UPSTREAM / "email_search.yaml").read_text())
    config["buffer"]["explorer_input"]["taskset"]["reward_fn_args"]["judge_model"] = "x"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(Exception, match="judge_model"):
        load_config(tmp_path / "bad.yaml")
    config["buffer"]["explorer_input"]["taskset"]["reward_fn_args"].pop("judge_model")
    config["buffer"]["explorer_input"]["taskset"]["workflow_args"]["max_steps"] = 3
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(Exception, match="max_steps"):
        load_config(tmp_path / "bad.yaml")
