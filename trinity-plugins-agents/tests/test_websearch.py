"""agentscope_v1_react_search_workflow over the local web: the generated websites and questions
(seeded, grounded, one and two hops, Trinity-RFT's WebWalkerQA rows), the BM25 corpus and the
Tavily / SearXNG tools served from it, Trinity-RFT's judge and reward, oracle and random agents
played by a scripted model behind the core's OpenAI server (no Ray), and Trinity-RFT's
agentscopev1_websearch_agent.yaml (stored unchanged in upstream_configs/) reading the rows."""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import pytest

from trinity.config import FormatConfig, load_config
from trinity.plugins import get_component
from trinity.workflow import Task
from trinity_agents import websearch as ws
from trinity_agents.scripted import scripted_openai_model
from trinity_agents.web_corpus import (
    PROBLEM_SUFFIX,
    WebPage,
    default_world,
    generate_world,
    main,
    write_websearch,
)
from trinity_agents.websearch import (
    AgentScopeV1ReactSearchWorkflow,
    SearchTools,
    WebCorpus,
    answer_contains,
    judge_says_yes,
    normalise_url,
    open_corpus,
    websearch_oracle,
    websearch_random,
    websearch_text_judge,
)

UPSTREAM = Path(__file__).parent / "upstream_configs"
DATASET = Path("examples/agentscope_websearch/webwalker_rl_dataset")  # the upstream config's path


def read_rows(out, split):
    return [json.loads(x) for x in (Path(out) / f"{split}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("web")
    write_websearch(out, train=12, test=8, seed=5)
    return out, read_rows(out, "train"), read_rows(out, "test")


def _extra_reason() -> str:
    from trinity_agents.agentscope_react import agentscope_install_hint

    return "agentscope_v1_react_search_workflow needs the extra: " + agentscope_install_hint()


@pytest.fixture
def bm25s():
    return pytest.importorskip("bm25s", reason=_extra_reason())


@pytest.fixture
def agentscope(bm25s):
    return pytest.importorskip("agentscope", reason=_extra_reason())


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


def web_task(row, **workflow_args):
    return Task(
        workflow=AgentScopeV1ReactSearchWorkflow,
        raw_task=dict(row),
        format_args=FormatConfig(prompt_key="problem", response_key="answer"),
        workflow_args={"max_turns": 10, **workflow_args},
    )


def run_episode(row, policy, serve, judge_policy=websearch_text_judge, **workflow_args):
    model = serve(policy)
    judges = [serve(judge_policy)] if judge_policy is not None else []
    workflow = AgentScopeV1ReactSearchWorkflow(
        task=web_task(row, **workflow_args), model=model, auxiliary_models=judges
    )
    return model, judges, workflow.run()


# -- the generated web -----------------------------------------------------------------------


def test_the_same_seed_gives_the_same_files_and_another_seed_other_ones(tmp_path, dataset):
    out, _, _ = dataset
    write_websearch(tmp_path / "again", train=12, test=8, seed=5)
    for name in ("train.jsonl", "test.jsonl", "corpus.jsonl", "dataset_dict.json"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()
    write_websearch(tmp_path / "other", train=12, test=8, seed=6)
    assert (tmp_path / "other" / "train.jsonl").read_text() != (out / "train.jsonl").read_text()
    assert generate_world(companies=3, seed=1) == generate_world(companies=3, seed=1)
    assert generate_world(companies=3, seed=1).pages != generate_world(companies=3, seed=2).pages


def test_rows_are_webwalkerqa_rows_and_every_answer_is_on_the_last_page_of_its_path(dataset):
    out, train, test = dataset
    world = default_world()
    pages = {p.url: p for p in world.pages}
    assert len(train) == 12 and len(test) == 8
    assert {r["problem"] for r in train}.isdisjoint({r["problem"] for r in test})
    info = json.loads((out / "dataset_dict.json").read_text())
    assert {k: v["num_examples"] for k, v in info["splits"].items()} == {"train": 12, "test": 8}
    for row in train + test:
        assert set(row) == {"problem", "answer"}
        question = world.question_for(row["problem"])
        assert question.answer == row["answer"]
        assert row["problem"].endswith(PROBLEM_SUFFIX.format(root=question.root_url))
    hops = {len(q.hops) for q in world.questions}
    assert hops == {1, 2} and len({q.problem for q in world.questions}) == len(world.questions)
    for q in world.questions:
        assert q.answer in pages[q.hops[-1][1]].content
        assert all(url.startswith(q.root_url) for _, url in q.hops)
        if len(q.hops) == 2:  # the first page names what the second hop looks up
            assert q.hops[1][0].split(" headquarters")[0] in pages[q.hops[0][1]].content
    # every page of a site is linked from its home page
    for page in world.pages:
        home = pages["https://" + page.url.split("/")[2]]
        assert page is home or page.url in home.content


def test_cli_writes_the_dataset_and_refuses_more_questions_than_there_are(tmp_path, capsys):
    main([str(tmp_path / "d"), "--train", "3", "--test", "2", "--seed", "1"])
    assert len(read_rows(tmp_path / "d", "train")) == 3 and len(read_rows(tmp_path / "d", "test")) == 2
    assert "corpus.jsonl" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "e"), "--train", str(len(default_world().questions)), "--test", "1"])
    assert "train + test" in capsys.readouterr().err


# -- the corpus and the tools ----------------------------------------------------------------


def test_bm25_search_ranks_the_named_page_first_and_filters_sites(bm25s):
    corpus = WebCorpus(
        [
            WebPage(
                "https://www.alpha.example/a", "Zorbin lamp", "The Zorbin lamp was designed by Ada Quell."
            ),
            WebPage("https://www.alpha.example/b", "Lamps", "Many lamps, among them the Zorbin."),
            WebPage("https://beta.example/c", "Kettle", "A kettle designed by Bo Tarn."),
        ]
    )
    hits = corpus.search("the Zorbin lamp")  # the kettle has no query word: not a hit
    assert [p.url for p, _ in hits] == ["https://www.alpha.example/a", "https://www.alpha.example/b"]
    assert hits[0][1] > hits[1][1] > 0
    assert [p.url for p, _ in corpus.search("designed site:beta.example")] == ["https://beta.example/c"]
    assert [p.url for p, _ in corpus.search("designed", include_domains=["alpha.example"])] == [
        "https://www.alpha.example/a"
    ]
    assert all(
        "alpha" not in p.url for p, _ in corpus.search("designed", exclude_domains=["www.alpha.example"])
    )
    assert corpus.search("xylophone") == [] and corpus.search("the") == []  # no query word, no hits
    assert corpus.read("alpha.example/a/") is corpus.read("http://WWW.alpha.example/a") is corpus.pages[0]
    assert corpus.read("https://www.alpha.example/zzz") is None
    assert normalise_url("https://www.X.example/p/") == "x.example/p"


def test_corpus_from_jsonl_round_trips_and_bad_files_are_one_line(bm25s, tmp_path, dataset):
    out, _, _ = dataset
    corpus = WebCorpus.from_jsonl(out / "corpus.jsonl")
    assert corpus.pages == list(default_world().pages)
    with pytest.raises(FileNotFoundError, match=r"python -m trinity_agents\.web_corpus"):
        WebCorpus.from_jsonl(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"url": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        WebCorpus.from_jsonl(tmp_path / "bad.jsonl")
    assert open_corpus() is open_corpus() and open_corpus(out / "corpus.jsonl") is not open_corpus()


def test_the_two_client_types_serve_upstreams_tools_over_the_corpus(bm25s):
    question = next(q for q in default_world().questions if len(q.hops) == 2)
    (query, url), _ = question.hops
    corpus = open_corpus()
    tavily = SearchTools(corpus, "tavily")
    assert (tavily.search_name, tavily.read_name) == ("tavily-search", "tavily-extract")
    found = tavily.call("tavily-search", query=query, max_results=2, search_depth="advanced", topic="general")
    assert found.startswith("Detailed Results:") and found.count("URL: ") == 2 and f"URL: {url}\n" in found
    extracted = tavily.call("tavily-extract", urls=[url, "https://nowhere.example"])
    assert corpus.read(url).content in extracted and "nowhere.example\nFailed" in extracted
    assert tavily.call("tavily-search", query="x", bogus=1) == "Error: unknown argument(s) ['bogus']"
    assert tavily.call("tavily-search", query=" ").startswith("Error:") and tavily.errors == 2
    assert tavily.calls == {"tavily-search": 3, "tavily-extract": 1} and url in tavily.found_urls

    searxng = SearchTools(corpus, "searxng")
    assert (searxng.search_name, searxng.read_name) == ("searxng_web_search", "web_url_read")
    first = searxng.call("searxng_web_search", query=query, language="en")
    second = searxng.call("searxng_web_search", query=query, pageno=2)
    urls = [line for line in (first + "\n" + second).splitlines() if line.startswith("URL: ")]
    assert first.count("URL: ") == 10 and len(urls) == len(set(urls)) and "Relevance Score: " in first
    page = searxng.call("web_url_read", url=url)
    assert page == f"# {corpus.read(url).title}\n\n{corpus.read(url).content}"
    assert searxng.call("web_url_read", url=url, startChar=2, maxLength=5) == page[2:7]
    assert searxng.call("web_url_read", url="https://nowhere.example").startswith("Error: could not fetch")
    assert searxng.read_urls == [url, url, "https://nowhere.example"]
    with pytest.raises(ValueError, match="search_client_type"):
        SearchTools(corpus, "google")


def test_judge_verdicts_and_the_text_comparison():
    assert judge_says_yes("1. **Reasoning**: fine.\n\n2. **Correctness**: YES")
    assert judge_says_yes("correctness: yes") and not judge_says_yes("**Correctness**: NO")
    assert not judge_says_yes("YES, but no verdict heading") and not judge_says_yes("")
    assert answer_contains("It was founded in 1987.", "1987") and answer_contains("Ada Quell", "ada quell")
    assert answer_contains("the Zorbin-X2", "Zorbin X2")  # hyphens and spaces alike
    assert (
        not answer_contains("19870", "1987") and not answer_contains("", "x") and not answer_contains("x", "")
    )


# -- the agent -------------------------------------------------------------------------------


@pytest.mark.parametrize("client_type", ["searxng", "tavily"])
def test_oracle_searches_reads_and_is_judged_right(agentscope, serve, client_type):
    question = next(q for q in default_world().questions if len(q.hops) == 2)
    row = question.row()
    policy = websearch_oracle(row["problem"], client_type)
    model, [judge], exps = run_episode(row, policy, serve, search_client_type=client_type)
    calls = model.engine.calls
    assert len(exps) == len(calls) == 5  # search, read, search, read, answer
    search, read = ws.TOOL_NAMES[client_type]
    assert [t["function"]["name"] for t in calls[0]["tools"]] == [search, read, "generate_response"]
    assert calls[0]["messages"][0]["content"] == ws.SYSTEM_PROMPT
    assert calls[0]["messages"][1]["content"] == row["problem"]
    for step, exp in enumerate(exps):
        assert (exp.eid.step, exp.reward) == (step, 1.0) and bool(exp.action_mask.all())
    last = exps[-1]
    assert last.info["answer"] == row["answer"] and last.info["accuracy"] == 1.0
    assert [u for _, u in question.hops] == last.info["read_urls"]
    assert last.metrics["search_calls"] == 2.0 and last.metrics["read_calls"] == 2.0
    assert last.metrics["judge_fallback"] == 0.0 and last.metrics["max_turns"] == 10.0
    [judging] = judge.engine.calls
    asked = judging["messages"][-1]["content"]
    assert f"[question]: {row['problem']}" in asked and f"[correct_answer]: {row['answer']}" in asked
    assert f"[response]: {row['answer']}" in asked and "Correctness" in last.info["judge_reply"]


def test_oracle_and_random_policies_score_as_expected(agentscope, serve, dataset):
    _, _, test = dataset
    agent, judge = serve(None), serve(websearch_text_judge)
    rewards: dict[str, list[float]] = {"oracle": [], "random": []}
    for i, row in enumerate(test):
        for name, policy in (("oracle", websearch_oracle(row["problem"])), ("random", websearch_random(i))):
            agent.engine.policy = policy
            workflow = AgentScopeV1ReactSearchWorkflow(
                task=web_task(row), model=agent, auxiliary_models=[judge]
            )
            exps = workflow.run()
            rewards[name].append(exps[-1].reward)
    assert rewards["oracle"] == [1.0] * len(test)
    assert set(rewards["random"]) <= {0.0, 1.0} and statistics.fmean(rewards["random"]) <= 0.25


def test_no_judge_falls_back_to_text_comparison_and_a_no_decides(agentscope, serve, caplog):
    row = default_world().questions[0].row()
    before = sum(ws.JUDGE_FALLBACKS.values())
    _, _, exps = run_episode(row, websearch_oracle(row["problem"]), serve, judge_policy=None)
    assert exps[-1].reward == 1.0 and exps[-1].metrics["judge_fallback"] == 1.0
    assert "auxiliary_models" in exps[-1].info["judge_failure"] and "no judging" in caplog.text
    assert sum(ws.JUDGE_FALLBACKS.values()) == before + 1
    _, _, exps = run_episode(
        row, websearch_oracle(row["problem"]), serve, judge_policy=lambda m: "Correctness: NO"
    )
    assert exps[-1].reward == 0.0 and exps[-1].metrics["judge_fallback"] == 0.0


def test_no_final_answer_scores_zero_and_long_calls_are_not_trained(agentscope, serve):
    row = default_world().questions[0].row()
    # out of turns without generate_response: the final text is judged, as in Trinity-RFT
    _, [judge], exps = run_episode(row, lambda m: "Let me think.", serve, max_turns=2)
    assert exps[-1].reward == 0.0 and exps[-1].info["answer"] == "Let me think."
    assert "[response]: Let me think." in judge.engine.calls[0]["messages"][-1]["content"]
    _, _, full = run_episode(row, websearch_oracle(row["problem"]), serve)
    longest = max(len(e.tokens) for e in full)
    shortest = min(len(e.tokens) for e in full)
    _, _, kept = run_episode(row, websearch_oracle(row["problem"]), serve, max_model_tokens=longest - 1)
    assert 0 < len(kept) < len(full) and all(len(e.tokens) < longest for e in kept)
    assert kept[-1].info["dropped_over_max_model_tokens"] == len(full) - len(kept)
    _, _, none = run_episode(row, websearch_oracle(row["problem"]), serve, max_model_tokens=shortest - 1)
    assert none == []


def test_the_local_search_is_announced_once_per_client_type(agentscope, serve, monkeypatch, caplog):
    monkeypatch.setattr(ws, "_ANNOUNCED", set())
    row = default_world().questions[0].row()
    caplog.set_level(logging.WARNING, logger=ws.logger.name)
    for _ in range(2):
        run_episode(row, websearch_oracle(row["problem"], "tavily"), serve, search_client_type="tavily")
    announced = [r for r in caplog.records if "served locally" in r.getMessage()]
    assert len(announced) == 1 and "TAVILY_API_KEY is not used" in announced[0].getMessage()


def test_corpus_path_from_the_environment_is_searched(agentscope, serve, tmp_path, monkeypatch):
    page = WebPage("https://www.private.example/facts", "Facts", "The Quillon bridge opened in 1911.")
    (tmp_path / "corpus.jsonl").write_text(json.dumps(page.__dict__) + "\n")
    monkeypatch.setenv(ws.CORPUS_PATH_ENV, str(tmp_path / "corpus.jsonl"))
    row = {"problem": "When did the Quillon bridge open?", "answer": "1911"}

    def policy(messages):
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if not results:
            call = {"name": "searxng_web_search", "arguments": {"query": "Quillon bridge"}}
        else:
            answer = "1911" if "1911" in results[0] else "unknown"
            call = {"name": "generate_response", "arguments": {"result": answer}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    _, _, exps = run_episode(row, policy, serve)
    assert exps[-1].reward == 1.0 and exps[-1].info["found_urls"] == [page.url]


def test_workflow_checks_its_arguments_and_rows():
    row = default_world().questions[0].row()
    with pytest.raises(ValueError, match="search_client_type"):
        AgentScopeV1ReactSearchWorkflow(task=web_task(row, search_client_type="bing"), model=None)
    with pytest.raises(ValueError, match="max_turns"):
        AgentScopeV1ReactSearchWorkflow(task=web_task(row, max_turns=0), model=None)
    fmt = FormatConfig(prompt_key="problem", response_key="answer")
    assert AgentScopeV1ReactSearchWorkflow.row_problem(row, fmt) is None
    assert "'answer'" in AgentScopeV1ReactSearchWorkflow.row_problem({"problem": "q"}, fmt)
    workflow = AgentScopeV1ReactSearchWorkflow(task=web_task(row), model=None)
    assert (workflow.search_client_type, workflow.max_model_tokens) == (
        "searxng",
        24000,
    )  # upstream's defaults


# -- Trinity-RFT's config ---------------------------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_MODEL_PATH", "/models/some-model")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.chdir(tmp_path)  # the config names its dataset relative to the working directory
    write_websearch(DATASET, train=6, test=3, seed=2)
    return tmp_path


def test_upstream_config_loads_unchanged_and_reads_the_generated_rows(upstream_env):
    from trinity.buffer.taskset import TasksetReader

    config = load_config(UPSTREAM / "agentscopev1_websearch_agent.yaml")
    inputs = config.buffer.explorer_input
    assert get_component("workflow", "agentscope_v1_react_search_workflow") is AgentScopeV1ReactSearchWorkflow
    assert config.algorithm.algorithm_type == "multi_step_grpo"
    rollout = config.explorer.rollout_model
    assert rollout.enable_openai_api and rollout.enable_history and rollout.tool_call_parser == "hermes"
    assert config.explorer.auxiliary_models[0].model_path == "Qwen/Qwen3-4B-Instruct-2507"
    readers = [TasksetReader(t, config.buffer) for t in (inputs.tasksets[0], inputs.eval_tasksets[0])]
    assert [len(r) for r in readers] == [6, 3] and not any(r.skipped for r in readers)
    client_types = []
    for reader in readers:
        task = reader.read_batch(1)[0]
        assert task.workflow is AgentScopeV1ReactSearchWorkflow
        workflow = AgentScopeV1ReactSearchWorkflow(task=task, model=None)
        assert workflow.max_turns == 10 and default_world().question_for(workflow.question) is not None
        client_types.append(workflow.search_client_type)
    assert client_types == ["tavily", "searxng"]  # the eval taskset keeps upstream's default


def test_config_keys_the_workflow_does_not_read_fail_at_load(upstream_env):
    import yaml

    config = yaml.safe_load((UPSTREAM / "agentscopev1_websearch_agent.yaml").read_text())
    config["buffer"]["explorer_input"]["taskset"]["workflow_args"]["search_engine"] = "google"
    (upstream_env / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(Exception, match="search_engine"):
        load_config(upstream_env / "bad.yaml")
