"""``rm_gallery_reward`` (a reward from RM-Gallery, PyPI ``rm-gallery``) and ``math_rm_workflow``.

``rm_gallery_reward`` scores a response with one of RM-Gallery's registered rewards, as
Trinity-RFT's ``RMGalleryFn`` did: ``reward_fn_args.reward_name`` picks the reward (e.g.
``math_verify_reward``), every other ``reward_fn_args`` key is an argument of that reward. The
response becomes an RM-Gallery ``DataSample`` (the prompt's chat as ``input``, the response as
the answer, the truth as its ``label.reference``); the reward's parts are the scored dimensions
of the result (``{dimension name: score}``, the first rank of a ranked dimension), or
``{"reward": score}`` when it has none.

RM-Gallery runs in a *reward process* of its own (``python -m trinity_math.reward_model``, one
per reward instance, started when the reward is built), not in the workflow's thread: its
``math_verify_reward`` bounds math-verify with ``signal.alarm``, which works in a main thread
only, and in a runner's thread every answer would score ``timeout_score`` (0). A call that
fails (the reward raised, or the process died or gave no answer within
:data:`CALL_TIMEOUT_SECONDS`: it is then killed and restarted on the next call) scores 0 with
no parts, is logged, and is counted: the reward's ``failures`` and, per rollout, the metric
``reward_failed`` (0 or 1; logged as ``rollout/reward_failed``, the share of the step's
rollouts).

RM-Gallery is an optional extra that installs in two commands (:func:`rm_gallery_install_hint`):
its releases pin ``math-verify<0.8`` (this plugin needs 0.9), ``transformers<5`` and
``pytest<9`` and pull Label Studio, Data-Juicer and bitsandbytes, none of which its reward
classes import; so ``rm-gallery`` itself is installed with ``--no-deps`` and the extra
``trinity-plugins-math[rm-gallery]`` brings what its rewards do import.

``math_rm_workflow`` / ``async_math_rm_workflow``: Trinity-RFT's ``MathRMWorkflow``, a
``simple_workflow`` whose reward also gets the prompt's chat (``messages``), which
``rm_gallery_reward`` hands to the reward model.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import IO, Any, ClassVar

from trinity.workflow import RewardFn
from trinity_math.workflows import SimpleWorkflow

logger = logging.getLogger(__name__)

RM_GALLERY_VERSION = "0.1.7"
"""The RM-Gallery release the reward is tested with (``nox -s rm_gallery``)."""
CALL_TIMEOUT_SECONDS = 120.0
"""Bound on one reward call's wall time (math-verify's own timeouts are 5 s a step; an LLM-judged
reward retries its model calls inside it); past it the reward process is killed."""
START_TIMEOUT_SECONDS = 120.0
"""Bound on a reward process's start (importing RM-Gallery takes about a second)."""


class RMGalleryMissingError(ImportError):
    """RM-Gallery is not installed; the message says how to install it."""


def rm_gallery_install_hint() -> str:
    """The commands that install RM-Gallery for ``rm_gallery_reward``."""
    from trinity.install_hints import install_hint

    extra = install_hint("trinity-plugins-math", extra="rm-gallery")
    return f"pip install --no-deps rm-gallery=={RM_GALLERY_VERSION} && {extra}"


def _missing_message(detail: str) -> str:
    return f"rm_gallery_reward needs RM-Gallery (PyPI rm-gallery), {detail}: {rm_gallery_install_hint()}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class RMGalleryRewardFn(RewardFn):
    """``rm_gallery_reward``: one of RM-Gallery's rewards (see the module doc).

    Args:
        reward_name: the RM-Gallery reward (its registry name, e.g. ``math_verify_reward``).
        **kwargs: that reward's own arguments (checked against its fields when it is built).

    Raises :class:`RMGalleryMissingError` when RM-Gallery is not installed and ``ValueError``
    (one line) for an unknown reward or argument.
    """

    #: The workflow passes the prompt's chat as ``messages`` (``math_rm_workflow`` does).
    takes_messages: ClassVar[bool] = True

    def __init__(self, reward_name: str, **kwargs: Any) -> None:
        if not isinstance(reward_name, str) or not reward_name:
            raise ValueError(
                f"rm_gallery_reward: reward_fn_args.reward_name must name an RM-Gallery reward "
                f"(e.g. math_verify_reward), got {reward_name!r}"
            )
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"rm_gallery_reward: reward_fn_args must be plain values (JSON): {exc}"
            ) from None
        if importlib.util.find_spec("rm_gallery") is None:
            raise RMGalleryMissingError(_missing_message("which is not installed"))
        self.reward_name = reward_name
        self.reward_args = dict(kwargs)
        self.failures = 0
        self._pending = 0.0
        self._lock = threading.Lock()
        self._process: _RewardProcess | None = None
        self._process = self._start()

    def _start(self) -> _RewardProcess:
        process = _RewardProcess()
        reply = process.request(
            {"reward_name": self.reward_name, "args": self.reward_args}, START_TIMEOUT_SECONDS
        )
        if reply is None or "error" in reply:
            process.kill()
            if reply is None:
                raise RuntimeError(
                    f"rm_gallery_reward: the reward process ({' '.join(_command())}) did not start within "
                    f"{START_TIMEOUT_SECONDS:.0f} s"
                )
            raise (RMGalleryMissingError if reply.get("missing") else ValueError)(reply["error"])
        return process

    def __call__(
        self,
        response: str,
        truth: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> dict[str, float]:
        """The reward's parts for ``response`` (``{}`` when the call failed: see the module doc).

        ``messages``: the prompt's chat; other keyword arguments (a workflow's token ids, say)
        are not RM-Gallery's and are not sent."""
        request = {"response": str(response), "truth": "" if truth is None else str(truth)}
        request["messages"] = [
            {"role": str(m.get("role")), "content": str(m.get("content") or "")} for m in (messages or [])
        ]
        with self._lock:
            try:
                if self._process is None or not self._process.alive():
                    self._process = self._start()
                reply = self._process.request(request, CALL_TIMEOUT_SECONDS)
            except Exception as exc:  # the process could not be (re)started
                reply = {"error": _one_line(f"{type(exc).__name__}: {exc}")}
            if reply is None:
                crashed = self._process is not None and not self._process.alive()
                if self._process is not None:
                    self._process.kill()
                self._process = None  # started again on the next call
                reply = {
                    "error": "the reward process crashed"
                    if crashed
                    else f"no answer within {CALL_TIMEOUT_SECONDS:.4g} s (reward process killed)"
                }
            if "error" in reply:
                self.failures += 1
                self._pending = 1.0
                logger.warning(
                    "rm_gallery_reward %r failed (%d so far), scored 0: %s",
                    self.reward_name,
                    self.failures,
                    reply["error"],
                )
                return {}
            self._pending = 0.0
            return {str(k): float(v) for k, v in reply["parts"].items()}

    def take_metrics(self) -> dict[str, float]:
        """``reward_failed`` (1 when the last call failed, else 0), for the workflow's metrics."""
        return {"reward_failed": self._pending}

    def close(self) -> None:
        """Stop the reward process (a later call starts another)."""
        with self._lock:
            if self._process is not None:
                self._process.close()
                self._process = None

    def __del__(self) -> None:
        process = getattr(self, "_process", None)
        if process is not None:
            with contextlib.suppress(Exception):
                process.kill()


def _command() -> list[str]:
    return [sys.executable, "-m", "trinity_math.reward_model"]


class _RewardProcess:
    """A ``python -m trinity_math.reward_model`` process answering JSON lines, one at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send ``message``; its reply, or ``None`` when the process died or did not answer in time."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            line = _readline(self.proc.stdout, timeout)
            return None if line is None else json.loads(line)
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        # Reaped in the background: a scoring thread never waits for that.
        threading.Thread(target=self._reap, name="trinity-rm-reap", daemon=True).start()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _readline(stream: IO[bytes] | None, timeout: float) -> bytes | None:
    import select

    assert stream is not None
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        return None
    return stream.readline() or None


# -- the reward process ------------------------------------------------------------------------


def _build_reward(reward_name: str, args: dict[str, Any]) -> Any:
    """RM-Gallery's reward ``reward_name`` built with ``args`` (ValueError, one line, otherwise)."""
    from rm_gallery.core.reward.registry import RewardRegistry

    from trinity.config.sections.base import closest

    known = sorted(RewardRegistry._registry)
    if reward_name not in known:
        hint = closest(reward_name, known)
        raise ValueError(
            f"rm_gallery_reward: RM-Gallery has no reward {reward_name!r}"
            + (f"; did you mean {hint!r}?" if hint else ";")
            + f" Its rewards: {', '.join(known)}"
        )
    cls = RewardRegistry.get(reward_name)
    fields = sorted(getattr(cls, "model_fields", {}))
    unknown = sorted(set(args) - set(fields))
    if unknown:  # a pydantic model would ignore them silently
        raise ValueError(
            f"rm_gallery_reward: unknown argument(s) {', '.join(map(repr, unknown))} of RM-Gallery's "
            f"{reward_name!r} (reward_fn_args); its arguments: {', '.join(fields)}"
        )
    try:
        return cls(**args)
    except Exception as exc:  # pydantic's ValidationError spans lines
        raise ValueError(
            f"rm_gallery_reward: invalid reward_fn_args for RM-Gallery's {reward_name!r}: {_one_line(exc)}"
        ) from None


def _score(reward: Any, request: dict[str, Any]) -> dict[str, float]:
    """One response's parts from RM-Gallery's ``reward`` (as Trinity-RFT's RMGalleryFn reads them)."""
    from rm_gallery.core.data.schema import DataOutput, DataSample, Step
    from rm_gallery.core.model.message import ChatMessage, MessageRole
    from rm_gallery.core.reward.schema import RewardDimensionWithRank, RewardDimensionWithScore

    answer = Step(role="assistant", content=request["response"], label={"reference": request["truth"]})
    sample = DataSample(
        unique_id=uuid.uuid4().hex,
        input=[ChatMessage(role=MessageRole(m["role"]), content=m["content"]) for m in request["messages"]],
        output=[DataOutput(answer=answer)],
    )
    result = reward.evaluate(sample).output[0].answer.reward
    parts: dict[str, float] = {}
    for detail in result.details:
        if isinstance(detail, RewardDimensionWithScore):
            parts[detail.name] = float(detail.score)
        elif isinstance(detail, RewardDimensionWithRank) and detail.rank:
            parts[detail.name] = float(detail.rank[0])
    return parts if result.details else {"reward": float(result.score)}


def _serve() -> None:
    """The reward process: the first line builds the reward, each later line scores one response."""
    # Replies go to the real stdout; whatever RM-Gallery prints (loguru) goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    init = json.loads(sys.stdin.buffer.readline() or "{}")
    # Importing RM-Gallery opens a log file at ./log/rm_gallery.log: in a folder of this
    # process's own (removed when it ends), never in the folder the job runs in.
    workdir, cwd = tempfile.mkdtemp(prefix="rm_gallery_"), os.getcwd()
    atexit.register(shutil.rmtree, workdir, True)
    os.chdir(workdir)
    try:
        import rm_gallery  # noqa: F401  (registers RM-Gallery's rewards)
    except ImportError as exc:
        reply({"error": _missing_message(f"which does not import ({_one_line(exc)})"), "missing": True})
        return
    finally:
        os.chdir(cwd)
    try:
        reward = _build_reward(init.get("reward_name", ""), init.get("args") or {})
    except ValueError as exc:
        reply({"error": str(exc)})
        return
    reply({"ready": True})
    for line in sys.stdin.buffer:
        try:
            reply({"parts": _score(reward, json.loads(line))})
        except Exception as exc:  # the reward's fault: the caller counts and logs it
            reply({"error": _one_line(f"{type(exc).__name__}: {exc}")[:500]})


# -- the workflow ------------------------------------------------------------------------------


class MathRMWorkflow(SimpleWorkflow):
    """``math_rm_workflow``: ``simple_workflow`` whose reward also gets the prompt's chat.

    The taskset names the reward (``default_reward_fn_type: rm_gallery_reward`` with
    ``reward_fn_args.reward_name``, as Trinity-RFT's ``grpo_math`` example does); rewards that
    declare ``takes_messages`` get the chat sent to the model as ``messages``.
    """

    def reward_kwargs(self) -> dict[str, Any]:
        if getattr(self.reward_fn, "takes_messages", False):
            return {"messages": self.format_messages()}
        return {}


class AsyncMathRMWorkflow(MathRMWorkflow):
    """``async_math_rm_workflow``: ``math_rm_workflow`` awaiting ``model.chat_async``."""

    is_async: ClassVar[bool] = True


if __name__ == "__main__":
    _serve()
