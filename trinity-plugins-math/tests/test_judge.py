"""trinity_math.judge: reading judges' replies (valid, malformed, refusals), the call's timeout
and retries (a judge double that sleeps, a real HTTP endpoint), and the counted fallback log."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trinity_math.judge import (
    FAILURES,
    EndpointJudge,
    FallbackLog,
    JudgeFailure,
    Verdict,
    ask_judge,
    judge_settings,
    parse_rating,
    parse_scores,
)

# -- RULER's list of scores ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "n", "scores"),
    [
        ("Solution 1 is right, 2 is not.\n[0.9, 0.1]", 2, [0.9, 0.1]),
        ("```json\n[0.25, 0.75, 1]\n```", 3, [0.25, 0.75, 1.0]),
        ('{"scores": [0.3, 0.7]}', 2, [0.3, 0.7]),
        # text after the list, and a footnote list of the wrong length after it
        ("[0.5, 0.25] are my scores, see [1].", 2, [0.5, 0.25]),
        # a draft and a final list: the last one that fits
        ("first [0.1, 0.1], on reflection [0.8, 0.2]", 2, [0.8, 0.2]),
        # Python literals, numeric strings, clipping to [0, 1]
        ("['0.5', 1.5, -0.2]", 3, [0.5, 1.0, 0.0]),
        ("[1, 0]", 2, [1.0, 0.0]),
    ],
)
def test_scores_that_read(reply, n, scores):
    assert parse_scores(reply, n) == pytest.approx(scores)


@pytest.mark.parametrize(
    ("reply", "n", "reason", "detail"),
    [
        ("", 2, "malformed", "empty reply"),
        (None, 2, "malformed", "empty reply"),
        ("Both look fine to me.", 2, "malformed", "no list of 2 scores"),
        ("[0.1, 0.2, 0.3]", 2, "malformed", "a list of 3 scores, 2 expected"),
        ("[high, low]", 2, "malformed", "not JSON"),
        ("[true, false]", 2, "malformed", "not a number"),
        ("[NaN, 1]", 2, "malformed", "not a number"),
        ('["good", "bad"]', 2, "malformed", "not a number"),
        ("I'm sorry, but I can't evaluate these solutions.", 2, "refused", "declined"),
        ("As an AI, I am unable to judge this.", 3, "refused", "declined"),
    ],
)
def test_scores_that_do_not_read(reply, n, reason, detail):
    with pytest.raises(JudgeFailure) as info:
        parse_scores(reply, n)
    assert info.value.reason == reason and detail in info.value.detail


def test_a_refusal_that_still_gives_scores_is_read():
    assert parse_scores("I can't be sure, but: [0.4, 0.6]", 2) == [0.4, 0.6]


# -- a rubric judge's rating -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "rating"),
    [
        ('```json\n{\n"rating": 7\n}```', 7.0),
        ('```\n{"rating": 3}\n```\nIt misses two rubrics.', 3.0),
        ('Here it is: {"rating": 8} - good overall.', 8.0),
        ("{'rating': '9'}", 9.0),
        ('{"Rating": 10, "why": "all rubrics met"}', 10.0),
        ("Rating: 6", 6.0),
    ],
)
def test_ratings_that_read(reply, rating):
    assert parse_rating(reply) == rating


@pytest.mark.parametrize(
    ("reply", "reason", "detail"),
    [
        ("", "malformed", "empty reply"),
        ('```json\n{"rating": 11}\n```', "malformed", "rating 11 is outside 1..10"),
        ('{"rating": 0}', "malformed", "outside"),
        ('{"rating": "excellent"}', "malformed", "not a number"),
        ('```json\n{"score": 7}\n```', "malformed", "no JSON object with a rating"),
        ("```json\n{rating: seven\n```", "malformed", "no JSON object with a rating"),
        ("I cannot rate medical advice.", "refused", "declined"),
    ],
)
def test_ratings_that_do_not_read(reply, reason, detail):
    with pytest.raises(JudgeFailure) as info:
        parse_rating(reply)
    assert info.value.reason == reason and detail in info.value.detail


# -- the call: timeout, retries, errors --------------------------------------------------------


class Judge:
    """A judge double: replies from a list (an exception is raised, a float is a sleep first)."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls: list[dict] = []

    def ask(self, messages, **sampling):
        self.calls.append(sampling)
        reply = self.replies[min(len(self.calls), len(self.replies)) - 1]
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, tuple):
            time.sleep(reply[0])
            return reply[1]
        return reply


MESSAGES = [{"role": "user", "content": "judge"}]


def test_a_judge_that_sleeps_times_out_and_is_retried():
    judge = Judge((5.0, "[1, 1]"))
    start = time.monotonic()
    verdict = ask_judge(judge, MESSAGES, lambda t: parse_scores(t, 2), timeout=0.2, retries=1)
    assert time.monotonic() - start < 2.0  # not the 10 s the judge would take
    assert not verdict.ok and verdict.reason == "timeout" and verdict.attempts == 2
    assert "no reply within 0.2 s (judge_timeout)" in verdict.detail
    assert len(judge.calls) == 2


def test_a_slow_then_quick_judge_succeeds_on_the_retry():
    judge = Judge((5.0, "[0, 0]"), "[0.2, 0.8]")
    verdict = ask_judge(judge, MESSAGES, lambda t: parse_scores(t, 2), timeout=0.2, retries=2)
    assert verdict.ok and verdict.scores == [0.2, 0.8] and verdict.attempts == 2
    assert verdict.metrics() == {
        "judge_success": 1.0,
        "judge_attempts": 2.0,
        **{f"judge_{r}": 0.0 for r in FAILURES},
    }


def test_errors_are_retried_then_reported():
    judge = Judge(ConnectionError("refused"), ConnectionError("refused again"))
    verdict = ask_judge(judge, MESSAGES, lambda t: parse_scores(t, 2), timeout=1.0, retries=1)
    assert verdict.reason == "error" and "ConnectionError: refused again" in verdict.detail
    assert verdict.metrics()["judge_error"] == 1.0 and verdict.metrics()["judge_success"] == 0.0


def test_an_unreadable_reply_is_not_retried():
    # At temperature 0 a judge would say the same again.
    judge = Judge("no idea", "[0.5, 0.5]")
    verdict = ask_judge(judge, MESSAGES, lambda t: parse_scores(t, 2), retries=3, temperature=0.0)
    assert verdict.reason == "malformed" and verdict.reply == "no idea" and len(judge.calls) == 1
    assert judge.calls == [{"temperature": 0.0}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"judge_timeout": 0}, "judge_timeout must be > 0 seconds"),
        ({"judge_retries": -1}, "judge_retries must be >= 0"),
        ({"fallback_reward": float("nan")}, "fallback_reward must be a finite number"),
    ],
)
def test_bad_judge_settings_are_one_line(args, message):
    with pytest.raises(ValueError, match=message):
        judge_settings(args, "math_ruler_workflow")
    assert judge_settings({}, "w") == (600.0, 1, 0.0)
    assert judge_settings({"judge_timeout": None}, "w")[0] is None


# -- an OpenAI-compatible endpoint -------------------------------------------------------------


@pytest.fixture
def endpoint():
    """A local OpenAI-compatible server: replies with ``replies[model]`` (a float: sleep that
    long first; an int: that HTTP status), and records the requests."""
    state: dict = {"replies": {}, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append((self.path, self.headers.get("Authorization"), body))
            reply = state["replies"][body["model"]]
            if isinstance(reply, float):
                time.sleep(reply)
                reply = "[1, 1]"
            if isinstance(reply, int):
                self.send_response(reply)
                self.end_headers()
                self.wfile.write(b"overloaded")
                return
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def test_an_endpoint_judge_over_http(endpoint):
    endpoint["replies"].update({"good": "[0.1, 0.9]", "busy": 503, "slow": 3.0})
    judge = EndpointJudge(endpoint["url"], "good", api_key="sk-test", timeout=2.0)
    verdict = ask_judge(judge, MESSAGES, lambda t: parse_scores(t, 2), temperature=0.0)
    assert verdict.scores == [0.1, 0.9]
    path, auth, body = endpoint["requests"][-1]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body == {"model": "good", "messages": MESSAGES, "stream": False, "temperature": 0.0}

    busy = ask_judge(EndpointJudge(endpoint["url"], "busy"), MESSAGES, lambda t: [1.0], retries=1)
    assert busy.reason == "error" and "answered HTTP 503: overloaded" in busy.detail and busy.attempts == 2

    slow = ask_judge(
        EndpointJudge(endpoint["url"], "slow", timeout=0.3), MESSAGES, lambda t: [1.0], retries=0
    )
    assert slow.reason == "timeout"

    gone = ask_judge(
        EndpointJudge("http://127.0.0.1:9/v1", "x", timeout=1.0), MESSAGES, lambda t: [1.0], retries=0
    )
    assert gone.reason == "error" and "cannot be reached" in gone.detail


# -- counting and logging ----------------------------------------------------------------------


def test_fallbacks_are_counted_and_logged_first_then_every_hundredth(caplog):
    log = FallbackLog(full=2, every=5)
    verdict = Verdict(None, reason="malformed", detail="no list of 2 scores: 'x'")
    with caplog.at_level(logging.WARNING, logger="trinity_math.judge"):
        for i in range(10):
            log.record("math_ruler_workflow", f"task {i}", verdict, 0.0)
        log.record("rubric_judge_workflow", "task 0", Verdict(None, reason="timeout", detail="late"), 0.5)
    assert log.total() == 11 and log.total("math_ruler_workflow") == 10
    lines = [r.getMessage() for r in caplog.records]
    # the first two of the kind, then the 5th and the 10th; the rubric one is a kind of its own
    assert len(lines) == 5
    assert lines[0].startswith(
        "math_ruler_workflow: the judge failed on task 0 (malformed, no list of 2 scores"
    )
    assert "reward 0 instead (judge failure #1 of this kind in this process)" in lines[0]
    assert "#5 of this kind" in lines[2] and "#10 of this kind" in lines[3]
    assert (
        "rubric_judge_workflow: the judge failed on task 0 (timeout, late; 1 call(s)); reward 0.5" in lines[4]
    )
