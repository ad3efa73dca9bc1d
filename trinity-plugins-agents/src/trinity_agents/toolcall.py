"""``toolcall_workflow``: function calling on ToolACE-format tasks (as Trinity-RFT, after Tool-N1).

Task rows (Trinity-RFT's ToolACE preprocessing, ``examples/grpo_toolcall/get_toolace_data.py``):

===================  =========================================================================
``raw_system``       the system prompt (the tool descriptions are appended to it)
``tools``            the functions, a list of ``{"name", "description", "parameters"}`` or that
                     list as a JSON string
``conversations``    the dialogue so far: ``[{"from": ..., "value": ...}]`` with ``from`` one of
                     ``human``/``user``, ``gpt``/``assistant``, ``observation``/``tool`` and
                     ``function_call`` (an earlier call, its ``value`` a JSON list of calls)
``answer``           the gold calls, a list of ``{"name", "arguments"}`` or that list as JSON
===================  =========================================================================

The model must think in one ``<think>...</think>`` and then give its calls as a JSON list in
``<tool_call>...</tool_call>``. The reward is 1 when the last ``<tool_call>`` block holds exactly
the gold calls (the same multiset of function names with equal arguments, types included, order
free), there is exactly one ``<think>`` and one ``</think>``, and ``</think>`` comes before the
first ``<tool_call>``; otherwise 0. Metrics: ``accuracy`` (the reward), ``format_ok`` and
``name_match`` (the right functions, whatever the arguments).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Task, Workflow
from trinity_agents.multi_turn import rollout_kwargs

if TYPE_CHECKING:
    from trinity.experience import Experience

TOOL_PROMPT = """# Tools

You can call the functions described below (one JSON object per line):
<tools>
{tools}
</tools>

In every reply you MUST:
1. First reason about the request inside <think> </think> tags.
2. Then give the function calls as a JSON list inside <tool_call> </tool_call> tags, each call an object with "name" and "arguments": <tool_call>[{{"name": <function-name>, "arguments": <arguments-object>}}, ...]</tool_call>
3. Put the reasoning and the calls together in one reply, the reasoning first.
For example: <think>The user wants the weather in Paris, so I call get_weather.</think> <tool_call>[{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}]</tool_call>
Give every argument the type its parameter asks for.
"""

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function_call": "assistant",
}


def _json_or_value(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"toolcall task: {what} is not valid JSON: {value[:80]!r}") from None
    return value


def load_tools(value: Any) -> list[dict[str, Any]]:
    """The ``tools`` column as a list of function descriptions."""
    tools = _json_or_value(value, "tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"toolcall task: tools must be a list of objects, got {type(tools).__name__}")
    return tools


def load_calls(value: Any) -> list[dict[str, Any]]:
    """The ``answer`` column as a list of ``{"name", "arguments"}`` calls."""
    calls = _json_or_value(value, "answer")
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not all(isinstance(c, dict) and "name" in c for c in calls):
        raise ValueError(
            f"toolcall task: answer must be a list of {{name, arguments}} objects, got {calls!r:.80}"
        )
    return calls


def format_tools(tools: list[dict[str, Any]]) -> str:
    """One ``{"type": "function", "function": ...}`` JSON object per line."""
    return "\n".join(json.dumps({"type": "function", "function": tool}) for tool in tools)


def build_messages(row: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat for a ToolACE row: the system prompt with the tools, then the conversation.

    Earlier ``function_call`` turns are shown as the model is asked to write them
    (``<tool_call>[...]</tool_call>``).
    """
    system = row.get("raw_system")
    if system is None:
        system = system_prompt or ""
    messages = [
        {
            "role": "system",
            "content": str(system) + TOOL_PROMPT.format(tools=format_tools(load_tools(row.get("tools", [])))),
        }
    ]
    for i, turn in enumerate(_json_or_value(row.get("conversations") or [], "conversations")):
        source = str(turn.get("from", "")).lower() if isinstance(turn, dict) else ""
        if source not in _ROLES:
            raise ValueError(f"toolcall task: conversations[{i}] has an unknown 'from': {turn!r:.80}")
        value = turn.get("value", "")
        if source == "function_call":
            value = f"<tool_call>{json.dumps(_json_or_value(value, f'conversations[{i}]'))}</tool_call>"
        messages.append(
            {"role": _ROLES[source], "content": value if isinstance(value, str) else json.dumps(value)}
        )
    return messages


def extract_tool_calls(response: str) -> list[Any] | None:
    """The calls in the last ``<tool_call>`` block (a JSON list, a single object, or JSON text
    holding either); ``None`` when there is no block or it is not such JSON."""
    blocks = _TOOL_CALL.findall(response or "")
    if not blocks:
        return None
    try:
        value = json.loads(blocks[-1].strip())
        if isinstance(value, str):
            value = json.loads(value)
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict):
        value = [value]
    return value if isinstance(value, list) else None


def _call_key(call: dict[str, Any]) -> tuple[str, str]:
    return str(call["name"]), json.dumps(call["arguments"], sort_keys=True)


@dataclass(frozen=True)
class ToolCallScore:
    """How a reply compares with the gold calls."""

    reward: float  #: 1.0 for well-formed, exactly matching calls, else 0.0
    format_ok: bool  #: one <think>...</think> before a parsable <tool_call> list of {name, arguments}
    name_match: bool  #: the same multiset of function names as the gold
    reason: str  #: why the reward is 0 ("" when it is 1)


def score_tool_calls(response: str, gold: Any) -> ToolCallScore:
    """Compare ``response``'s calls with ``gold`` (a list of calls, or its JSON)."""
    answer = load_calls(gold)
    calls = extract_tool_calls(response)
    text = response or ""

    def fail(reason: str, name_match: bool = False, format_ok: bool = False) -> ToolCallScore:
        return ToolCallScore(0.0, format_ok, name_match, reason)

    if calls is None:
        return fail("no parsable <tool_call> JSON list")
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return fail("needs exactly one <think> and one </think>")
    if text.find("</think>") > text.find("<tool_call>"):
        return fail("</think> must come before <tool_call>")
    if not all(isinstance(c, dict) and "name" in c and "arguments" in c for c in calls):
        return fail("every call must be an object with name and arguments")
    names = Counter(str(c["name"]) for c in calls) == Counter(str(c["name"]) for c in answer)
    try:
        exact = Counter(map(_call_key, calls)) == Counter(map(_call_key, answer))
    except (TypeError, KeyError):
        exact = False
    if exact:
        return ToolCallScore(1.0, True, True, "")
    if not names:
        return fail("wrong functions (or number of calls)", False, True)
    return fail("wrong arguments", True, True)


def toolcall_reward(response: str, gold: Any) -> float:
    """1.0 when ``response`` makes exactly the ``gold`` calls in the required format, else 0.0."""
    return score_tool_calls(response, gold).reward


class ToolCallWorkflow(Workflow):
    """One reply per rollout to a ToolACE task, scored by :func:`score_tool_calls`.

    ``can_repeat``: the ``repeat_times`` rollouts of a task are one ``chat(n=repeat_times)`` call.
    """

    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = True
    is_async: ClassVar[bool] = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """ToolACE rows have no prompt column: check ``answer``, ``tools`` and ``conversations``."""
        if row.get("answer") is None:
            return f"toolcall row has no 'answer' column (row keys: {', '.join(sorted(map(str, row)))})"
        try:
            load_calls(row["answer"])
            build_messages(row)
        except (ValueError, TypeError, AttributeError) as exc:
            return str(exc)
        return None

    def reset(self, task: Task) -> None:
        self.task = task
        self.repeat_times = task.repeat_times
        raw = task.raw_task or {}
        if raw.get("answer") is None:
            raise ValueError(
                f"toolcall task {task.index} of taskset {task.taskset_name!r} has no 'answer' column "
                f"(row keys: {sorted(raw)})"
            )
        self.answer = load_calls(raw["answer"])
        self.messages = build_messages(raw, task.format_args.system_prompt)

    def run(self) -> list[Experience]:
        experiences = self.model.chat(self.messages, **self._rollout_args())
        return self._score(experiences)

    async def run_async(self) -> list[Experience]:
        experiences = await self.model.chat_async(self.messages, **self._rollout_args())
        return self._score(experiences)

    def _rollout_args(self) -> dict[str, Any]:
        return {**rollout_kwargs(self.task.rollout_args), "n": max(1, self.repeat_times)}

    def _score(self, experiences: list[Experience]) -> list[Experience]:
        for i, exp in enumerate(experiences):
            score = score_tool_calls(exp.response_text or "", self.answer)
            exp.reward = score.reward
            exp.eid.run = self.run_id_base + i
            exp.info = {**(exp.info or {}), "reason": score.reason}
            exp.metrics = {
                **(exp.metrics or {}),
                "accuracy": score.reward,
                "format_ok": float(score.format_ok),
                "name_match": float(score.name_match),
            }
        return experiences


__all__ = [
    "TOOL_PROMPT",
    "ToolCallScore",
    "ToolCallWorkflow",
    "build_messages",
    "extract_tool_calls",
    "format_tools",
    "load_calls",
    "load_tools",
    "score_tool_calls",
    "toolcall_reward",
]
