"""Serve mode's feedback ledger: which served calls belong to which conversation, their rewards,
and when they go to the experience buffer.

Vocabulary (the HTTP side is :mod:`trinity.serving.serve`):

- A **call** is one completion the server answered, known by the ``id`` the client received
  (``chatcmpl-...``); it holds one Experience per choice.
- A **conversation** is the trajectory the calls of one episode make: the calls sent with the
  same conversation id (header ``X-Trinity-Conversation``, or ``conversation_id`` in the body);
  a call sent without one is a conversation of its own, named by its response id.
- **Feedback** gives a reward to a whole conversation, or to single calls (by response id, which
  wins over the conversation's reward); ``task_id`` puts the conversation in a group (GRPO's
  rollouts of one task; by default each conversation is its own group).
- **Commit** closes a conversation: its rewarded calls are written to the buffer at once (one
  Experience per choice, step-wise: ``eid.task`` = the group, ``eid.run`` = the conversation's
  place in its group, ``eid.step`` = the turn, ``eid.suffix`` = the response id), its calls
  without a reward are dropped and counted. A later call in a committed conversation is refused.
- An **explorer step** is what one trainer step takes (``eid.batch``): it ends, and readers stop
  waiting for more of it, once it holds ``trajectories_per_step`` committed conversations
  (``buffer.batch_size * algorithm.repeat_times``, what an explore step's tasks and runs make),
  or when a commit without ids flushes it.

Re-sent feedback and commits are idempotent: committed conversations (and their response ids)
are remembered, so a repeated commit writes nothing, and repeated feedback with the same reward
is answered as already done; a *different* reward for a committed conversation is a conflict,
since what was written cannot change. Each call is therefore written, and trained on, at most
once; the SQL buffer's unique ``eid.uid`` (with the response id in it) guards the same.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.buffer.base import BufferWriter
    from trinity.experience import Experience

logger = logging.getLogger("trinity.serving.serve")

#: How many committed conversations (and response ids) are remembered for idempotence.
REMEMBERED_COMMITS = 100_000


class FeedbackError(Exception):
    """A feedback or commit request that cannot be applied; ``status`` is its HTTP status
    (400 bad fields, 404 unknown id, 409 conflicts with what was committed)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass
class _Call:
    response_id: str
    experiences: list[Experience]
    reward: float | None = None


@dataclass
class _Conversation:
    id: str
    calls: list[_Call] = field(default_factory=list)
    reward: float | None = None
    task_id: str | None = None
    last_seen: float = 0.0

    def rewarded(self) -> bool:
        return self.reward is not None or any(c.reward is not None for c in self.calls)


@dataclass
class _Committed:
    """What a committed conversation left behind for idempotence checks."""

    conversation_id: str
    reward: float | None
    call_rewards: dict[str, float | None]


class FeedbackLedger:
    """Conversations awaiting feedback, and the writer of what is committed (thread-safe).

    Args:
        writer: the experience buffer's writer (``write``, ``end_step``, ``finish``).
        trajectories_per_step: committed conversations that make one explorer step.
        first_step: number of the first explorer step (after a restart: the trainer's next step).
        clock: seconds, for idle conversations (tests pass a fake one).
    """

    def __init__(
        self,
        writer: BufferWriter,
        *,
        trajectories_per_step: int,
        first_step: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if trajectories_per_step < 1:
            raise ValueError("trajectories_per_step must be at least 1")
        self.writer = writer
        self.trajectories_per_step = trajectories_per_step
        self.step = first_step
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, _Conversation] = {}
        self._call_owner: dict[str, str] = {}  # response id -> open conversation id
        self._committed: OrderedDict[str, _Committed] = OrderedDict()
        self._committed_calls: OrderedDict[str, str] = OrderedDict()  # response id -> conversation
        self._in_step = 0  # conversations written in the open step
        self._runs: dict[str, int] = {}  # group -> conversations of it in the open step
        self._finished = False
        self.counts = {
            "calls": 0,
            "experiences_written": 0,
            "conversations_committed": 0,
            "calls_dropped_unrewarded": 0,
            "conversations_auto_closed": 0,
            "calls_refused_after_commit": 0,
            "steps_ended": 0,
        }

    # -- recording ---------------------------------------------------------------------------

    def is_committed(self, conversation_id: str) -> bool:
        with self._lock:
            return conversation_id in self._committed

    def record(
        self, experiences: Sequence[Experience], response_id: str, conversation_id: str | None
    ) -> None:
        """Keep one served call (its Experiences, one per choice) in its conversation."""
        conv_id = conversation_id or response_id
        with self._lock:
            if self._finished or conv_id in self._committed:
                # The HTTP side refuses calls in committed conversations before sampling; this
                # is one that raced a commit (or shutdown), so it was never going to be trained.
                self.counts["calls_refused_after_commit"] += 1
                logger.warning(
                    "call %s of conversation %r arrived after its commit; it is not kept",
                    response_id,
                    conv_id,
                )
                return
            conv = self._open.get(conv_id)
            if conv is None:
                conv = self._open[conv_id] = _Conversation(conv_id)
            conv.calls.append(_Call(response_id, list(experiences)))
            conv.last_seen = self.clock()
            self._call_owner[response_id] = conv_id
            self.counts["calls"] += 1

    # -- feedback and commits ------------------------------------------------------------------

    def feedback(
        self,
        reward: float,
        *,
        conversation_id: str | None = None,
        response_ids: Sequence[str] = (),
        task_id: str | None = None,
        commit: bool = False,
    ) -> dict[str, Any]:
        """Reward a conversation (all its calls) or single calls; ``commit`` closes the
        conversation(s) afterwards. Returns what happened (the HTTP answer's body)."""
        reward = _check_reward(reward)
        if (conversation_id is None) == (not response_ids):
            raise FeedbackError(
                400, "give exactly one of conversation_id and response_ids (msg_ids)", param="conversation_id"
            )
        with self._lock:
            if conversation_id is not None:
                done = self._committed.get(conversation_id)
                if done is not None:
                    return self._repeat(done, reward, None)
                conv = self._find_open(conversation_id)
                conv.reward = reward
                touched = [conv]
            else:
                # Every id is checked before any reward is set: a request is applied whole or not at all.
                found = []
                for rid in response_ids:
                    owner = self._committed_calls.get(rid)
                    if owner is not None:  # a repeat: fine only with the committed reward
                        self._repeat(self._committed[owner], reward, rid)
                    else:
                        found.append(self._find_call(rid))
                touched = []
                for conv, call in found:
                    call.reward = reward
                    if conv not in touched:
                        touched.append(conv)
                if not touched:
                    return {"object": "trinity.feedback", "status": "already_committed", "rewarded_calls": 0}
            for conv in touched:
                if task_id is not None:
                    conv.task_id = str(task_id)
                conv.last_seen = self.clock()
            rewarded = sum(
                len(conv.calls)
                if conversation_id is not None
                else sum(c.response_id in response_ids for c in conv.calls)
                for conv in touched
            )
            answer: dict[str, Any] = {
                "object": "trinity.feedback",
                "status": "ok",
                "rewarded_calls": rewarded,
            }
            if commit:
                answer["commit"] = self._commit_all(touched)
            return answer

    def commit(self, conversation_id: str | None = None, response_ids: Sequence[str] = ()) -> dict[str, Any]:
        """Close one conversation (by its id or one of its calls' ids) and write its rewarded
        calls; with neither, close every conversation that has a reward and end the step."""
        with self._lock:
            if conversation_id is None and not response_ids:
                before = self.step
                answer = self._commit_all([c for c in self._open.values() if c.rewarded()])
                if self._in_step:
                    self._end_step()
                answer["ended_steps"] = list(range(before, self.step))
                return answer
            if conversation_id is not None and response_ids:
                raise FeedbackError(
                    400, "give conversation_id or response_ids, not both", param="conversation_id"
                )
            ids = [conversation_id] if conversation_id is not None else []
            for rid in response_ids:
                owner = self._committed_calls.get(rid) or self._call_owner.get(rid)
                if owner is None:
                    raise FeedbackError(
                        404, _unknown("response id", rid), param="response_ids", code="not_found"
                    )
                ids.append(owner)
            todo, already = [], 0
            for conv_id in dict.fromkeys(ids):  # unique, in order
                if conv_id in self._committed:
                    already += 1
                else:
                    todo.append(self._find_open(conv_id))
            answer = self._commit_all(todo)
            answer["already_committed"] = already
            return answer

    def end_step(self) -> int | None:
        """End the open step now if it holds anything; returns its number (``None``: empty)."""
        with self._lock:
            return self._end_step() if self._in_step else None

    # -- housekeeping ----------------------------------------------------------------------------

    def close_idle(self, idle_s: float) -> dict[str, Any]:
        """Close conversations without a call or feedback for ``idle_s`` seconds: rewarded ones
        are committed, the others dropped (counted and logged)."""
        with self._lock:
            now = self.clock()
            idle = [c for c in self._open.values() if now - c.last_seen >= idle_s]
            return self._close(idle, f"idle for {idle_s:.0f} s") if idle else {}

    def finish(self) -> dict[str, Any]:
        """Shutdown: commit the rewarded conversations, drop the rest, end the open step and
        finish the writer (readers then know nothing more comes)."""
        with self._lock:
            if self._finished:
                return {}
            answer = self._close(list(self._open.values()), "the server is stopping")
            if self._in_step:
                self._end_step()
            self._finished = True
        self.writer.finish()
        return answer

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counts,
                "explorer_step": self.step,
                "open_conversations": len(self._open),
                "calls_awaiting_feedback": sum(len(c.calls) for c in self._open.values()),
                "conversations_in_step": self._in_step,
            }

    # -- under the lock --------------------------------------------------------------------------

    def _find_open(self, conversation_id: str) -> _Conversation:
        conv = self._open.get(conversation_id)
        if conv is None:
            raise FeedbackError(
                404, _unknown("conversation", conversation_id), param="conversation_id", code="not_found"
            )
        return conv

    def _find_call(self, response_id: str) -> tuple[_Conversation, _Call]:
        owner = self._call_owner.get(response_id)
        if owner is not None:
            conv = self._open[owner]
            for call in conv.calls:
                if call.response_id == response_id:
                    return conv, call
        raise FeedbackError(404, _unknown("response id", response_id), param="response_ids", code="not_found")

    def _repeat(self, done: _Committed, reward: float, response_id: str | None) -> dict[str, Any]:
        """Feedback for something committed: fine when it says what was committed."""
        before = done.call_rewards.get(response_id) if response_id else done.reward
        if before is None and response_id is not None:
            before = done.reward
        if before != reward:
            what = f"call {response_id}" if response_id else f"conversation {done.conversation_id!r}"
            was = "without a reward (not trained)" if before is None else f"with reward {before}"
            raise FeedbackError(
                409,
                f"{what} was committed {was}; what was committed cannot change, so reward {reward} "
                "is not applied",
                param="reward",
                code="already_committed",
            )
        return {"object": "trinity.feedback", "status": "already_committed", "rewarded_calls": 0}

    def _commit_all(self, conversations: list[_Conversation]) -> dict[str, Any]:
        """Commit ``conversations``; the answer names the steps that ended meanwhile."""
        written = dropped = 0
        before = self.step
        for conv in conversations:
            w, d = self._commit_one(conv)
            written, dropped = written + w, dropped + d
        return {
            "conversations": len(conversations),
            "experiences_written": written,
            "calls_dropped": dropped,
            "ended_steps": list(range(before, self.step)),
        }

    def _commit_one(self, conv: _Conversation) -> tuple[int, int]:
        """Write ``conv``'s rewarded calls in the open step; returns (experiences, calls dropped)."""
        del self._open[conv.id]
        for call in conv.calls:
            self._call_owner.pop(call.response_id, None)
        group = conv.task_id if conv.task_id is not None else conv.id
        kept = [c for c in conv.calls if (c.reward if c.reward is not None else conv.reward) is not None]
        dropped = len(conv.calls) - len(kept)
        experiences = []
        if kept:
            run = self._runs.get(group, 0)
            for turn, call in enumerate(kept):
                reward = call.reward if call.reward is not None else conv.reward
                for choice, exp in enumerate(call.experiences):
                    exp.reward = reward
                    exp.eid.batch = self.step
                    exp.eid.task = group
                    exp.eid.run = run
                    exp.eid.step = turn
                    exp.eid.suffix = (
                        call.response_id if len(call.experiences) == 1 else f"{call.response_id}.{choice}"
                    )
                    exp.info["conversation_id"] = conv.id
                    exp.info["response_id"] = call.response_id
                    experiences.append(exp)
            # Written before it counts as committed: a failed write leaves the conversation
            # open (the error reaches the client, who may commit again).
            try:
                self.writer.write(experiences)
            except Exception:
                self._open[conv.id] = conv
                for call in conv.calls:
                    self._call_owner[call.response_id] = conv.id
                raise
            self._runs[group] = run + 1
            self._in_step += 1
        self._remember(conv)
        self.counts["conversations_committed"] += 1
        self.counts["experiences_written"] += len(experiences)
        self.counts["calls_dropped_unrewarded"] += dropped
        if dropped:
            logger.info("conversation %r committed with %d unrewarded call(s), not trained", conv.id, dropped)
        if self._in_step >= self.trajectories_per_step:
            self._end_step()
        return len(experiences), dropped

    def _remember(self, conv: _Conversation) -> None:
        self._committed[conv.id] = _Committed(
            conv.id, conv.reward, {c.response_id: c.reward for c in conv.calls}
        )
        for call in conv.calls:
            self._committed_calls[call.response_id] = conv.id
        while len(self._committed) > REMEMBERED_COMMITS:
            _, old = self._committed.popitem(last=False)
            for rid in old.call_rewards:
                self._committed_calls.pop(rid, None)

    def _end_step(self) -> int:
        step = self.step
        self.writer.end_step(step)
        self.counts["steps_ended"] += 1
        logger.info("serve: explorer step %d ended (%d conversations)", step, self._in_step)
        self.step, self._in_step, self._runs = step + 1, 0, {}
        return step

    def _close(self, conversations: list[_Conversation], why: str) -> dict[str, Any]:
        rewarded = [c for c in conversations if c.rewarded()]
        unrewarded = [c for c in conversations if not c.rewarded()]
        answer = self._commit_all(rewarded)
        calls = sum(len(c.calls) for c in unrewarded)
        for conv in unrewarded:
            del self._open[conv.id]
            for call in conv.calls:
                self._call_owner.pop(call.response_id, None)
        self.counts["calls_dropped_unrewarded"] += calls
        self.counts["conversations_auto_closed"] += len(conversations)
        if conversations:
            logger.warning(
                "serve: %s: committed %d rewarded conversation(s), dropped %d without a reward (%d calls, "
                "never trained)",
                why,
                len(rewarded),
                len(unrewarded),
                calls,
            )
        answer["dropped_conversations"] = len(unrewarded)
        return answer


def _check_reward(reward: Any) -> float:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise FeedbackError(400, f"reward must be a finite number, got {reward!r}", param="reward")
    return float(reward)


def _unknown(what: str, value: str) -> str:
    return (
        f"no open call or conversation with {what} {value!r}: it was never served here, was "
        "closed after idling, or was served before this server (re)started"
    )
