"""Answer equivalence with math-verify, bounded by a timeout in any thread.

math-verify bounds its own work with ``signal.alarm``, which only works in the main thread;
called from any other thread (workflow runners, async actors) it refuses to run. So:

* in the main thread we call math-verify directly with its own timeouts;
* elsewhere we send the comparison to a long-lived worker process (``python -m
  trinity_math.verify``), whose main thread can use those timeouts, and the caller waits with a
  deadline: a worker that does not answer in time is killed and replaced on the next call.

Either way a pathological answer (``9^{9^{9}}``) costs at most about three timeouts
(two parses and one comparison), never a hung runner.

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
import subprocess
import sys
import threading
from typing import IO, NamedTuple

logger = logging.getLogger(__name__)

# A word of two or more letters that is not a LaTeX command (``\frac``, ``\text``): its presence
# means the text is prose ("18 dollars", "The answer is 42") rather than a bare expression.
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_ANCHORS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")
# The worker gets this long to start (importing sympy takes a few seconds on a busy machine).
_WORKER_START_SECONDS = 120.0


class Verdict(NamedTuple):
    """Outcome of one comparison: ``equal``, and whether a timeout cut it short."""

    equal: bool
    timed_out: bool = False


def _int_timeout(seconds: float) -> int:
    # signal.alarm (math-verify's mechanism) only takes whole seconds.
    return max(1, math.ceil(seconds))


def _normalise_text(text: str) -> str:
    return " ".join(text.strip().rstrip(".").split()).casefold()


def parse_answer(text: str, timeout_seconds: float = 5) -> list:
    """math-verify's parse of a *bare* answer (a truth, ``<answer>`` or ``\\boxed{}`` content).

    Bare expressions are parsed as LaTeX math (wrapped in ``\\boxed{}``), so ``2x+1`` is
    ``2*x + 1`` and not the first number found; prose (``18 dollars``) and anchored text
    (``$...$``, ``\\boxed{...}``) go to math-verify unchanged. Must run in the main thread.
    """
    from math_verify import parse

    text = text.strip()
    if not text:
        return []
    seconds = _int_timeout(timeout_seconds)
    if not any(a in text for a in _ANCHORS) and _PROSE_WORD.search(text) is None:
        parsed = parse("\\boxed{" + text + "}", parsing_timeout=seconds, raise_on_error=True)
        # Only the raw string came back (no sympy object): let math-verify's own extraction try.
        if len(parsed) > 1 or (parsed and not isinstance(parsed[0], str)):
            return parsed
    return parse(text, parsing_timeout=seconds, raise_on_error=True)


def _compare_here(answer: str, truth: str, timeout_seconds: float) -> Verdict:
    """The comparison itself; runs in a main thread (ours or the worker's)."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        gold = parse_answer(truth, timeout_seconds)
        pred = parse_answer(answer, timeout_seconds)
        if not gold:
            # Not math at all (``yes``, a name): compare the texts.
            return Verdict(bool(answer.strip()) and _normalise_text(answer) == _normalise_text(truth))
        if not pred:
            return Verdict(False)
        return Verdict(
            bool(verify(gold, pred, timeout_seconds=_int_timeout(timeout_seconds), raise_on_error=True))
        )
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
        self._pid = 0  # the parent pid that started it: a forked child must start its own

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trinity_math.verify"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        if _readline(proc.stdout, _WORKER_START_SECONDS) != b"ready\n":
            proc.kill()
            proc.wait()
            raise RuntimeError(
                "trinity_math could not start its math-verify worker process "
                f"({sys.executable} -m trinity_math.verify); is trinity-plugins-math installed "
                "in this interpreter?"
            )
        self._pid = os.getpid()
        return proc

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

    def compare(self, answer: str, truth: str, timeout_seconds: float) -> Verdict:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._pid != os.getpid():
                self._proc = self._start()
            assert self._proc.stdin is not None and self._proc.stdout is not None
            request = json.dumps({"answer": answer, "truth": truth, "timeout": timeout_seconds})
            try:
                self._proc.stdin.write(request.encode() + b"\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                self._kill()
                raise RuntimeError(
                    "the math-verify worker process died; it is restarted on the next call"
                ) from None
            # Two parses and one comparison, each bounded by the timeout inside the worker.
            line = _readline(self._proc.stdout, 3 * _int_timeout(timeout_seconds) + 2)
            if line is None:
                crashed = self._proc.poll() is not None
                logger.warning(
                    "math-verify worker %s; restarting it", "crashed" if crashed else "did not answer in time"
                )
                self._kill()
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


def math_equal(answer: str, truth: str, timeout_seconds: float = 5) -> Verdict:
    """Whether ``answer`` equals ``truth`` mathematically (math-verify), within a timeout.

    Both are bare answers: the caller extracts them first (``<answer>`` content, the last
    ``\\boxed{}``, a GSM8K ``#### N``). Safe to call from any thread.
    """
    # Off POSIX, math-verify times out with a helper process, which works in any thread.
    if threading.current_thread() is threading.main_thread() or os.name != "posix":
        return _compare_here(answer, truth, timeout_seconds)
    return _worker.compare(answer, truth, timeout_seconds)


def _serve() -> None:
    """Worker loop: one JSON request per stdin line, one JSON verdict per stdout line."""
    # Replies go to the real stdout; anything a library prints goes to stderr instead, so it
    # cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    import math_verify  # noqa: F401  (import before saying ready, so the first call is fast)

    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        verdict = _compare_here(request["answer"], request["truth"], request["timeout"])
        out.write(json.dumps({"equal": verdict.equal, "timed_out": verdict.timed_out}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
