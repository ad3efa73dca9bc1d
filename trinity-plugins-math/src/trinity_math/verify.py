"""Answer equivalence with math-verify, bounded in time in any thread.

Every comparison goes through two stages:

1. :func:`trinity_math.guard.refusal_reason` looks at the answer's text alone (no evaluation)
   and refuses hostile ones at once: exponent towers (``9**9**9**9``, ``10^{10^{100}}``), huge
   numbers, deep nesting, overly long text. A refused answer is not equal to anything.
2. math-verify parses both sides and compares them, under one deadline for the whole
   comparison (``timeout_seconds``, default 1 s, fractions allowed).

The deadline is a ``SIGALRM`` interval timer, which only works in a main thread; math-verify's
own timeouts (``signal.alarm``: whole seconds, per step) are switched off. So:

* in the main thread we compare directly;
* elsewhere we send the comparison to a long-lived worker process (``python -m
  trinity_math.verify``), whose main thread can use the timer, and the caller waits with a
  deadline a little longer: a worker that does not answer in time (stuck in code a signal
  cannot interrupt) is killed, and a replacement is started at once.

Either way a pathological answer costs about ``timeout_seconds``, never a hung runner.

math_verify (and sympy) are imported on first use, not when this module is imported.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, NamedTuple

from trinity_math.guard import MAX_ANSWER_CHARS, refusal_reason

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 1.0
"""Bound on one whole comparison (both parses and the comparison itself)."""

# A word of two or more letters that is not a LaTeX command (``\frac``, ``\text``): its presence
# means the text is prose ("18 dollars", "The answer is 42") rather than a bare expression.
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_ANCHORS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")
# The worker gets this long to start (importing sympy takes a few seconds on a busy machine).
_WORKER_START_SECONDS = 120.0
# How much longer than its own deadline the caller waits for the worker's reply.
_WORKER_GRACE_SECONDS = 0.5
# Once the deadline has passed, the timer fires again this often, in case library code
# swallowed the first interruption.
_DEADLINE_REPEAT_SECONDS = 0.05


class Verdict(NamedTuple):
    """Outcome of one comparison.

    ``equal``; ``timed_out`` when the deadline cut it short; ``refused`` the reason the answer
    was refused before any evaluation (see :mod:`trinity_math.guard`), ``""`` when it was not.
    """

    equal: bool
    timed_out: bool = False
    refused: str = ""


class _DeadlineExceeded(BaseException):
    """Raised by the interval timer in the main thread; a BaseException so that the
    ``except Exception`` clauses of sympy and math-verify cannot swallow it."""


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_DeadlineExceeded` in the body once ``seconds`` have passed (main thread only).

    A timer set by someone else (pytest-timeout, say) is put back afterwards with what was left.
    """
    armed = True

    def on_alarm(signum: int, frame: object) -> None:
        if armed:
            raise _DeadlineExceeded

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(
        signal.ITIMER_REAL, max(seconds, 1e-3), _DEADLINE_REPEAT_SECONDS
    )
    started = time.monotonic()
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_interval)


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its own timeouts are off: here they are, on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


_prepared = False


def _prepare() -> None:
    """Import math-verify and run one comparison untimed, once per process.

    The first parse and comparison load grammars and sympy internals (a good part of a
    second); that cost must not count against the first answer's deadline.
    """
    global _prepared
    if _prepared:
        return
    _prepared = True
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
    import math_verify  # noqa: F401

    for answer, truth in (("\\frac{x}{2}+1", "0.5x+1"), ("(1,2]", "3/4"), ("2**10", "1024")):
        _compare(answer, truth, None)


def _int_timeout(seconds: float) -> int:
    # signal.alarm (math-verify's mechanism) only takes whole seconds.
    return max(1, math.ceil(seconds))


def _normalise_text(text: str) -> str:
    return " ".join(text.strip().rstrip(".").split()).casefold()


def parse_answer(text: str, timeout_seconds: float | None = 5) -> list:
    """math-verify's parse of a *bare* answer (a truth, ``<answer>`` or ``\\boxed{}`` content).

    Bare expressions are parsed as LaTeX math (wrapped in ``\\boxed{}``), so ``2x+1`` is
    ``2*x + 1`` and not the first number found; prose (``18 dollars``) and anchored text
    (``$...$``, ``\\boxed{...}``) go to math-verify unchanged. With a timeout (math-verify's
    own, per step) it must run in the main thread; ``None`` leaves timing to the caller.
    """
    from math_verify import parse

    text = text.strip()
    if not text:
        return []
    seconds = None if timeout_seconds is None else _int_timeout(timeout_seconds)
    if not any(a in text for a in _ANCHORS) and _PROSE_WORD.search(text) is None:
        parsed = parse("\\boxed{" + text + "}", parsing_timeout=seconds, raise_on_error=True)
        # Only the raw string came back (no sympy object): let math-verify's own extraction try.
        if len(parsed) > 1 or (parsed and not isinstance(parsed[0], str)):
            return parsed
    return parse(text, parsing_timeout=seconds, raise_on_error=True)


def _compare_here(answer: str, truth: str, timeout_seconds: float) -> Verdict:
    """The comparison, within ``timeout_seconds`` in all; runs in a main thread (ours or the worker's)."""
    _prepare()
    if not hasattr(signal, "setitimer"):  # not POSIX: math-verify's own per-step timeouts
        return _compare(answer, truth, _int_timeout(timeout_seconds))
    try:
        with _deadline(timeout_seconds):
            return _compare(answer, truth, None)
    except _DeadlineExceeded:
        return Verdict(False, timed_out=True)


def _compare(answer: str, truth: str, step_timeout: int | None) -> Verdict:
    """Parse both sides and compare them; ``step_timeout`` is math-verify's own (``None``: off)."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        gold = parse_answer(truth, step_timeout)
        pred = parse_answer(answer, step_timeout)
        if not gold:
            # Not math at all (``yes``, a name): compare the texts.
            return Verdict(bool(answer.strip()) and _normalise_text(answer) == _normalise_text(truth))
        if not pred:
            return Verdict(False)
        return Verdict(bool(verify(gold, pred, timeout_seconds=step_timeout, raise_on_error=True)))
    except TimeoutException:
        return Verdict(False, timed_out=True)
    except Exception:  # a parser/sympy error on model output is a wrong answer, not a crash
        logger.debug("math-verify failed on answer %.80r vs truth %.80r", answer, truth, exc_info=True)
        return Verdict(False)


class _Worker:
    """One ``python -m trinity_math.verify`` process answering JSON lines, one call at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False  # it said "ready" (math-verify imported and warmed up)
        self._pid = 0  # the parent pid that started it: a forked child must start its own

    def _spawn(self) -> None:
        """Start a worker without waiting for it: it gets ready while nobody needs it."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "trinity_math.verify"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._ready = False
        self._pid = os.getpid()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        if self._ready:
            return
        if _readline(self._proc.stdout, _WORKER_START_SECONDS) != b"ready\n":
            self._kill()
            raise RuntimeError(
                "trinity_math could not start its math-verify worker process "
                f"({sys.executable} -m trinity_math.verify); is trinity-plugins-math installed "
                "in this interpreter?"
            )
        self._ready = True

    def close(self) -> None:
        """Let the worker finish (end of its input), killing it if it does not."""
        with self._lock:
            if self._proc is not None and self._pid == os.getpid():
                try:
                    assert self._proc.stdin is not None
                    self._proc.stdin.close()
                    self._proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    self._proc.kill()
                    self._proc.wait()
                self._release()
            self._proc = None

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._release()
            self._proc = None

    def _release(self) -> None:
        assert self._proc is not None
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()

    def _ensure_started(self) -> None:
        if self._proc is None or self._proc.poll() is not None or self._pid != os.getpid():
            self._spawn()

    def start(self) -> None:
        """Start the worker if none runs for this process, without waiting for it."""
        with self._lock:
            self._ensure_started()

    def compare(self, answer: str, truth: str, timeout_seconds: float) -> Verdict:
        with self._lock:
            self._ensure_started()
            self._wait_ready()
            assert self._proc is not None and self._proc.stdin is not None
            request = json.dumps({"answer": answer, "truth": truth, "timeout": timeout_seconds})
            try:
                self._proc.stdin.write(request.encode() + b"\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                self._kill()
                raise RuntimeError(
                    "the math-verify worker process died; it is restarted on the next call"
                ) from None
            # The worker keeps its own deadline; this one only catches work it cannot interrupt.
            line = _readline(self._proc.stdout, timeout_seconds + _WORKER_GRACE_SECONDS)
            if line is None:
                crashed = self._proc.poll() is not None
                logger.warning(
                    "math-verify worker %s; restarting it", "crashed" if crashed else "did not answer in time"
                )
                self._kill()
                self._spawn()
                return Verdict(False, timed_out=True)
            reply = json.loads(line)
            return Verdict(reply["equal"], reply["timed_out"])


def _readline(stream: IO[bytes] | None, timeout: float) -> bytes | None:
    """One line from the worker, or ``None`` if none arrives within ``timeout`` seconds."""
    assert stream is not None
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        return None
    line = stream.readline()
    return line or None


_worker = _Worker()
atexit.register(_worker.close)


def _uses_worker() -> bool:
    """Whether comparisons from this thread go to the worker process (see the module docstring)."""
    return threading.current_thread() is not threading.main_thread() and os.name == "posix"


def prestart() -> None:
    """Start the worker process now, without waiting, if this thread's comparisons would use it.

    Its start (importing sympy and math-verify: about a second) then overlaps whatever comes
    before the first comparison that needs it (a rollout's generation) instead of delaying it."""
    if _uses_worker():
        _worker.start()


def math_equal(
    answer: str,
    truth: str,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    max_chars: int = MAX_ANSWER_CHARS,
) -> Verdict:
    """Whether ``answer`` equals ``truth`` mathematically (math-verify), within ``timeout_seconds``.

    Both are bare answers: the caller extracts them first (``<answer>`` content, the last
    ``\\boxed{}``, a GSM8K ``#### N``). A hostile answer (or one longer than ``max_chars``) is
    refused before any evaluation: ``Verdict(False, refused=reason)``. The truth is trusted.
    Safe to call from any thread.
    """
    reason = refusal_reason(answer, max_chars)
    if reason is not None:
        return Verdict(False, refused=reason)
    plain = _plain_numbers(answer, truth)
    if plain is not None:
        # Both sides are plain integers: equal exactly when their values are, as math-verify
        # says, without parsing (or a worker process) for the most common case.
        return Verdict(plain[0] == plain[1])
    # Off POSIX, math-verify times out with a helper process, which works in any thread.
    if not _uses_worker():
        return _compare_here(answer, truth, timeout_seconds)
    return _worker.compare(answer, truth, timeout_seconds)


# A plain integer: optional sign and digits, nothing else (no fraction: math-verify compares
# decimals with a tolerance, so "0.1" equals "0.10000001" there; no separators, exponents,
# units or LaTeX). Such pairs are equal exactly when their values are, as math-verify says.
_PLAIN_INTEGER = re.compile(r"[+-]?\d{1,40}")


def _plain_numbers(answer: str, truth: str) -> tuple[int, int] | None:
    """Both sides' values when both are plain integers."""
    a, t = answer.strip(), truth.strip()
    if not (_PLAIN_INTEGER.fullmatch(a) and _PLAIN_INTEGER.fullmatch(t)):
        return None
    return int(a), int(t)


def _serve() -> None:
    """Worker loop: one JSON request per stdin line, one JSON verdict per stdout line."""
    # Replies go to the real stdout; anything a library prints goes to stderr instead, so it
    # cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _prepare()  # import and warm up before saying ready, so the first call is fast

    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        verdict = _compare_here(request["answer"], request["truth"], request["timeout"])
        out.write(json.dumps({"equal": verdict.equal, "timed_out": verdict.timed_out}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
