"""AgentScope ReAct agents solving math problems with tools, trained step-wise.

Registered under Trinity-RFT's names, so its example configs load unchanged:

- ``agentscope_react_workflow`` (:class:`AgentScopeReActWorkflow`, Trinity-RFT's
  ``examples/agentscope_react``; GSM8K rows, ``question`` / ``answer``);
- ``agentscope_react_math_workflow`` (:class:`AgentScopeReactMathWorkflow`,
  ``examples/agentscope_tool_react`` with AgentScope 1.x; DAPO rows, ``prompt`` / ``solution``);
- ``agentscopev0_react_math_workflow`` (:class:`AgentScopeV0ReactMathWorkflow`, the same
  example's AgentScope 0.x configs, run here with AgentScope 1.x: the answer is the agent's
  final text, no structured output, 5 iterations).

The agent is AgentScope's ``ReActAgent`` with an ``OpenAIChatModel`` whose client is
``model.get_openai_async_client()``: every model call goes through the core's OpenAI-compatible
server, which records it (exact token ids, logprobs, ``action_mask`` over the reply) when
``enable_history`` is on. The tools are :func:`~trinity_agents.sandbox.calculate` and
:func:`~trinity_agents.sandbox.run_python` (sandboxed). After the episode the recorded calls
become the Experiences: one per model call, ``eid.step`` = the call's index, the episode reward
on every step (``info["step_reward"]``: 0 before the last step, the reward on it), which is what
``multi_step_grpo`` trains on.

AgentScope is imported when a workflow runs, never when this module is imported; without it the
run fails with one line saying ``pip install './trinity-plugins-agents[agentscope]'``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from trinity.workflow import Workflow
from trinity_agents.multi_turn import as_bool, positive_int

if TYPE_CHECKING:
    from trinity.experience import Experience
    from trinity.workflow import Task


def agentscope_install_hint() -> str:
    """How to install AgentScope: the ``agentscope`` extra of this distribution."""
    from trinity.plugins import install_hint

    return install_hint("trinity-plugins-agents", extra="agentscope")


# -- AgentScope ------------------------------------------------------------------------------


class AgentScopeMissingError(ImportError):
    """AgentScope 1.x is not importable (the message is one line with the fix)."""


def require_agentscope(workflow: str = "this workflow") -> Any:
    """The ``agentscope`` module (1.x); :class:`AgentScopeMissingError` otherwise."""
    try:
        import agentscope
        from agentscope.agent import ReActAgent  # noqa: F401  (the 1.x API)
    except ImportError as exc:
        raise AgentScopeMissingError(
            f"{workflow} needs AgentScope 1.x, which is not importable ({exc}): {agentscope_install_hint()}"
        ) from None
    version = str(getattr(agentscope, "__version__", "1"))
    if not version.startswith("1."):
        raise AgentScopeMissingError(
            f"{workflow} needs AgentScope 1.x, found {version}: {agentscope_install_hint()}"
        )
    return agentscope


def check_model_for_agents(model: Any, workflow: str, *, tools: bool) -> None:
    """Fail early, naming the config keys, when the model wrapper cannot serve the agent."""
    if getattr(model, "enable_history", True) is False:
        raise RuntimeError(
            f"{workflow} trains on the recorded OpenAI API calls: set enable_openai_api: true and "
            "enable_history: true in explorer.rollout_model"
        )
    if (
        tools
        and hasattr(model, "tool_call_parser")
        and (not model.tool_call_parser or not getattr(model, "enable_auto_tool_choice", True))
    ):
        raise RuntimeError(
            f"{workflow} lets the agent call tools: set tool_call_parser: hermes (or the "
            "parser of your model) and enable_auto_tool_choice: true in explorer.rollout_model"
        )


def agentscope_chat_model(model: Any, task: Task) -> Any:
    """An AgentScope ``OpenAIChatModel`` talking to ``model``'s OpenAI API (not streaming), with
    the taskset's ``rollout_args`` as generation arguments."""
    from agentscope.model import OpenAIChatModel

    client = model.get_openai_async_client()
    args = task.rollout_args
    kwargs: dict[str, Any] = {}
    for key in ("temperature", "top_p", "max_tokens", "seed", "stop"):
        value = getattr(args, key, None)
        if value is not None:
            kwargs[key] = value
    top_k = getattr(args, "top_k", None)
    if top_k is not None:
        kwargs["extra_body"] = {"top_k": top_k}
    chat_model = OpenAIChatModel(
        model_name=getattr(model, "model_name", None) or "rollout",
        api_key=getattr(model, "api_key", None) or "EMPTY",
        stream=False,
        generate_kwargs=kwargs,
    )
    chat_model.client = client  # the wrapper's client: base URL, key, no retries
    return chat_model


def clear_history(model: Any) -> None:
    """Drop calls recorded before this run (e.g. by an attempt the runner retries)."""
    model.extract_experience_from_history(clear_history=True)


def context_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the OpenAI API's refusal of a conversation that no
    longer fits ``max_model_len`` (400 ``context_length_exceeded``): the agent's episode ends
    there, as a multi-turn workflow's does, instead of failing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "code", None) == "context_length_exceeded":
            return True
        current = current.__cause__ or current.__context__
    return False


def react_agent(name: str, sys_prompt: str, chat_model: Any, toolkit: Any, max_iters: int) -> Any:
    """AgentScope's ``ReActAgent`` as the workflows here run it: OpenAI chat format, in-memory
    history, no console output."""
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.memory import InMemoryMemory

    agent = ReActAgent(
        name=name,
        sys_prompt=sys_prompt,
        model=chat_model,
        formatter=OpenAIChatFormatter(),
        toolkit=toolkit,
        memory=InMemoryMemory(),
        max_iters=max_iters,
    )
    agent.set_console_output_enabled(False)
    return agent


async def reply_or_none(agent: Any, question: str, structured_model: Any = None) -> Any:
    """The agent's reply to ``question`` from the user; ``None`` when the conversation outgrew
    ``max_model_len`` on the way (:func:`context_exhausted`): the episode ends there, unanswered."""
    from agentscope.message import Msg

    try:
        return await agent.reply(Msg("user", question, "user"), structured_model=structured_model)
    except Exception as exc:
        if not context_exhausted(exc):
            raise
        return None


def prompt_hash(exp: Experience) -> str:
    """A digest of the prompt tokens of a recorded call (``env_state_hash`` for GiGPO)."""
    ids = exp.tokens[: exp.prompt_length].tolist()
    return hashlib.sha256(repr(ids).encode()).hexdigest()[:16]


def finish_steps(
    steps: list[tuple[Experience, dict[str, Any]]],
    *,
    reward: float,
    run: int,
    info: dict[str, Any],
    metrics: dict[str, float],
) -> list[Experience]:
    """Number the recorded calls as steps of one episode and broadcast ``reward``.

    ``steps`` is ``(experience, step_info)`` in call order; ``step_info`` holds the step's
    ``step_reward`` (default: 0, and the rest of ``reward`` lands on the last step). Episode
    ``info`` and ``metrics`` go on the last step only.
    """
    import torch

    out = []
    total = 0.0
    last = len(steps) - 1
    for index, (exp, step_info) in enumerate(steps):
        exp.eid.run = run
        exp.eid.step = index
        exp.reward = float(reward)
        if exp.action_mask is None:
            exp.action_mask = torch.ones(exp.response_length, dtype=torch.bool)
        step_reward = float(step_info.get("step_reward", 0.0))
        if index == last:
            step_reward += float(reward) - (total + step_reward)
        total += step_reward
        exp.info = {
            **(exp.info or {}),
            **step_info,
            "step": index,
            "step_reward": step_reward,
            "env_state_hash": step_info.get("env_state_hash") or prompt_hash(exp),
        }
        if index == last:
            exp.info.update(info)
            exp.metrics = {**(exp.metrics or {}), **metrics}
        out.append(exp)
    return out


# -- answers ---------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def reference_answer(truth: Any) -> str:
    """The answer in a taskset's truth: after ``####`` (GSM8K), else the last ``\\boxed{}``,
    else the text itself."""
    text = "" if truth is None else str(truth)
    if "####" in text:
        return text.split("####")[-1].strip()
    return (last_boxed(text) or text).strip()


def final_answer(response: str) -> str:
    """The answer in a reply: the last ``\\boxed{}``, else the whole reply."""
    text = response or ""
    boxed = last_boxed(text)
    return (boxed if boxed is not None else text).strip()


_FRAC = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_TEXT = re.compile(r"\\(?:text|mathrm|mbox)\{([^{}]*)\}")
# A word of two or more letters that is not a LaTeX command: prose.
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


def _normalise(text: str) -> str:
    s = text.strip().strip("$").strip()
    s = _TEXT.sub(r"\1", s)
    for junk in ("\\!", "\\,", "\\;", "\\ ", "\\left", "\\right", "\\%", "%", "\\$", "^\\circ", "^{\\circ}"):
        s = s.replace(junk, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact number (integers, decimals, ``a/b``, ``\\frac{a}{b}``, thousands
    separators, a leading ``$`` or trailing ``%`` ignored), or ``None``."""
    s = _normalise(text)
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    m = _FRAC.match(s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    if len(s) > 100 or not re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)(/[-+]?\d+(\.\d*)?)?", s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(answer: str, truth: str) -> bool:
    """Whether ``answer`` equals ``truth`` (both bare answers).

    Numbers compare exactly; otherwise the normalised texts compare equal; otherwise, when
    ``trinity-plugins-math`` is installed, math-verify decides through
    ``trinity_math.verify.math_equal`` (bounded in time, from any thread), unless the answer
    is prose (a word of two or more letters outside LaTeX commands). Without it, symbolic
    answers that differ in writing count as different.
    """
    if not answer:
        return False
    a, t = as_number(answer), as_number(truth)
    if a is not None and t is not None:
        return a == t
    if _normalise(answer) == _normalise(truth):
        return True
    if _PROSE.search(_normalise(answer)):
        return False  # a sentence, not an answer (math-verify would pick a number out of it)
    try:
        from trinity_math.verify import math_equal
    except ImportError:
        return False
    return bool(math_equal(answer, truth).equal)


def math_reward(response: str, truth: Any) -> float:
    """1.0 when the reply's final answer (last ``\\boxed{}``, else the reply) equals the truth's
    (after ``####``, else its last ``\\boxed{}``, else the text), else 0.0."""
    return 1.0 if answers_match(final_answer(response), reference_answer(truth)) else 0.0


# -- tools -----------------------------------------------------------------------------------

TOOL_NAMES = ("calculator", "python")

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression and return its value. Supports numbers, "
            "+ - * / // % ** (or ^), parentheses, the constants pi and e, and the functions "
            "abs round min max sqrt exp log log2 log10 sin cos tan floor ceil factorial comb "
            "perm gcd lcm."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "The expression, e.g. (48 + 24) / 3"}
            },
            "required": ["expression"],
        },
    },
}

PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "execute_python_code",
        "description": (
            "Execute Python code in a fresh sandboxed interpreter (no network, limited time and "
            "memory) and return its return code, stdout and stderr. Print the values you need."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


def _text_response(text: str) -> Any:
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    return ToolResponse(content=[TextBlock(type="text", text=text)])


async def calculator_tool(expression: str = "") -> Any:
    """The ``calculator`` tool: :func:`~trinity_agents.sandbox.calculate`, errors as text."""
    from trinity_agents.sandbox import CalculatorError, calculate

    try:
        return _text_response(calculate(expression))
    except CalculatorError as exc:
        return _text_response(f"Error: {exc}")


def python_tool(timeout: float, memory_mb: int | None) -> Any:
    """The ``execute_python_code`` tool bound to these limits."""

    async def execute_python_code(code: str = "") -> Any:
        from trinity_agents.sandbox import run_python

        result = await asyncio.to_thread(run_python, code, timeout=timeout, memory_mb=memory_mb)
        return _text_response(result.to_text())

    return execute_python_code


def build_toolkit(tools: list[str], *, python_timeout: float, python_memory_mb: int | None) -> Any:
    """An AgentScope ``Toolkit`` with the named tools (``calculator``, ``python``)."""
    from agentscope.tool import Toolkit

    toolkit = Toolkit()
    for name in tools:
        if name == "calculator":
            toolkit.register_tool_function(
                calculator_tool, func_name="calculator", json_schema=CALCULATOR_SCHEMA
            )
        elif name == "python":
            toolkit.register_tool_function(
                python_tool(python_timeout, python_memory_mb),
                func_name="execute_python_code",
                json_schema=PYTHON_SCHEMA,
            )
    return toolkit


def run_blocking(workflow: Workflow) -> list[Experience]:
    """``run()`` of the async AgentScope workflows: ``run_async()`` on an event loop of its own
    (the runner awaits ``run_async`` itself; this is for callers without a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(workflow.run_async())
    raise RuntimeError(f"{type(workflow).__name__}.run() was called inside an event loop; await run_async()")


# -- workflows -------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are an agent that solves math problems with tools. Work out the problem step by step; "
    "use the calculator for arithmetic, or write and run Python code to compute or check your "
    "answer. Give your final answer within \\boxed{}."
)


def _structured_model() -> Any:
    from pydantic import BaseModel, Field

    class FinalAnswer(BaseModel):
        result: str = Field(
            description="Your solution of the problem, with the final answer in boxed form, e.g. \\boxed{42}"
        )

    return FinalAnswer


class AgentScopeReActWorkflow(Workflow):
    """An AgentScope ReAct agent solving the row's problem with the calculator and Python tools
    (``agentscope_react_workflow``; see the module docstring).

    ``workflow_args``: ``max_iters`` (reasoning-acting iterations, default 10), ``tools`` (a
    subset of ``["calculator", "python"]``, default both), ``python_timeout`` (seconds, 10),
    ``python_memory_mb`` (512), ``structured_output`` (default true: the agent ends by calling
    ``generate_response`` with its ``result``, as in Trinity-RFT), ``type`` (``gsm8k``, the only
    template, as in Trinity-RFT). The system prompt is the taskset's ``format.system_prompt``
    when set.
    """

    is_async: ClassVar[bool] = True
    can_reset: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = False

    registered_name: ClassVar[str] = "agentscope_react_workflow"
    default_max_iters: ClassVar[int] = 10
    default_structured_output: ClassVar[bool] = True
    task_types: ClassVar[tuple[str, ...] | None] = ("gsm8k",)

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    def reset(self, task: Task) -> None:
        self.task = task
        self.repeat_times = task.repeat_times
        args = dict(task.workflow_args or {})
        name = self.registered_name
        if self.task_types is not None:
            kind = args.get("type", self.task_types[0])
            if kind not in self.task_types:
                raise ValueError(
                    f"{name}: workflow_args.type {kind!r} is not supported; use one of {list(self.task_types)}"
                )
        self.max_iters = positive_int(args.get("max_iters", self.default_max_iters), "max_iters")
        tools = args.get("tools", list(TOOL_NAMES))
        if isinstance(tools, str):
            tools = [tools]
        unknown = [t for t in tools or () if t not in TOOL_NAMES]
        if unknown:
            raise ValueError(f"{name}: workflow_args.tools {unknown} unknown; available: {list(TOOL_NAMES)}")
        self.tools = list(dict.fromkeys(tools or ()))
        self.python_timeout = float(args.get("python_timeout", 10))
        if not self.python_timeout > 0:
            raise ValueError(f"{name}: workflow_args.python_timeout must be positive")
        memory = args.get("python_memory_mb", 512)
        self.python_memory_mb = None if memory is None else positive_int(memory, "python_memory_mb")
        self.structured_output = as_bool(
            args.get("structured_output", self.default_structured_output), "structured_output"
        )
        self.query = task.task_desc
        if self.query is None:
            raise ValueError(
                f"{name}: task {task.index} has no column {task.format_args.prompt_key!r} (format.prompt_key)"
            )
        self.truth = task.truth

    def system_prompt(self) -> str:
        return self.task.format_args.system_prompt or SYSTEM_PROMPT

    def run(self) -> list[Experience]:
        return run_blocking(self)

    def build_agent(self) -> Any:
        toolkit = build_toolkit(
            self.tools, python_timeout=self.python_timeout, python_memory_mb=self.python_memory_mb
        )
        chat_model = agentscope_chat_model(self.model, self.task)
        return react_agent("math_react_agent", self.system_prompt(), chat_model, toolkit, self.max_iters)

    async def run_async(self) -> list[Experience]:
        require_agentscope(self.registered_name)
        check_model_for_agents(self.model, self.registered_name, tools=True)
        clear_history(self.model)
        agent = self.build_agent()
        structured = _structured_model() if self.structured_output else None
        reply = await reply_or_none(agent, self.query, structured)
        metadata = reply.metadata if reply is not None and isinstance(reply.metadata, dict) else {}
        text = (reply.get_text_content() if reply is not None else None) or ""
        answer_text = str(metadata["result"]) if "result" in metadata else text
        reward = math_reward(answer_text, self.truth)

        recorded = self.model.extract_experience_from_history(clear_history=True)
        if not recorded:
            return []
        memory = await agent.memory.get_memory()
        tool_calls = sum(len(e.info.get("tool_calls") or ()) for e in recorded)
        info = {
            "final_answer": final_answer(answer_text),
            "reference_answer": reference_answer(self.truth),
            "accuracy": reward,
            "model_calls": len(recorded),
            "tool_call_count": tool_calls,
            "structured_output": "result" in metadata,
            "max_iters_reached": len(recorded) > self.max_iters,
            "max_model_len_reached": reply is None,
        }
        metrics = {
            "accuracy": reward,
            "model_calls": float(len(recorded)),
            "tool_call_count": float(tool_calls),
            "react_memory_length": float(len(memory)),
            "max_iters_reached": float(len(recorded) > self.max_iters),
            "max_model_len_reached": float(reply is None),
        }
        steps = [(exp, {}) for exp in recorded]
        return finish_steps(steps, reward=reward, run=self.run_id_base, info=info, metrics=metrics)


class AgentScopeReactMathWorkflow(AgentScopeReActWorkflow):
    """``agentscope_react_math_workflow``: the same agent for Trinity-RFT's
    ``agentscopev1_tool_react_*`` configs (DAPO rows ``prompt`` / ``solution``, GSM8K rows too);
    no ``type`` argument."""

    registered_name: ClassVar[str] = "agentscope_react_math_workflow"
    task_types: ClassVar[tuple[str, ...] | None] = None


class AgentScopeV0ReactMathWorkflow(AgentScopeReactMathWorkflow):
    """``agentscopev0_react_math_workflow``: Trinity-RFT's AgentScope 0.x agent, run with
    AgentScope 1.x: 5 iterations and no structured output (the answer is the final text)."""

    registered_name: ClassVar[str] = "agentscopev0_react_math_workflow"
    default_max_iters: ClassVar[int] = 5
    default_structured_output: ClassVar[bool] = False


__all__ = [
    "AgentScopeMissingError",
    "AgentScopeReActWorkflow",
    "AgentScopeReactMathWorkflow",
    "AgentScopeV0ReactMathWorkflow",
    "agentscope_install_hint",
    "answers_match",
    "build_toolkit",
    "context_exhausted",
    "final_answer",
    "math_reward",
    "react_agent",
    "reference_answer",
    "reply_or_none",
    "require_agentscope",
]
