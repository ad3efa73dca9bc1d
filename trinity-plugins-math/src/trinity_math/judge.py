"""Asking a judge model for scores: the call (with a timeout and retries), reading its reply,
and a counted, logged fallback when it fails.

Used by ``math_ruler_workflow``, ``math_trainable_ruler_workflow`` and
``rubric_judge_workflow`` (:mod:`trinity_math.ruler`, :mod:`trinity_math.rubric`).

A judge is anything with ``ask(messages, **sampling) -> str``:

* :class:`ModelJudge`: a model of the job, e.g. the first of ``explorer.auxiliary_models``
  (the :class:`~trinity.explorer.model_wrapper.ModelWrapper` the workflow is given, which serves
  the same engine as its OpenAI API), called through ``chat``;
* :class:`EndpointJudge`: an OpenAI-compatible server (``POST {base_url}/chat/completions``).

:func:`ask_judge` runs one judging: each call is bounded by ``timeout`` seconds and a call that
times out or raises is retried ``retries`` times; the reply is then read by a parser
(:func:`parse_scores` for RULER's list of scores, :func:`parse_rating` for a rubric rating).
A reply that cannot be read is not retried (a judge sampling at temperature 0 would say the same
again). It returns a :class:`Verdict`: the scores, or why there are none, one of
:data:`FAILURES` (``timeout``, ``error``, ``refused``, ``malformed``). The workflows then give
the experience their ``fallback_reward`` and say so in its metrics (:meth:`Verdict.metrics`:
``judge_success`` and one 0/1 metric per failure kind, which the explorer averages into the
share of the step's rollouts, e.g. ``rollout/judge_malformed``) and ``info["judge_failure"]``;
:data:`FALLBACKS` counts them per process and logs them (the first few of each kind in full, then
every hundredth).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: Why a judging gave no scores.
FAILURES = ("timeout", "error", "refused", "malformed")

#: Defaults of the workflows' ``judge_timeout`` (seconds per call) and ``judge_retries``.
DEFAULT_TIMEOUT = 600.0
DEFAULT_RETRIES = 1


class JudgeFailure(Exception):
    """A judging that gave no scores: ``reason`` is one of :data:`FAILURES`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in FAILURES, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Judge(Protocol):
    """What the judge workflows call."""

    def ask(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        """The judge's reply to ``messages``."""
        ...


@dataclass
class ModelJudge:
    """A model of the job as the judge: ``model.chat(messages, n=1, **sampling)``, the reply's
    text. ``model`` is an auxiliary model's wrapper (or the policy itself)."""

    model: Any

    @property
    def name(self) -> str:
        return str(getattr(self.model, "model_path", None) or getattr(self.model, "name", "judge"))

    def ask(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        replies = self.model.chat(messages, **{**sampling, "n": 1})
        if not replies:
            raise RuntimeError(f"judge {self.name!r} returned no reply")
        return replies[0].response_text or ""


@dataclass
class EndpointJudge:
    """A judge behind an OpenAI-compatible API: ``POST {base_url}/chat/completions`` with
    ``model`` and the messages; the first choice's content is the reply. ``timeout`` bounds
    the HTTP request (seconds)."""

    base_url: str
    model: str
    api_key: str = ""
    timeout: float | None = DEFAULT_TIMEOUT

    @property
    def name(self) -> str:
        return f"{self.model} at {self.base_url}"

    def ask(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "stream": False, **sampling})
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read().decode())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:200]
            raise RuntimeError(f"{url} answered HTTP {exc.code}: {text}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):  # timed out while connecting
                raise TimeoutError(f"{url} did not answer within {self.timeout} s") from None
            raise RuntimeError(f"{url} cannot be reached: {exc.reason}") from None
        try:
            return payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(
                f"{url} answered without choices[0].message.content: {str(payload)[:200]}"
            ) from None


def model_judge(auxiliary_models: Sequence[Any] | None, workflow: str) -> ModelJudge:
    """The first auxiliary model as a :class:`ModelJudge`; one clear error without one."""
    if not auxiliary_models:
        raise ValueError(
            f"{workflow} needs a judge model: configure one in explorer.auxiliary_models (the first "
            "auxiliary model is the judge)"
        )
    return ModelJudge(auxiliary_models[0])


# -- one judging --------------------------------------------------------------------------------


@dataclass
class Verdict:
    """The outcome of one judging: ``scores`` (``None`` when it failed), the ``reply`` read,
    the failure's ``reason`` (one of :data:`FAILURES`) and ``detail``, and the calls made."""

    scores: list[float] | None
    reply: str | None = None
    reason: str | None = None
    detail: str = ""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.scores is not None

    def metrics(self) -> dict[str, float]:
        """``judge_success`` and ``judge_<reason>`` for every reason (0/1), ``judge_attempts``."""
        out = {"judge_success": float(self.ok), "judge_attempts": float(self.attempts)}
        out.update({f"judge_{reason}": float(self.reason == reason) for reason in FAILURES})
        return out


def _call(fn: Callable[[], str], timeout: float | None) -> str:
    """``fn()`` in a daemon thread, waiting at most ``timeout`` seconds. A call that outlives it
    cannot be stopped from Python: it is abandoned (a daemon never blocks exit)."""
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["reply"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="trinity-judge", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no reply within {timeout:g} s (judge_timeout)")
    if "error" in box:
        raise box["error"]
    return box["reply"]


def ask_judge(
    judge: Judge,
    messages: list[dict[str, Any]],
    parse: Callable[[str], list[float]],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
    **sampling: Any,
) -> Verdict:
    """Ask ``judge`` and read its reply with ``parse`` (which raises :class:`JudgeFailure`).

    Each call may take ``timeout`` seconds; a call that times out or raises is retried up to
    ``retries`` times. Never raises: a failure is the returned :class:`Verdict`'s ``reason``.
    """
    reason, detail = "error", ""
    attempts = 0
    for attempts in range(1, retries + 2):
        try:
            reply = _call(lambda: judge.ask(messages, **sampling), timeout)
        except TimeoutError as exc:
            reason, detail = "timeout", str(exc)
            continue
        except Exception as exc:
            reason, detail = "error", f"{type(exc).__name__}: {exc}"
            continue
        try:
            return Verdict(parse(reply), reply=reply, attempts=attempts)
        except JudgeFailure as failure:
            return Verdict(None, reply=reply, reason=failure.reason, detail=failure.detail, attempts=attempts)
    return Verdict(None, reason=reason, detail=detail, attempts=attempts)


# -- reading replies ------------------------------------------------------------------------------

# Phrases of a judge declining to judge, looked for only when no score could be read.
_REFUSAL = re.compile(
    r"\b(i\s*(?:cannot|can't|can not|won't|will not|am unable to|'m unable to|am not able to)"
    r"|i'm sorry|i am sorry|as an ai\b|unable to (?:help|assist|evaluate|comply|provide))",
    re.IGNORECASE,
)
_LIST = re.compile(r"\[([^\[\]]*)\]")
_FENCED = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_OBJECT = re.compile(r"\{[^{}]*\}")
_RATING = re.compile(r"[\"']?rating[\"']?\s*[:=]\s*[\"']?(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def _snippet(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _number(value: Any) -> float | None:
    """A finite number from a JSON value or numeric string; ``None`` for anything else (booleans
    included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip().rstrip("%") if value.strip() else "x")
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _list_items(inner: str) -> list[Any] | None:
    """The items of ``[inner]`` as JSON or a Python literal; ``None`` when it is neither."""
    for load in (json.loads, ast.literal_eval):
        try:
            items = load(f"[{inner}]")
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return list(items)
    return None


def _no_scores(text: str, detail: str) -> JudgeFailure:
    if _REFUSAL.search(text):
        return JudgeFailure("refused", f"the judge declined: {_snippet(text)}")
    return JudgeFailure("malformed", f"{detail}: {_snippet(text)}")


def parse_scores(text: str | None, n: int) -> list[float]:
    """RULER's scores: the last bracketed list in ``text`` of exactly ``n`` numbers, each
    clipped to ``[0, 1]`` (as Trinity-RFT reads them).

    Lists the judge wrote after the scores (a footnote ``[1]``, a wrong count) are passed over
    for an earlier one that fits; JSON, Python literals, numeric strings and code fences all
    read. Raises :class:`JudgeFailure`: ``refused`` when no list fits and the reply declines,
    else ``malformed`` (no list, the wrong count, an item that is not a finite number).
    """
    if not text or not text.strip():
        raise JudgeFailure("malformed", "empty reply")
    problem = f"no list of {n} scores"
    for match in reversed(list(_LIST.finditer(text))):
        items = _list_items(match.group(1))
        if items is None:
            problem = f"a list that is not JSON ({_snippet(match.group(0), 40)})"
            continue
        if len(items) != n:
            problem = f"a list of {len(items)} scores, {n} expected"
            continue
        numbers = [_number(item) for item in items]
        if any(x is None for x in numbers):
            problem = f"a score that is not a number ({_snippet(match.group(0), 40)})"
            continue
        return [min(1.0, max(0.0, x)) for x in numbers]  # type: ignore[type-var]
    raise _no_scores(text, problem)


def parse_rating(text: str | None, low: float = 1.0, high: float = 10.0) -> float:
    """A rubric judge's ``"rating"`` (a number in ``[low, high]``) from a JSON object in
    ``text``: in a code fence (as the prompt asks), else anywhere in the reply, else a bare
    ``rating: 7``. Trailing text, numeric strings and single-quoted (Python) objects read.
    Raises :class:`JudgeFailure` (``refused`` / ``malformed``), also for a rating out of range.
    """
    if not text or not text.strip():
        raise JudgeFailure("malformed", "empty reply")
    candidates = [m.group(1) for m in _FENCED.finditer(text)] + [m.group(0) for m in _OBJECT.finditer(text)]
    problem = "no JSON object with a rating"
    for candidate in candidates:
        found = _OBJECT.search(candidate)
        if found is None:
            continue
        obj = None
        for load in (json.loads, ast.literal_eval):
            try:
                obj = load(found.group(0))
                break
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
        if not isinstance(obj, dict):
            continue
        key = next((k for k in obj if str(k).strip().lower() == "rating"), None)
        if key is None:
            continue
        rating = _number(obj[key])
        if rating is None:
            problem = f"a rating that is not a number ({obj[key]!r})"
            continue
        if not low <= rating <= high:
            raise JudgeFailure("malformed", f"rating {rating:g} is outside {low:g}..{high:g}")
        return rating
    bare = _RATING.search(text)
    if bare is not None:
        rating = float(bare.group(1))
        if not low <= rating <= high:
            raise JudgeFailure("malformed", f"rating {rating:g} is outside {low:g}..{high:g}")
        return rating
    raise _no_scores(text, problem)


# -- counting and logging fallbacks -----------------------------------------------------------------


@dataclass
class FallbackLog:
    """Counts the judgings that fell back, per workflow and reason, and logs them: the first
    ``full`` of each (workflow, reason) with the judge's reply, then one line every ``every``."""

    full: int = 5
    every: int = 100
    counts: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, workflow: str, where: str, verdict: Verdict, fallback: float) -> None:
        """Count ``verdict`` (a failed one) and log it when due."""
        reason = verdict.reason or "error"
        with self._lock:
            self.counts[(workflow, reason)] += 1
            count = self.counts[(workflow, reason)]
        if count <= self.full or count % self.every == 0:
            logger.warning(
                "%s: the judge failed on %s (%s, %s; %d call(s)); reward %g instead (judge failure #%d "
                "of this kind in this process)",
                workflow,
                where,
                reason,
                verdict.detail,
                verdict.attempts,
                fallback,
                count,
            )

    def total(self, workflow: str | None = None) -> int:
        """Fallbacks counted so far (of ``workflow``, or all)."""
        with self._lock:
            return sum(c for (w, _), c in self.counts.items() if workflow is None or w == workflow)


#: The process's fallback counts (see :class:`FallbackLog`).
FALLBACKS = FallbackLog()


def workflow_args_of(workflow_args: dict[str, Any], valid: Sequence[str], workflow: str) -> dict[str, Any]:
    """``workflow_args`` checked against ``valid``: an unknown key is one clear error."""
    unknown = sorted(set(workflow_args) - set(valid))
    if unknown:
        raise ValueError(f"{workflow}: unknown workflow_args {unknown}; valid: {list(valid)}")
    return dict(workflow_args)


def judge_settings(args: dict[str, Any], workflow: str) -> tuple[float | None, int, float]:
    """``judge_timeout`` (seconds, ``None``: none), ``judge_retries`` and ``fallback_reward``
    from checked ``workflow_args``."""
    timeout = args.get("judge_timeout", DEFAULT_TIMEOUT)
    if timeout is not None:
        timeout = float(timeout)
        if timeout <= 0:
            raise ValueError(f"{workflow}: workflow_args.judge_timeout must be > 0 seconds, got {timeout:g}")
    retries = int(args.get("judge_retries", DEFAULT_RETRIES))
    if retries < 0:
        raise ValueError(f"{workflow}: workflow_args.judge_retries must be >= 0, got {retries}")
    fallback = float(args.get("fallback_reward", 0.0))
    if not math.isfinite(fallback):
        raise ValueError(f"{workflow}: workflow_args.fallback_reward must be a finite number, got {fallback}")
    return timeout, retries, fallback
