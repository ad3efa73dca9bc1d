"""Answer equivalence with math-verify, bounded in wall time in any thread and under any load.

Every comparison goes through two stages:

1. :func:`trinity_math.guard.refusal_reason` looks at the answer's text alone (no evaluation)
   and refuses hostile ones at once: exponent towers (``9**9**9**9``, ``10^{10^{100}}``), huge
   numbers, deep nesting, overly long text. A refused answer is not equal to anything.
2. math-verify parses both sides and compares them in a *verifier process*, under one deadline
   for the whole call (``timeout_seconds``, default 1 s, fractions allowed), counted from the
   moment the call starts (the refusal check, waiting for a free verifier and the comparison
   all count).

Verifier processes (``python -m trinity_math.verify``, :data:`VERIFIER_PROCESSES` of them per
process that scores, started on first use or by :func:`prestart`) answer one comparison at a
time. Inside one, an interval timer (``SIGALRM``) interrupts a comparison a little before the
deadline, and it answers "timed out". A verifier that has not answered when the deadline comes
(stuck in work no signal can interrupt: big-integer arithmetic in C, a regex) is killed and
replaced, and the call returns at once: the deadline holds by construction, whatever the load
and in every thread (signals alone would only work in a main thread, and not in C code). The
other verifier is ready meanwhile, so a replacement's start (about a second: importing sympy)
delays nobody; a call that finds none free before its deadline times out too. A timed-out call
is not equal (the rewards score it 0 and count it). The only wait outside the deadline is the
very first start of the verifiers in a process (the math workflows :func:`prestart` them while
the model generates).

math-verify's own timeouts (``signal.alarm``: whole seconds, per step, main thread only) are
switched off. Off POSIX, comparisons run in the calling thread under those instead.

math_verify (and sympy) are imported on first use, not when this module is imported.
"""

from __future__ import annotations

import atexit
import contextlib
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
VERIFIER_PROCESSES = 2
"""Verifier processes per scoring process: one answers while another (killed on an overrun)
is replaced."""
# The first verifier gets this long to start (importing sympy takes a few seconds on a busy
# machine); this wait happens once per process and is not part of any call's deadline.
_WORKER_START_SECONDS = 120.0
# A verifier's own timer fires this much before the caller's deadline (at most 20% of the
# time left), so that it normally answers "timed out" itself and is not killed.
_WORKER_MARGIN_SECONDS = 0.1
# How often a caller waiting for a free or starting verifier looks again.
_POLL_SECONDS = 0.01
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


class _Verifier:
    """One ``python -m trinity_math.verify`` process answering JSON lines, one call at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            _verifier_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.ready = False  # it said "ready" (math-verify imported and warmed up)
        self.busy = False
        self.dead = False

    def check_ready(self) -> bool:
        """Whether it is ready, without waiting (reads its "ready" line once it is there)."""
        if self.ready or self.dead:
            return self.ready
        if _readline(self.proc.stdout, 0) is not None:
            self.ready = True
        elif self.proc.poll() is not None:
            self.dead = True
        return self.ready

    def kill(self) -> None:
        """Kill it now; it is reaped in the background (a caller never waits for that)."""
        self.dead = True
        with contextlib.suppress(OSError):
            self.proc.kill()
        threading.Thread(target=self._reap, name="trinity-math-reap", daemon=True).start()

    def _reap(self) -> None:
        self.proc.wait()
        self._close_pipes()

    def close(self) -> None:
        """Let it finish (end of its input), killing it if it does not."""
        self.dead = True
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _verifier_command() -> list[str]:
    """How a verifier process is started: this interpreter, ``-m trinity_math.verify``."""
    return [sys.executable, "-m", "trinity_math.verify"]


class _Verifiers:
    """The :data:`VERIFIER_PROCESSES` verifier processes of this process, shared by its threads."""

    def __init__(self, size: int = VERIFIER_PROCESSES) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._procs: list[_Verifier] = []
        self._pid = 0  # the pid that started them: a forked child starts its own
        self._started_once = False  # one has been ready: later starts never delay a call

    # -- pool management (under self._cond) -------------------------------------------------
    def _fill(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's verifiers are not ours
            self._procs, self._pid, self._started_once = [], os.getpid(), False
        self._procs = [v for v in self._procs if not v.dead]
        while len(self._procs) < self.size:
            self._procs.append(_Verifier())

    def _free(self) -> _Verifier | None:
        """A ready, idle verifier, marked busy; replaces dead ones."""
        for verifier in self._procs:
            if not verifier.busy and verifier.check_ready():
                verifier.busy = True
                self._started_once = True
                return verifier
        if any(v.dead for v in self._procs):
            self._fill()
        return None

    def _wait_first_start(self) -> None:
        """Once per process: wait for the first verifier to be ready (not part of a deadline)."""
        give_up = time.monotonic() + _WORKER_START_SECONDS
        while not self._started_once:
            self._fill()
            if any(v.check_ready() for v in self._procs):
                self._started_once = True
                return
            if all(v.dead for v in self._procs) or time.monotonic() > give_up:
                for verifier in self._procs:
                    verifier.kill()
                self._procs = []
                raise RuntimeError(
                    "trinity_math could not start its math-verify verifier process "
                    f"({' '.join(_verifier_command())}) within {_WORKER_START_SECONDS:.0f} s; is "
                    "trinity-plugins-math installed in this interpreter?"
                )
            self._cond.wait(_POLL_SECONDS)

    def _acquire(self, deadline: float) -> _Verifier | None:
        with self._cond:
            self._fill()
            while True:
                verifier = self._free()
                if verifier is not None:
                    return verifier
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, _POLL_SECONDS))

    def _release(self, verifier: _Verifier) -> None:
        with self._cond:
            verifier.busy = False
            self._cond.notify()

    def _retire(self, verifier: _Verifier) -> None:
        """Kill a verifier that overran or died, and start its replacement."""
        verifier.kill()
        with self._cond:
            self._fill()
            self._cond.notify()

    # -- public ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the verifiers if none run for this process, without waiting for them."""
        with self._cond:
            self._fill()

    def close(self) -> None:
        """Stop every verifier (they are started again on the next use)."""
        with self._cond:
            if self._pid == os.getpid():
                for verifier in self._procs:
                    verifier.close()
            self._procs, self._started_once = [], False

    @property
    def processes(self) -> list[subprocess.Popen]:
        """The running verifier processes (for tests and diagnostics)."""
        with self._cond:
            return [v.proc for v in self._procs if not v.dead]

    def compare(self, answer: str, truth: str, timeout_seconds: float) -> Verdict:
        """The comparison in a verifier process; returns within ``timeout_seconds`` (plus a few
        milliseconds), after the first start of the verifiers in this process."""
        with self._cond:
            self._wait_first_start()
        deadline = time.monotonic() + timeout_seconds
        verifier = self._acquire(deadline)
        if verifier is None:
            logger.warning(
                "no math-verify verifier process was free within %.3g s (all busy or restarting)",
                timeout_seconds,
            )
            return Verdict(False, timed_out=True)
        left = deadline - time.monotonic()
        own = max(1e-3, left - min(_WORKER_MARGIN_SECONDS, 0.2 * left))
        request = json.dumps({"answer": answer, "truth": truth, "timeout": own})
        try:
            assert verifier.proc.stdin is not None
            verifier.proc.stdin.write(request.encode() + b"\n")
            verifier.proc.stdin.flush()
            line = _readline(verifier.proc.stdout, max(0.0, deadline - time.monotonic()))
            reply = json.loads(line) if line is not None else None
            verdict = Verdict(bool(reply["equal"]), bool(reply["timed_out"])) if reply is not None else None
        except (OSError, ValueError, TypeError, KeyError):  # it died between calls, or garbled
            verdict = None
        if verdict is None:
            crashed = verifier.proc.poll() is not None
            logger.warning(
                "math-verify verifier %s; restarting it", "crashed" if crashed else "did not answer in time"
            )
            self._retire(verifier)
            return Verdict(False, timed_out=True)
        self._release(verifier)
        return verdict


def _readline(stream: IO[bytes] | None, timeout: float) -> bytes | None:
    """One line from a verifier, or ``None`` if none arrives within ``timeout`` seconds."""
    assert stream is not None
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        return None
    line = stream.readline()
    return line or None


_verifiers = _Verifiers()
atexit.register(_verifiers.close)


def _uses_verifiers() -> bool:
    """Whether comparisons run in verifier processes (POSIX: always, in every thread)."""
    return os.name == "posix"


def prestart() -> None:
    """Start the verifier processes now, without waiting, if they are not running.

    Their start (importing sympy and math-verify: about a second) then overlaps whatever comes
    before the first comparison (a rollout's generation) instead of delaying it."""
    if _uses_verifiers():
        _verifiers.start()


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
    Safe to call from any thread; returns within ``timeout_seconds`` of wall time (plus a few
    milliseconds) once the verifier processes first started (see the module docstring), with
    ``Verdict(False, timed_out=True)`` when the comparison did not finish in time.
    """
    if not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be a positive number of seconds, got {timeout_seconds!r}")
    start = time.monotonic()
    reason = refusal_reason(answer, max_chars)
    if reason is not None:
        return Verdict(False, refused=reason)
    plain = _plain_numbers(answer, truth)
    if plain is not None:
        # Both sides are plain integers: equal exactly when their values are, as math-verify
        # says, without parsing (or a verifier process) for the most common case.
        return Verdict(plain[0] == plain[1])
    # Off POSIX: in this thread, under math-verify's own timeouts.
    if not _uses_verifiers():
        return _compare_here(answer, truth, timeout_seconds)
    # The refusal check counted too (linear in the answer's length, which is capped).
    left = timeout_seconds - (time.monotonic() - start)
    if left <= 0:
        return Verdict(False, timed_out=True)
    return _verifiers.compare(answer, truth, left)


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
