"""``email_search_workflow``: an AgentScope ReAct agent answers a question from a mailbox.

Trinity-RFT's email search example (``examples/grpo_email_search``, after OpenPipe's ART·E):
the agent gets a question about the user's email, the user's address and today's date, and
the tools

- ``search_emails``: full-text search (SQLite FTS5, every keyword must appear in the subject or
  body) over the user's inbox (mail from or to the address) up to today, optionally by sender
  and date range; up to 10 hits, newest first, each a ``message_id`` and a snippet;
- ``read_email``: one email of the inbox by ``message_id`` (date, subject, sender, recipients,
  body);
- ``generate_response``: the final answer and its sources (the ``message_id`` s it comes from;
  AgentScope's structured output).

The mailbox is a database in Trinity-RFT's schema (:mod:`trinity_agents.email_inbox` draws a
synthetic one; Trinity-RFT's ``prepare_data.py`` builds one from Enron), found at
``workflow_args.db_path`` or the ``DEFAULT_EMAIL_DB_PATH`` environment variable, as in
Trinity-RFT. Task rows are Trinity-RFT's: ``question``, ``answer``, ``message_ids`` (the
source emails), ``inbox_address``, ``query_date`` (``id`` and ``how_realistic`` are carried).

The reward is Trinity-RFT's rubric (:class:`EmailSearchReward`): an answer judged correct
scores 2 to 2.5 (more with the right source, few sources and few turns), a wrong one -1 to -0.7
(partial credit for having found, read and cited the source email), ``I don't know`` 0 to 0.3,
no final answer -1. Correctness is decided by a judge model, the first of
``explorer.auxiliary_models`` reached through its OpenAI API (``reward_fn_args.llm_as_a_judge``,
default true), or, with ``llm_as_a_judge: false``, by comparing texts. A judging that fails (no
auxiliary model, an error or timeout, a reply with neither true nor false) falls back to the
text comparison, counted in the metrics (``judge_fallback``) and logged.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

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

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.workflow import Task

logger = logging.getLogger(__name__)

DB_PATH_ENV = "DEFAULT_EMAIL_DB_PATH"
MAX_RESULTS = 10
I_DONT_KNOW = "I don't know"
#: Seconds one judge call may take.
JUDGE_TIMEOUT = 300.0
JUDGE_FAILURES = ("no_judge", "error", "timeout", "malformed")


# -- the mailbox -----------------------------------------------------------------------------


class EmailDatabaseError(RuntimeError):
    """The mailbox database is missing or not in Trinity-RFT's schema (one line)."""


def _day(text: Any, name: str) -> dt.date:
    try:
        return dt.datetime.strptime(str(text).strip(), "%Y-%m-%d").date()
    except ValueError:
        raise ValueError(f"{name} must be a date YYYY-MM-DD, got {text!r}") from None


class EmailDatabase:
    """Read-only access to a mailbox database (Trinity-RFT's schema: ``emails``,
    ``recipients``, ``emails_fts``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise EmailDatabaseError(
                f"email database {self.path} does not exist: write one with `python -m trinity_agents.tasks "
                f"email_search OUT_DIR` and set workflow_args.db_path or {DB_PATH_ENV}"
            )
        self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master")}
        missing = {"emails", "recipients", "emails_fts"} - tables
        if missing:
            raise EmailDatabaseError(f"{self.path} is not an email database: no table {sorted(missing)}")
        self._lock = threading.Lock()

    def _in_inbox(self, inbox: str) -> tuple[str, list[Any]]:
        clause = (
            "(e.from_address = ? OR EXISTS (SELECT 1 FROM recipients r "
            "WHERE r.recipient_address = ? AND r.email_id = e.id))"
        )
        return clause, [inbox, inbox]

    def search(
        self,
        inbox: str,
        keywords: list[str],
        *,
        from_address: str | None = None,
        to_address: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        max_results: int = MAX_RESULTS,
    ) -> list[dict[str, str]]:
        """Emails of ``inbox`` (sent from or to it) holding every keyword in the subject or body,
        optionally from / to an address and sent on or after ``sent_after`` and before
        ``sent_before`` (``YYYY-MM-DD``); newest first, at most ``max_results`` (<= 10), each
        ``{"message_id", "snippet"}`` (matches in ``<b></b>``)."""
        words = [str(k).strip() for k in keywords if str(k).strip()]
        if not words:
            raise ValueError("give at least one keyword")
        if not 1 <= int(max_results) <= MAX_RESULTS:
            raise ValueError(f"max_results must be between 1 and {MAX_RESULTS}")
        # Each keyword is one quoted FTS5 phrase (quotes doubled), so its text is never syntax.
        where = ["emails_fts MATCH ?"]
        params: list[Any] = [" ".join('"' + w.replace('"', '""') + '"' for w in words)]
        clause, values = self._in_inbox(inbox)
        where.append(clause)
        params += values
        if from_address:
            where.append("e.from_address = ?")
            params.append(from_address)
        if to_address:
            where.append(
                "EXISTS (SELECT 1 FROM recipients t WHERE t.recipient_address = ? AND t.email_id = e.id)"
            )
            params.append(to_address)
        if sent_after:
            where.append("e.date >= ?")
            params.append(f"{_day(sent_after, 'sent_after')} 00:00:00")
        if sent_before:
            where.append("e.date < ?")
            params.append(f"{_day(sent_before, 'sent_before')} 00:00:00")
        sql = (
            "SELECT e.message_id, snippet(emails_fts, -1, '<b>', '</b>', ' ... ', 15) "
            "FROM emails e JOIN emails_fts ON e.id = emails_fts.rowid "
            f"WHERE {' AND '.join(where)} ORDER BY e.date DESC LIMIT ?"
        )
        params.append(int(max_results))
        with self._lock:
            rows = self.conn.execute(sql, params).fetchall()
        return [{"message_id": mid, "snippet": snippet} for mid, snippet in rows]

    def read(
        self, message_id: str, *, inbox: str | None = None, before: str | None = None
    ) -> dict[str, Any] | None:
        """The email ``message_id`` (``None`` if there is none, or, with ``inbox`` / ``before``,
        none in that inbox sent before that day)."""
        where, params = ["e.message_id = ?"], [str(message_id).strip()]
        if inbox:
            clause, values = self._in_inbox(inbox)
            where.append(clause)
            params += values
        if before:
            where.append("e.date < ?")
            params.append(f"{_day(before, 'before')} 00:00:00")
        with self._lock:
            row = self.conn.execute(
                "SELECT e.id, e.message_id, e.date, e.subject, e.from_address, e.body, e.file_name "
                f"FROM emails e WHERE {' AND '.join(where)}",
                params,
            ).fetchone()
            if row is None:
                return None
            recipients = self.conn.execute(
                "SELECT recipient_address, recipient_type FROM recipients WHERE email_id = ?", (row[0],)
            ).fetchall()
        email = dict(zip(("message_id", "date", "subject", "from_address"), row[1:5]))
        for kind in ("to", "cc", "bcc"):
            email[f"{kind}_addresses"] = [a for a, t in recipients if str(t).lower() == kind]
        email.update(body=row[5], file_name=row[6])
        return email

    def close(self) -> None:
        self.conn.close()


_DATABASES: dict[tuple[Path, int, int], EmailDatabase] = {}
_DATABASES_LOCK = threading.Lock()


def open_database(path: str | Path) -> EmailDatabase:
    """One shared read-only :class:`EmailDatabase` per database file and process (a file
    written anew at the same path is opened anew)."""
    resolved = Path(path).resolve()
    try:
        stat = resolved.stat()
        key = (resolved, stat.st_ino, stat.st_mtime_ns)
    except OSError:
        return EmailDatabase(resolved)  # raises the one-line error
    with _DATABASES_LOCK:
        if key not in _DATABASES:
            _DATABASES[key] = EmailDatabase(resolved)
        return _DATABASES[key]


# -- the reward ------------------------------------------------------------------------------


def _normalise(text: Any) -> str:
    s = str(text or "").lower().replace("\u2019", "'")
    s = re.sub(r"\s+", " ", s).strip()
    return s.strip(" .!")


def is_i_dont_know(answer: Any) -> bool:
    """Whether the answer is the agreed ``I don't know``."""
    return _normalise(answer) == _normalise(I_DONT_KNOW)


def answers_match(answer: Any, reference: Any) -> bool:
    """The judge-free comparison: the answer holds the whole reference answer, not inside a
    longer word (both in lower case with spaces collapsed and trailing dots dropped)."""
    a, r = _normalise(answer), _normalise(reference)
    return bool(r) and re.search(r"(?<!\w)" + re.escape(r) + r"(?!\w)", a) is not None


@dataclass
class Rubric:
    """What the reward looks at in one episode (Trinity-RFT's ``FinalRubric``, the parts it uses)."""

    answer: str | None = None
    sources: list[str] = field(default_factory=list)
    answer_correct: bool = False
    ever_found_right_email: bool = False
    ever_read_right_email: bool = False
    sources_correct: bool = False
    num_turns: int = 0

    @property
    def attempted_answer(self) -> bool:
        return bool(self.answer) and not is_i_dont_know(self.answer)

    @property
    def returned_i_dont_know(self) -> bool:
        return self.answer is not None and is_i_dont_know(self.answer)


class EmailSearchReward:
    """Trinity-RFT's email search rubric; ``reward_fn_args`` are its arguments.

    Args:
        llm_as_a_judge: decide correctness with the judge model (see the module docstring);
            ``false``: by :func:`answers_match`, and the reward is the accuracy alone.
    """

    def __init__(self, llm_as_a_judge: bool = True) -> None:
        if not isinstance(llm_as_a_judge, bool):
            raise ValueError(f"reward_fn_args.llm_as_a_judge must be true or false, got {llm_as_a_judge!r}")
        self.llm_as_a_judge = llm_as_a_judge

    def __call__(self, rubric: Rubric, max_turns: int) -> dict[str, float]:
        """``{"accuracy", "format"}``; the reward is their sum."""
        if rubric.answer is None:
            return {"accuracy": 0.0, "format": -1.0}
        if not self.llm_as_a_judge:
            return {"accuracy": float(rubric.answer_correct), "format": 0.0}
        # Partial credit, always under 0.5 in all: the source found, read, cited.
        partial = 0.1 * (
            rubric.ever_found_right_email + rubric.ever_read_right_email + rubric.sources_correct
        )
        if rubric.returned_i_dont_know:
            return {"accuracy": 0.0, "format": partial}
        if not rubric.answer_correct:
            return {"accuracy": -1.0, "format": partial}
        score = 1.0 + (0.3 if rubric.sources_correct else 0.0)
        score += 0.1 / len(rubric.sources) if rubric.sources else 0.0  # fewer extra sources
        score += 0.1 * (1 - rubric.num_turns / max_turns)  # fewer turns
        return {"accuracy": 1.0, "format": score}


JUDGE_SYSTEM_PROMPT = """You check an AI assistant's answer to a question against a reference answer.
1. Work out what the question asks for (a time, a place, an amount, a name, a number...).
2. Take from the reference answer only the facts needed to answer exactly that.
3. The AI answer is accepted if it states each of those facts with the same meaning; wording,
   order and extra details that do not contradict them do not matter.
4. It is rejected if any of those facts is missing or contradicted.
Do not reject the AI answer for leaving out reference details the question did not ask for.
Reply with true (accept) or false (reject) and nothing else."""


@dataclass
class JudgeOutcome:
    """A judging: ``accept`` (``None`` when it failed), the failure (one of
    :data:`JUDGE_FAILURES`) and the judge's reply."""

    accept: bool | None
    failure: str | None = None
    reply: str | None = None
    detail: str = ""


#: Judgings that fell back to the text comparison in this process, by failure.
JUDGE_FALLBACKS: Counter[str] = Counter()
_FALLBACK_LOCK = threading.Lock()


def count_fallback(failure: str, detail: str) -> None:
    """Count a judging's fallback and log it (the first three of each kind, then every 100th)."""
    with _FALLBACK_LOCK:
        JUDGE_FALLBACKS[failure] += 1
        n = JUDGE_FALLBACKS[failure]
    if n <= 3 or n % 100 == 0:
        logger.warning(
            "email_search_workflow: judging failed (%s: %s); correctness by text comparison instead "
            "(%d such fallbacks in this process)",
            failure,
            detail,
            n,
        )


def read_verdict(reply: str) -> bool | None:
    """The judge's verdict: the first ``true`` or ``false`` word of the reply, else ``None``."""
    match = re.search(r"\b(true|false)\b", reply or "", re.IGNORECASE)
    return None if match is None else match.group(1).lower() == "true"


async def judge_answer(
    judge: Any, question: str, reference: str, answer: str, *, timeout: float = JUDGE_TIMEOUT
) -> JudgeOutcome:
    """Ask ``judge`` (a model wrapper, e.g. the first auxiliary model) through its OpenAI API
    whether ``answer`` is right; never raises."""
    messages = [
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Question: {question}\nReference answer: {reference}\nAI answer: {answer}",
        },
    ]
    reply, failure, detail = await ask_judge(judge, messages, timeout)
    if reply is None:
        return JudgeOutcome(None, failure, detail=detail)
    verdict = read_verdict(reply)
    if verdict is None:
        return JudgeOutcome(
            None, "malformed", reply=reply, detail=f"reply without true/false: {reply[:100]!r}"
        )
    return JudgeOutcome(verdict, reply=reply)


# -- the agent's tools -----------------------------------------------------------------------

SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search_emails",
        "description": (
            "Search the user's email inbox for emails containing all the given keywords (in the "
            "subject or body), sent up to the query date. Returns up to 10 matches, newest first, "
            "each with its message_id and a snippet."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "inbox_address": {"type": "string", "description": "The user's email address."},
                "query_date": {"type": "string", "description": "Today's date, YYYY-MM-DD."},
                "keywords": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Keywords that must all appear in the email.",
                },
                "from_address": {"type": "string", "description": "Only emails sent by this address."},
                "sent_after": {
                    "type": "string",
                    "description": "Only emails sent on or after this date, YYYY-MM-DD.",
                },
                "sent_before": {
                    "type": "string",
                    "description": "Only emails sent before this date, YYYY-MM-DD.",
                },
            },
            "required": ["inbox_address", "query_date", "keywords"],
        },
    },
}

READ_SCHEMA = {
    "type": "function",
    "function": {
        "name": "read_email",
        "description": "Read one email of the user's inbox: date, subject, sender, recipients and body.",
        "parameters": {
            "type": "object",
            "properties": {"message_id": {"type": "string", "description": "The email's message_id."}},
            "required": ["message_id"],
        },
    },
}

SYSTEM_PROMPT = """You are an email search agent. You get a question from the user and tools to search and read the user's emails; use them to find the answer. You have up to {max_turns} turns, so if a search finds nothing useful, try again with other keywords.
Say what you see and what you will do next, and why. Once you have found the answer, call `generate_response` with the answer and the message_id of each email it comes from, and nothing about next steps. If you cannot find it, answer "I don't know" with no sources.

The user's email address is {inbox_address}
Today's date is {query_date}"""


class EmailTools:
    """The agent's ``search_emails`` / ``read_email`` over one task's inbox, keeping what the
    rubric needs (ids found by searches, ids read)."""

    def __init__(self, db: EmailDatabase, inbox: str, query_date: str, char_limit: int) -> None:
        self.db = db
        self.inbox = inbox
        self.query_date = _day(query_date, "query_date")
        self.char_limit = char_limit
        self.found_ids: list[str] = []
        self.read_ids: list[str] = []
        self.calls: Counter[str] = Counter()
        self.errors = 0

    @property
    def day_after(self) -> str:
        return str(self.query_date + dt.timedelta(days=1))

    def _cap(self, text: str) -> str:
        if len(text) <= self.char_limit:
            return text
        return text[: self.char_limit] + f" ... [cut at {self.char_limit} characters]"

    def _error(self, text: str) -> str:
        self.errors += 1
        return f"Error: {text}"

    def search_emails(
        self,
        keywords: Any = None,
        inbox_address: str | None = None,
        query_date: str | None = None,
        from_address: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        **unknown: Any,
    ) -> str:
        """The ``search_emails`` tool's answer (a JSON list, or ``Error: ...``)."""
        self.calls["search_emails"] += 1
        if unknown:
            return self._error(f"unknown argument(s) {sorted(unknown)}")
        if inbox_address and inbox_address.strip().lower() != self.inbox.lower():
            return self._error(f"you can search only the user's inbox, {self.inbox}")
        if isinstance(keywords, str):
            keywords = keywords.split()
        try:
            # Never past today: the later of the agent's date and the task's date is cut.
            before = self.day_after
            if query_date:
                before = min(before, str(_day(query_date, "query_date") + dt.timedelta(days=1)))
            if sent_before:
                before = min(before, str(_day(sent_before, "sent_before")))
            hits = self.db.search(
                self.inbox,
                list(keywords or []),
                from_address=from_address,
                sent_after=sent_after,
                sent_before=before,
            )
        except (ValueError, TypeError) as exc:
            return self._error(str(exc))
        except sqlite3.Error as exc:
            return self._error(f"search failed: {exc}")
        self.found_ids += [h["message_id"] for h in hits]
        return self._cap(json.dumps(hits))

    def read_email(self, message_id: Any = None, **unknown: Any) -> str:
        """The ``read_email`` tool's answer (the email as JSON, or ``Error: ...``)."""
        self.calls["read_email"] += 1
        if unknown:
            return self._error(f"unknown argument(s) {sorted(unknown)}")
        if not message_id:
            return self._error("give the message_id of the email to read")
        self.read_ids.append(str(message_id).strip())
        email = self.db.read(str(message_id), inbox=self.inbox, before=self.day_after)
        if email is None:
            return self._error(f"email (message_id = {message_id}) not found")
        return self._cap(json.dumps(email))


def _text_response(text: str) -> Any:
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    return ToolResponse(content=[TextBlock(type="text", text=text)])


def build_email_toolkit(tools: EmailTools) -> Any:
    """An AgentScope ``Toolkit`` with ``search_emails`` and ``read_email`` bound to ``tools``."""
    from agentscope.tool import Toolkit

    async def search_emails(**kwargs: Any) -> Any:
        return _text_response(tools.search_emails(**kwargs))

    async def read_email(**kwargs: Any) -> Any:
        return _text_response(tools.read_email(**kwargs))

    toolkit = Toolkit()
    toolkit.register_tool_function(search_emails, func_name="search_emails", json_schema=SEARCH_SCHEMA)
    toolkit.register_tool_function(read_email, func_name="read_email", json_schema=READ_SCHEMA)
    return toolkit


def _answer_model() -> Any:
    from pydantic import BaseModel, Field

    class AnswerModel(BaseModel):
        answer: str = Field(
            description=f"The answer to the question; '{I_DONT_KNOW}' if you could not find it."
        )
        sources: list[str] = Field(
            description="The message_id of each email the answer comes from (usually one); empty if you do not know."
        )

    return AnswerModel


# -- the workflow ----------------------------------------------------------------------------

ROW_COLUMNS = ("message_ids", "inbox_address", "query_date")


class EmailSearchWorkflow(Workflow):
    """``email_search_workflow``: see the module docstring.

    ``workflow_args``: ``max_turns`` (the agent's reasoning-acting iterations, default 10),
    ``tool_obs_char_limit`` (a tool's answer is cut after this many characters, default 2000),
    ``db_path`` (the mailbox; default: ``$DEFAULT_EMAIL_DB_PATH``). ``reward_fn_args``:
    ``llm_as_a_judge`` (default true).
    """

    is_async: ClassVar[bool] = True
    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = False
    registered_name: ClassVar[str] = "email_search_workflow"
    WORKFLOW_ARGS: ClassVar[tuple[str, ...]] = ("max_turns", "tool_obs_char_limit", "db_path")
    #: The reward's class: the config loader checks ``reward_fn_args`` against its arguments.
    default_reward_fn: ClassVar[type] = EmailSearchReward

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        for key in (format_args.prompt_key, format_args.response_key):
            if not isinstance(row.get(key), str) or not row[key].strip():
                return f"no text in column {key!r}"
        ids = row.get("message_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return "message_ids must be a list of message ids"
        if not isinstance(row.get("inbox_address"), str) or "@" not in row["inbox_address"]:
            return "inbox_address must be an email address"
        try:
            _day(row.get("query_date"), "query_date")
        except ValueError as exc:
            return str(exc)
        return None

    def reset(self, task: Task) -> None:
        self.task = task
        self.repeat_times = task.repeat_times
        args = dict(task.workflow_args or {})
        self.max_turns = positive_int(args.get("max_turns", 10), "max_turns")
        self.char_limit = positive_int(args.get("tool_obs_char_limit", 2000), "tool_obs_char_limit")
        self.db_path = args.get("db_path") or os.environ.get(DB_PATH_ENV)
        self.reward_fn = EmailSearchReward(**dict(task.reward_fn_args or {}))
        problem = self.row_problem(task.raw_task, task.format_args)
        if problem:
            raise ValueError(f"{self.registered_name}: task {task.index}: {problem}")
        row = task.raw_task
        self.question = task.task_desc
        self.truth = task.truth
        self.message_ids = list(row["message_ids"])
        self.inbox = row["inbox_address"].strip()
        self.query_date = str(_day(row["query_date"], "query_date"))

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(
            max_turns=self.max_turns, inbox_address=self.inbox, query_date=self.query_date
        )

    def database(self) -> EmailDatabase:
        if not self.db_path:
            raise EmailDatabaseError(
                f"{self.registered_name} needs the email database: set workflow_args.db_path or {DB_PATH_ENV} "
                "(`python -m trinity_agents.tasks email_search OUT_DIR` writes OUT_DIR/emails.db)"
            )
        return open_database(self.db_path)

    def run(self) -> list[Experience]:
        return run_blocking(self)

    def build_agent(self, tools: EmailTools) -> Any:
        self._chat_model = agentscope_chat_model(self.model, self.task)
        toolkit = build_email_toolkit(tools)
        return react_agent(
            "email_search_agent", self.system_prompt(), self._chat_model, toolkit, self.max_turns
        )

    async def run_async(self) -> list[Experience]:
        require_agentscope(self.registered_name)
        check_model_for_agents(self.model, self.registered_name, tools=True)
        tools = EmailTools(self.database(), self.inbox, self.query_date, self.char_limit)
        clear_history(self.model)
        agent = self.build_agent(tools)
        try:
            reply = await reply_or_none(agent, self.question, _answer_model())
        finally:
            # Closed on this event loop: run() ends its loop after the episode.
            await self._chat_model.client.close()
        metadata = reply.metadata if reply is not None and isinstance(reply.metadata, dict) else {}
        recorded = self.model.extract_experience_from_history(clear_history=True)
        if not recorded:
            return []
        rubric, judged = await self.score(metadata, tools, len(recorded))
        parts = self.reward_fn(rubric, self.max_turns)
        reward = parts["accuracy"] + parts["format"]
        info = {
            "answer": rubric.answer,
            "sources": rubric.sources,
            "reference_answer": self.truth,
            "reference_message_ids": self.message_ids,
            "answer_correct": rubric.answer_correct,
            "ever_found_right_email": rubric.ever_found_right_email,
            "ever_read_right_email": rubric.ever_read_right_email,
            "sources_correct": rubric.sources_correct,
            "actual_turns": len(recorded),
            "max_model_len_reached": reply is None,
            **judged,
        }
        metrics = {
            **parts,
            "actual_turns": float(len(recorded)),
            "answer_correct": float(rubric.answer_correct),
            "sources_correct": float(rubric.sources_correct),
            "search_calls": float(tools.calls["search_emails"]),
            "read_calls": float(tools.calls["read_email"]),
            "tool_errors": float(tools.errors),
            **{
                k: float(v)
                for k, v in judged.items()
                if k.startswith("judge_") and isinstance(v, (bool, int, float))
            },
        }
        steps = [(exp, {}) for exp in recorded]
        return finish_steps(steps, reward=reward, run=self.run_id_base, info=info, metrics=metrics)

    async def score(
        self, metadata: dict[str, Any], tools: EmailTools, turns: int
    ) -> tuple[Rubric, dict[str, Any]]:
        """The episode's :class:`Rubric` and what the judging says about itself."""
        answer = metadata.get("answer")
        sources = metadata.get("sources") or []
        if not isinstance(sources, list):
            sources = [sources]
        rubric = Rubric(
            answer=None if answer is None else str(answer),
            sources=[str(s).strip() for s in sources],
            num_turns=turns,
        )
        if self.message_ids:
            gold = self.message_ids[0]
            rubric.ever_found_right_email = gold in tools.found_ids
            rubric.ever_read_right_email = gold in tools.read_ids
            rubric.sources_correct = gold in rubric.sources
        judged: dict[str, Any] = {}
        if not rubric.attempted_answer:
            return rubric, judged
        if not self.reward_fn.llm_as_a_judge:
            rubric.answer_correct = answers_match(rubric.answer, self.truth)
            return rubric, judged
        judge = self.auxiliary_models[0] if self.auxiliary_models else None
        outcome = await judge_answer(judge, self.question, self.truth or "", rubric.answer or "")
        judged = {"judge_success": outcome.accept is not None, "judge_fallback": outcome.accept is None}
        if outcome.reply is not None:
            judged["judge_reply"] = outcome.reply
        if outcome.accept is None:
            count_fallback(outcome.failure or "error", outcome.detail)
            judged["judge_failure"] = outcome.failure
            rubric.answer_correct = answers_match(rubric.answer, self.truth)
        else:
            rubric.answer_correct = outcome.accept
        return rubric, judged


__all__ = [
    "DB_PATH_ENV",
    "JUDGE_FALLBACKS",
    "EmailDatabase",
    "EmailDatabaseError",
    "EmailSearchReward",
    "EmailSearchWorkflow",
    "EmailTools",
    "Rubric",
    "answers_match",
    "judge_answer",
    "open_database",
    "read_verdict",
]
