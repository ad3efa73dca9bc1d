"""``agentscope_v1_react_search_workflow``: an AgentScope ReAct agent answers a question by
searching and reading web pages, served locally.

Trinity-RFT's ``examples/agentscope_websearch``: the agent (``ReActAgent`` "Friday", a "Web
Information Seeking Master") gets the row's ``problem`` and search tools, and ends with
``generate_response(result=...)`` (AgentScope's structured output). Upstream connects to a
Tavily or SearXNG MCP server through ``npx`` and searches the live web; here the same tools
(names, arguments, the shape of their answers) are served in process over a local corpus,
ranked with BM25 (``bm25s``), and nothing reaches the network:

- ``search_client_type: tavily``: ``tavily-search`` (``query``, ``max_results``,
  ``include_domains``, ``exclude_domains``; the rest of Tavily's arguments are accepted and
  have no effect offline) and ``tavily-extract`` (``urls``);
- ``search_client_type: searxng`` (upstream's default): ``searxng_web_search`` (``query``,
  ``pageno``) and ``web_url_read`` (``url``, ``startChar``, ``maxLength``).

A query may hold ``site:DOMAIN`` to search one site. The corpus is
:func:`trinity_agents.web_corpus.default_world`'s pages unless ``workflow_args.corpus_path``
(or ``$TRINITY_WEB_CORPUS_PATH``) names a jsonl file of ``{"url", "title", "content"}`` pages.
``TAVILY_API_KEY`` / ``SEARXNG_URL`` are not needed; the first run of each client type in a
process logs once that its search is served locally.

The reward is Trinity-RFT's: 1 when the judge model (the first of
``explorer.auxiliary_models``, through its OpenAI API) says the final answer matches the
reference (``Correctness: YES``), else 0. Where no judge answers (none configured, an error, a
timeout), the answer is compared with the reference as text instead (it must contain it),
counted in ``judge_fallback`` and logged. As upstream, every recorded model call is one
Experience with the episode's reward, and calls longer than ``max_model_tokens`` tokens are
dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from trinity.workflow import Workflow
from trinity_agents.agentscope_react import (
    agentscope_chat_model,
    check_model_for_agents,
    clear_history,
    finish_steps,
    react_agent,
    reply_or_none,
    require_agentscope,
    run_blocking,
)
from trinity_agents.judge_call import ask_judge
from trinity_agents.multi_turn import positive_int
from trinity_agents.web_corpus import WebPage, default_world

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.workflow import Task

# Under "trinity": a job sends that tree to its log files and console (a plugin's own
# top-level logger would reach neither in a `trinity run`).
logger = logging.getLogger("trinity.agents.websearch")

CORPUS_PATH_ENV = "TRINITY_WEB_CORPUS_PATH"
CLIENT_TYPES = ("searxng", "tavily")
#: The tools each client type offers: (search tool, page-reading tool).
TOOL_NAMES = {
    "tavily": ("tavily-search", "tavily-extract"),
    "searxng": ("searxng_web_search", "web_url_read"),
}
SEARXNG_PAGE_SIZE = 10
JUDGE_TIMEOUT = 300.0
SYSTEM_PROMPT = (
    "You are a Web Information Seeking Master. Your task is to thoroughly seek the internet for "
    "information and provide accurate answers to questions."
)


# -- the corpus and its index ----------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    import bm25s

    return bm25s.tokenize(text, stopwords="en", return_ids=False, show_progress=False)[0]


def _domain(url: str) -> str:
    host = urlsplit(url if "//" in url else "//" + url).hostname or ""
    return host.lower().removeprefix("www.")


def normalise_url(url: str) -> str:
    """A URL as the corpus keys it: scheme and ``www.`` dropped, lower-case host, no trailing slash."""
    parts = urlsplit(url.strip() if "//" in url else "//" + url.strip())
    return (_domain(url) + parts.path.rstrip("/")).lower()


class WebCorpus:
    """Pages searchable with BM25 (title and content) and readable by URL."""

    def __init__(self, pages: list[WebPage] | tuple[WebPage, ...]) -> None:
        try:
            import bm25s
        except ImportError:
            from trinity_agents.agentscope_react import agentscope_install_hint

            raise ImportError(f"the local web search needs bm25s: {agentscope_install_hint()}") from None
        if not pages:
            raise ValueError("the web corpus has no pages")
        self.pages = list(pages)
        self.by_url = {normalise_url(p.url): p for p in self.pages}
        self.index = bm25s.BM25()
        corpus = bm25s.tokenize(
            [f"{p.title} {p.content}" for p in self.pages], stopwords="en", show_progress=False
        )
        self.index.index(corpus, show_progress=False)
        self._lock = threading.Lock()

    @classmethod
    def from_jsonl(cls, path: str | Path) -> WebCorpus:
        """A corpus from a jsonl file of ``{"url", "title", "content"}`` objects."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"web corpus {path} does not exist (`python -m trinity_agents.web_corpus OUT_DIR` writes OUT_DIR/corpus.jsonl)"
            )
        pages = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    item = json.loads(line)
                    pages.append(WebPage(str(item["url"]), str(item.get("title", "")), str(item["content"])))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{n}: not a page with url and content ({exc})") from None
        return cls(pages)

    def search(
        self,
        query: str,
        *,
        max_results: int = 5,
        offset: int = 0,
        include_domains: list[str] | None = None,
        exclude_domains: list[str] | None = None,
    ) -> list[tuple[WebPage, float]]:
        """The best pages for ``query`` (``site:DOMAIN`` terms restrict the domain), best first,
        pages with no query word left out."""
        sites = [s.lower().removeprefix("www.") for s in re.findall(r"\bsite:(\S+)", query)]
        words = _tokens(re.sub(r"\bsite:\S+", " ", query))
        if not words:
            return []
        include = [d.lower().removeprefix("www.") for d in (include_domains or [])] + sites
        exclude = [d.lower().removeprefix("www.") for d in (exclude_domains or [])]
        with self._lock:
            ids, scores = self.index.retrieve([words], k=len(self.pages), show_progress=False)
        hits = []
        for i, score in zip(ids[0].tolist(), scores[0].tolist()):
            if score <= 0:
                continue
            page = self.pages[i]
            domain = _domain(page.url)
            if include and not any(domain == d or domain.endswith("." + d) for d in include):
                continue
            if any(domain == d or domain.endswith("." + d) for d in exclude):
                continue
            hits.append((page, float(score)))
        return hits[offset : offset + max_results]

    def read(self, url: str) -> WebPage | None:
        """The page at ``url`` (``None`` if there is none)."""
        return self.by_url.get(normalise_url(str(url)))


_CORPORA: dict[str, WebCorpus] = {}
_CORPORA_LOCK = threading.Lock()


def open_corpus(path: str | Path | None = None) -> WebCorpus:
    """One shared :class:`WebCorpus` per process: the jsonl file ``path``, or the generated
    default world's pages."""
    key = str(Path(path).resolve()) if path else ""
    with _CORPORA_LOCK:
        if key not in _CORPORA:
            _CORPORA[key] = WebCorpus.from_jsonl(path) if path else WebCorpus(default_world().pages)
        return _CORPORA[key]


# -- the tools -------------------------------------------------------------------------------

TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "tavily-search": {
        "description": "Search the web for pages about a query. Returns titles, URLs and content snippets.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The search query."},
                "max_results": {"type": "integer", "description": "How many results (default 5)."},
                "include_domains": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Only results from these domains.",
                },
                "exclude_domains": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "No results from these domains.",
                },
                "search_depth": {"type": "string", "enum": ["basic", "advanced"]},
                "topic": {"type": "string", "enum": ["general", "news"]},
            },
            "required": ["query"],
        },
    },
    "tavily-extract": {
        "description": "Extract the content of web pages by their URLs.",
        "parameters": {
            "type": "object",
            "properties": {
                "urls": {"type": "array", "items": {"type": "string"}, "description": "The pages' URLs."},
                "extract_depth": {"type": "string", "enum": ["basic", "advanced"]},
            },
            "required": ["urls"],
        },
    },
    "searxng_web_search": {
        "description": "Search the web. Returns titles, descriptions and URLs, 10 results a page.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The search query."},
                "pageno": {"type": "number", "description": "Results page, from 1 (default 1)."},
                "time_range": {"type": "string", "enum": ["day", "month", "year"]},
                "language": {"type": "string", "description": "Language code, e.g. en."},
                "safesearch": {"type": "string", "enum": ["0", "1", "2"]},
            },
            "required": ["query"],
        },
    },
    "web_url_read": {
        "description": "Read the content of a web page by its URL.",
        "parameters": {
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The page's URL."},
                "startChar": {"type": "number", "description": "Start at this character (default 0)."},
                "maxLength": {"type": "number", "description": "Return at most this many characters."},
            },
            "required": ["url"],
        },
    },
}
#: Arguments each tool accepts that have no effect on the local corpus (live-web options).
_OFFLINE_ARGS = {
    "tavily-search": {
        "search_depth",
        "topic",
        "days",
        "time_range",
        "include_images",
        "include_image_descriptions",
        "include_raw_content",
        "country",
        "start_date",
        "end_date",
    },
    "tavily-extract": {"extract_depth", "include_images", "format"},
    "searxng_web_search": {"time_range", "language", "safesearch"},
    "web_url_read": {"section", "paragraphRange", "readHeadings"},
}


class SearchTools:
    """The agent's two tools for one client type over a :class:`WebCorpus`, counting calls and
    remembering the URLs found and read."""

    def __init__(self, corpus: WebCorpus, client_type: str = "searxng") -> None:
        if client_type not in CLIENT_TYPES:
            raise ValueError(f"search_client_type must be one of {list(CLIENT_TYPES)}, got {client_type!r}")
        self.corpus = corpus
        self.client_type = client_type
        self.search_name, self.read_name = TOOL_NAMES[client_type]
        self.calls: Counter[str] = Counter()
        self.found_urls: list[str] = []
        self.read_urls: list[str] = []
        self.errors = 0

    def _error(self, text: str) -> str:
        self.errors += 1
        return f"Error: {text}"

    def _unknown(self, name: str, given: dict[str, Any]) -> str | None:
        unknown = sorted(set(given) - _OFFLINE_ARGS[name])
        return self._error(f"unknown argument(s) {unknown}") if unknown else None

    def call(self, name: str, **arguments: Any) -> str:
        """The tool ``name``'s answer to ``arguments`` (text; ``Error: ...`` on bad arguments)."""
        self.calls[name] += 1
        method = {
            "tavily-search": self.tavily_search,
            "tavily-extract": self.tavily_extract,
            "searxng_web_search": self.searxng_web_search,
            "web_url_read": self.web_url_read,
        }[name]
        try:
            return method(**arguments)
        except (TypeError, ValueError) as exc:
            return self._error(str(exc))

    def tavily_search(
        self,
        query: str = "",
        max_results: int = 5,
        include_domains: list[str] | None = None,
        exclude_domains: list[str] | None = None,
        **rest: Any,
    ) -> str:
        if (error := self._unknown("tavily-search", rest)) is not None:
            return error
        if not str(query).strip():
            return self._error("give a query")
        hits = self.corpus.search(
            str(query),
            max_results=max(1, min(int(max_results), 20)),
            include_domains=include_domains,
            exclude_domains=exclude_domains,
        )
        self.found_urls += [p.url for p, _ in hits]
        if not hits:
            return "No results found."
        return "Detailed Results:\n\n" + "\n\n".join(
            f"Title: {p.title}\nURL: {p.url}\nContent: {p.content[:300]}" for p, _ in hits
        )

    def tavily_extract(self, urls: Any = None, **rest: Any) -> str:
        if (error := self._unknown("tavily-extract", rest)) is not None:
            return error
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            return self._error("give the urls to extract")
        parts = []
        for url in urls:
            self.read_urls.append(str(url))
            page = self.corpus.read(str(url))
            if page is None:
                parts.append(f"URL: {url}\nFailed: page not found")
            else:
                parts.append(f"URL: {page.url}\n## Raw Content\n{page.title}\n\n{page.content}")
        return "\n\n".join(parts)

    def searxng_web_search(self, query: str = "", pageno: Any = 1, **rest: Any) -> str:
        if (error := self._unknown("searxng_web_search", rest)) is not None:
            return error
        if not str(query).strip():
            return self._error("give a query")
        page_number = max(1, int(pageno))
        hits = self.corpus.search(
            str(query), max_results=SEARXNG_PAGE_SIZE, offset=(page_number - 1) * SEARXNG_PAGE_SIZE
        )
        self.found_urls += [p.url for p, _ in hits]
        if not hits:
            return "No results found."
        return "\n\n".join(
            f"Title: {p.title}\nDescription: {p.content[:300]}\nURL: {p.url}\nRelevance Score: {s:.3f}"
            for p, s in hits
        )

    def web_url_read(self, url: str = "", startChar: Any = 0, maxLength: Any = None, **rest: Any) -> str:
        if (error := self._unknown("web_url_read", rest)) is not None:
            return error
        if not str(url).strip():
            return self._error("give the url to read")
        self.read_urls.append(str(url))
        page = self.corpus.read(str(url))
        if page is None:
            return self._error(f"could not fetch {url}: page not found")
        text = f"# {page.title}\n\n{page.content}"
        start = max(0, int(startChar or 0))
        end = None if maxLength is None else start + max(0, int(maxLength))
        return text[start:end]


def build_search_toolkit(tools: SearchTools) -> Any:
    """An AgentScope ``Toolkit`` with ``tools``' search and page-reading tools."""
    from agentscope.message import TextBlock
    from agentscope.tool import Toolkit, ToolResponse

    def bind(name: str):
        async def tool(**kwargs: Any) -> Any:
            text = await asyncio.to_thread(tools.call, name, **kwargs)
            return ToolResponse(content=[TextBlock(type="text", text=text)])

        return tool

    toolkit = Toolkit()
    for name in (tools.search_name, tools.read_name):
        schema = {"type": "function", "function": {"name": name, **TOOL_SCHEMAS[name]}}
        toolkit.register_tool_function(bind(name), func_name=name, json_schema=schema)
    return toolkit


# -- the reward ------------------------------------------------------------------------------

JUDGE_PROMPT = """Decide whether the [response] to the [question] is correct, given the [correct_answer].

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Answer in this format:

1. **Reasoning**: why the [response] does or does not match the [correct_answer]. Look only at meaningful differences between them; do not solve the question again and do not argue for another answer.

2. **Correctness**: exactly "YES" if the [response] matches the [correct_answer] (for numbers, within a small margin; for text, up to small format differences such as a hyphen), exactly "NO" otherwise (any inconsistency, ambiguity, non-equivalence or error).
"""

#: Judgings that fell back to the text comparison in this process, by failure.
JUDGE_FALLBACKS: Counter[str] = Counter()
_FALLBACK_LOCK = threading.Lock()


def judge_says_yes(reply: str) -> bool:
    """The judge's verdict, read as Trinity-RFT reads it: ``Correctness`` followed by ``YES``."""
    return re.search(r"Correctness.*?YES", reply or "", re.IGNORECASE | re.DOTALL) is not None


def _normalise(text: Any) -> str:
    return re.sub(r"[\s\-]+", " ", str(text or "").lower()).strip(" .!")


def answer_contains(response: Any, correct_answer: Any) -> bool:
    """The judge-free comparison: the response holds the whole correct answer, not inside a
    longer word (lower case, spaces and hyphens alike)."""
    a, r = _normalise(response), _normalise(correct_answer)
    return bool(r) and re.search(r"(?<!\w)" + re.escape(r) + r"(?!\w)", a) is not None


async def judge_answer(
    judge: Any, question: str, response: str, correct_answer: str, *, timeout: float = JUDGE_TIMEOUT
) -> tuple[bool | None, str]:
    """``(verdict, reply or why it failed)``: the judge model's verdict through its OpenAI API,
    ``None`` when there is no judge or it failed; never raises."""
    messages = [
        {"role": "system", "content": "You evaluate correctness."},
        {
            "role": "user",
            "content": JUDGE_PROMPT.format(
                question=question, response=response, correct_answer=correct_answer
            ),
        },
    ]
    reply, _, detail = await ask_judge(judge, messages, timeout)
    if reply is None:
        return None, detail
    return judge_says_yes(reply), reply


def _count_fallback(detail: str) -> None:
    with _FALLBACK_LOCK:
        JUDGE_FALLBACKS[detail.split(":")[0]] += 1
        n = sum(JUDGE_FALLBACKS.values())
    if n <= 3 or n % 100 == 0:
        logger.warning(
            "agentscope_v1_react_search_workflow: no judging (%s); correctness by text comparison "
            "instead (%d such fallbacks in this process)",
            detail,
            n,
        )


# -- the workflow ----------------------------------------------------------------------------

_ANNOUNCED: set[str] = set()
_ANNOUNCED_LOCK = threading.Lock()


def _announce_local(client_type: str, corpus: str) -> None:
    with _ANNOUNCED_LOCK:
        if client_type in _ANNOUNCED:
            return
        _ANNOUNCED.add(client_type)
    search, read = TOOL_NAMES[client_type]
    secret = "TAVILY_API_KEY" if client_type == "tavily" else "SEARXNG_URL"
    logger.warning(
        "agentscope_v1_react_search_workflow: search_client_type %r is served locally: %s and %s "
        "over %s, not the live web (%s is not used)",
        client_type,
        search,
        read,
        corpus,
        secret,
    )


def _final_result_model() -> Any:
    from pydantic import BaseModel, Field

    class FinalResult(BaseModel):
        result: str = Field(description="The final result to the initial user query")

    return FinalResult


class AgentScopeV1ReactSearchWorkflow(Workflow):
    """``agentscope_v1_react_search_workflow``: see the module docstring.

    ``workflow_args``: ``max_turns`` (the agent's reasoning-acting iterations, default 10),
    ``search_client_type`` (``searxng``, the default, or ``tavily``: which tools the agent
    gets), ``max_model_tokens`` (recorded calls longer than this are not trained, default
    24000), ``corpus_path`` (a jsonl corpus; default ``$TRINITY_WEB_CORPUS_PATH``, else the
    generated websites).
    """

    is_async: ClassVar[bool] = True
    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = False

    registered_name: ClassVar[str] = "agentscope_v1_react_search_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = (
        "max_turns",
        "search_client_type",
        "max_model_tokens",
        "corpus_path",
    )

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        for key in (format_args.prompt_key, format_args.response_key):
            if not isinstance(row.get(key), str) or not row[key].strip():
                return f"no text in column {key!r}"
        return None

    def reset(self, task: Task) -> None:
        self.task = task
        self.repeat_times = task.repeat_times
        args = dict(task.workflow_args or {})
        name = self.registered_name
        self.max_turns = positive_int(args.get("max_turns", 10), "max_turns")
        self.search_client_type = args.get("search_client_type", "searxng")
        if self.search_client_type not in CLIENT_TYPES:
            raise ValueError(
                f"{name}: workflow_args.search_client_type must be one of {list(CLIENT_TYPES)}, "
                f"got {self.search_client_type!r}"
            )
        self.max_model_tokens = positive_int(args.get("max_model_tokens", 24000), "max_model_tokens")
        self.corpus_path = args.get("corpus_path") or os.environ.get(CORPUS_PATH_ENV) or None
        self.question = task.task_desc
        self.truth = task.truth
        if not self.question or self.truth is None:
            key = task.format_args.prompt_key if not self.question else task.format_args.response_key
            raise ValueError(f"{name}: task {task.index} has no column {key!r}")

    def system_prompt(self) -> str:
        return self.task.format_args.system_prompt or SYSTEM_PROMPT

    def run(self) -> list[Experience]:
        return run_blocking(self)

    def build_agent(self, tools: SearchTools) -> Any:
        self._chat_model = agentscope_chat_model(self.model, self.task)
        toolkit = build_search_toolkit(tools)
        return react_agent("Friday", self.system_prompt(), self._chat_model, toolkit, self.max_turns)

    async def run_async(self) -> list[Experience]:
        require_agentscope(self.registered_name)
        check_model_for_agents(self.model, self.registered_name, tools=True)
        corpus = await asyncio.to_thread(open_corpus, self.corpus_path)
        _announce_local(
            self.search_client_type, self.corpus_path or "the generated websites (trinity_agents.web_corpus)"
        )
        tools = SearchTools(corpus, self.search_client_type)
        clear_history(self.model)
        agent = self.build_agent(tools)
        try:
            reply = await reply_or_none(agent, self.question, _final_result_model())
        finally:
            await self._chat_model.client.close()  # on this event loop: run() ends it
        metadata = reply.metadata if reply is not None and isinstance(reply.metadata, dict) else {}
        if "result" in metadata:
            answer = str(metadata["result"])
        else:
            answer = (reply.get_text_content() or "") if reply is not None else ""

        recorded = self.model.extract_experience_from_history(clear_history=True)
        if not recorded:
            return []
        judged: dict[str, Any] = {"judge_fallback": False}
        if reply is None:
            correct = False
        else:
            judge = self.auxiliary_models[0] if self.auxiliary_models else None
            verdict, detail = await judge_answer(judge, self.question, answer, str(self.truth))
            if verdict is None:
                _count_fallback(detail)
                correct = answer_contains(answer, self.truth)
                judged.update(judge_fallback=True, judge_failure=detail)
            else:
                correct = verdict
                judged["judge_reply"] = detail
        reward = 1.0 if correct else 0.0
        memory = await agent.memory.get_memory()
        kept = [exp for exp in recorded if len(exp.tokens) <= self.max_model_tokens]
        if not kept:
            logger.info(
                "%s: every recorded call is over max_model_tokens; nothing to train", self.registered_name
            )
            return []
        info = {
            "answer": answer,
            "reference_answer": self.truth,
            "accuracy": reward,
            "search_client_type": self.search_client_type,
            "found_urls": tools.found_urls,
            "read_urls": tools.read_urls,
            "model_calls": len(recorded),
            "dropped_over_max_model_tokens": len(recorded) - len(kept),
            "max_model_len_reached": reply is None,
            **judged,
        }
        metrics = {
            "accuracy": reward,
            "react_turns": float(len(memory) // 2),
            "max_turns": float(self.max_turns),
            "model_calls": float(len(recorded)),
            "search_calls": float(tools.calls[tools.search_name]),
            "read_calls": float(tools.calls[tools.read_name]),
            "tool_errors": float(tools.errors),
            "judge_fallback": float(judged["judge_fallback"]),
        }
        steps = [(exp, {}) for exp in kept]
        return finish_steps(steps, reward=reward, run=self.run_id_base, info=info, metrics=metrics)


# -- scripted policies (tests, baselines) ----------------------------------------------------


def _tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]


def _search_args(client_type: str, query: str) -> dict[str, Any]:
    return {"query": query, "max_results": 5} if client_type == "tavily" else {"query": query}


def _read_args(client_type: str, url: str) -> dict[str, Any]:
    return {"urls": [url]} if client_type == "tavily" else {"url": url}


def websearch_oracle(problem: str, client_type: str = "searxng", world: Any = None) -> Any:
    """A policy (``policy(messages) -> reply``, hermes tool calls) that answers a generated
    question the way a good agent would: for each hop it searches the hop's query, reads the
    hop's page when the search found it, then calls ``generate_response`` with the answer (``I
    don't know`` if a search missed its page). ``problem`` is the row's problem text."""
    question = (world or default_world()).question_for(problem)
    if question is None:
        raise ValueError("the oracle knows only the generated questions (trinity_agents.web_corpus)")
    search, read = TOOL_NAMES[client_type]

    def policy(messages: list[dict[str, Any]]) -> str:
        results = _tool_results(messages)
        hop, reading = divmod(len(results), 2)
        if results and reading == 1 and question.hops[hop][1] not in results[-1]:
            return "The search did not find the page.\n" + _tool_call(
                "generate_response", result="I don't know"
            )
        if hop == len(question.hops):
            return f"The answer is {question.answer}.\n" + _tool_call(
                "generate_response", result=question.answer
            )
        query, url = question.hops[hop]
        if reading == 0:
            return f"Searching for {query}.\n" + _tool_call(search, **_search_args(client_type, query))
        return f"Reading {url}.\n" + _tool_call(read, **_read_args(client_type, url))

    return policy


def websearch_random(seed: int = 0, client_type: str = "searxng") -> Any:
    """A policy that searches two random words of the question, reads a random result and
    answers a random capitalised word or number of what it read (seeded)."""
    rng = random.Random(seed)
    search, read = TOOL_NAMES[client_type]

    def policy(messages: list[dict[str, Any]]) -> str:
        results = _tool_results(messages)
        if not results:
            words = re.findall(r"[A-Za-z]{3,}", messages[1]["content"].split(" You should")[0]) or ["company"]
            return _tool_call(
                search, **_search_args(client_type, " ".join(rng.sample(words, min(2, len(words)))))
            )
        if len(results) == 1:
            urls = re.findall(r"URL: (\S+)", results[0])
            if urls:
                return _tool_call(read, **_read_args(client_type, rng.choice(urls)))
        words = re.findall(r"\b(?:[A-Z][a-z]+|\d{4})\b", results[-1]) or ["nothing"]
        return _tool_call("generate_response", result=rng.choice(words))

    return policy


def websearch_text_judge(messages: list[dict[str, Any]]) -> str:
    """A judge model's policy: ``Correctness: YES`` when the response holds the correct answer
    (:func:`answer_contains`), else ``NO``."""
    text = messages[-1]["content"]
    response = re.search(r"^\[response\]: (.*)$", text, re.M)
    correct = re.search(r"^\[correct_answer\]: (.*)$", text, re.M)
    ok = bool(response and correct and answer_contains(response.group(1), correct.group(1)))
    return f"1. **Reasoning**: compared as text.\n\n2. **Correctness**: {'YES' if ok else 'NO'}"


def mean_rewards(tasks: int = 100, seed: int = 42, client_type: str = "searxng") -> dict[str, float]:
    """Mean reward of :func:`websearch_oracle` and :func:`websearch_random` on ``tasks``
    generated questions (drawn with ``seed``), :func:`websearch_text_judge` as the auxiliary
    model, played through the workflow by scripted models; needs the ``agentscope`` extra."""
    from trinity.config import FormatConfig
    from trinity.workflow import Task
    from trinity_agents.scripted import scripted_openai_model

    questions = random.Random(seed).sample(list(default_world().questions), tasks)
    agent, judge = scripted_openai_model(None), scripted_openai_model(websearch_text_judge)
    rewards: dict[str, list[float]] = {"oracle": [], "random": []}
    try:
        for i, question in enumerate(questions):
            task = Task(
                workflow=AgentScopeV1ReactSearchWorkflow,
                raw_task=question.row(),
                format_args=FormatConfig(prompt_key="problem", response_key="answer"),
                workflow_args={"search_client_type": client_type},
            )
            policies = {
                "oracle": websearch_oracle(question.problem, client_type),
                "random": websearch_random(i, client_type),
            }
            for name, policy in policies.items():
                agent.engine.policy = policy
                workflow = AgentScopeV1ReactSearchWorkflow(task=task, model=agent, auxiliary_models=[judge])
                rewards[name].append(workflow.run()[-1].reward)
    finally:
        agent.close()
        judge.close()
    return {name: sum(values) / len(values) for name, values in rewards.items()}


def main(argv: list[str] | None = None) -> None:
    """``python -m trinity_agents.websearch [--tasks N] [--seed S] [--client {searxng,tavily}]``:
    the scripted policies' mean rewards."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trinity_agents.websearch", description=main.__doc__)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--client", choices=CLIENT_TYPES, default="searxng")
    args = parser.parse_args(argv)
    for name, value in mean_rewards(args.tasks, args.seed, args.client).items():
        print(f"websearch/{name}: {value:.4f}")


if __name__ == "__main__":
    main()


__all__ = [
    "CORPUS_PATH_ENV",
    "JUDGE_FALLBACKS",
    "TOOL_NAMES",
    "AgentScopeV1ReactSearchWorkflow",
    "SearchTools",
    "WebCorpus",
    "answer_contains",
    "build_search_toolkit",
    "judge_answer",
    "judge_says_yes",
    "mean_rewards",
    "normalise_url",
    "open_corpus",
    "websearch_oracle",
    "websearch_random",
    "websearch_text_judge",
]
