"""``webshop_workflow``: a multi-turn shopping episode against the WebShop environment.

Each turn the model sees the page as ``Observation: ...`` and answers with its reasoning and one
``<action>search[...]</action>`` or ``<action>click[...]</action>``. The episode ends on
``Buy Now`` or after ``max_env_steps`` turns. The whole conversation becomes one Experience via
``model.convert_messages_to_experience`` (only assistant tokens in ``action_mask``), with the
purchase reward as ``reward``.

Task rows (see :mod:`trinity_webshop.tasks`) carry ``goal_index``; rows in Trinity-RFT's format,
whose prompt column holds the session id, work too. ``workflow_args``:

    env             builtin (default; the catalog shipped here) | webshop (the original package)
    max_env_steps   most turns per episode (default 15)
    catalog_dir     builtin only: a folder with products.jsonl / goals.jsonl (default: shipped data)
    num_products, human_goals   webshop only: passed to the original WebAgentTextEnv
    no_purchase_reward          reward of an episode that ends without buying (default 0.0;
                                Trinity-RFT's workflow uses -0.1)
    goal_index_key  task column holding the goal index (default goal_index)
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import TYPE_CHECKING, Any

from trinity.workflow import Task, Workflow
from trinity_webshop.env import DEFAULT_MAX_STEPS

if TYPE_CHECKING:
    from trinity.experience import Experience

SYSTEM_PROMPT = """You are a shopping agent in a text-based web shop. Follow the Instruction and buy the product that matches it best: the right kind of product, with the requested attributes and options, within the price limit.

## Observations
Each page is shown as texts separated by [SEP]. The search page ends with "Search". On a results page every product is its id (like B0ABC12345) followed by its title and price. On a product page the option groups (e.g. size, color) are followed by their values, then the title, price, and the buttons Description, Features, Reviews and Buy Now. "Back to Search", "Next >" and "< Prev" move between pages.

## Actions
Take exactly one action per turn, wrapped in <action></action>:
- <action>search[your query]</action> when the page has a search bar (the search page only).
- <action>click[button text]</action> to click a button or product id on the current page, e.g. <action>click[Next >]</action>, <action>click[B0ABC12345]</action>, <action>click[large]</action>, <action>click[Buy Now]</action>.
Select every requested option on the product page before clicking Buy Now.

Think briefly in <think></think>, then give the action. Buy within {max_steps} steps. Never ask the user anything."""

_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
ENV_KINDS = ("builtin", "webshop")


def extract_action(reply: str) -> str:
    """The text inside the first ``<action>...</action>`` of ``reply``; ``""`` when there is none."""
    match = _ACTION.search(reply or "")
    return match.group(1).strip() if match else ""


def format_observation(observation: str) -> str:
    return f"Observation: {observation}"


_envs: dict[tuple[Any, ...], Any] = {}
_envs_lock = threading.Lock()


def get_env(workflow_args: dict[str, Any]) -> Any:
    """The process-wide environment for ``workflow_args`` (built once; sessions are per episode)."""
    kind = str(workflow_args.get("env", "builtin")).lower()
    if kind not in ENV_KINDS:
        raise ValueError(
            f"workflow_args.env must be one of {list(ENV_KINDS)}, got {workflow_args.get('env')!r}"
        )
    if kind == "builtin":
        key: tuple[Any, ...] = (kind, workflow_args.get("catalog_dir"))
    else:
        key = (kind, workflow_args.get("num_products"), bool(workflow_args.get("human_goals", True)))
    with _envs_lock:
        if key not in _envs:
            if kind == "builtin":
                from trinity_webshop.catalog import default_catalog, load_catalog
                from trinity_webshop.env import WebShopEnv

                catalog = load_catalog(key[1]) if key[1] else default_catalog()
                _envs[key] = WebShopEnv(catalog)
            else:
                from trinity_webshop.original import OriginalWebShopEnv

                _envs[key] = OriginalWebShopEnv(num_products=key[1], human_goals=key[2])
        return _envs[key]


def goal_index_of(task: Task, key: str = "goal_index") -> int:
    """The goal index of a task row: column ``key`` (or ``session_id``), else the prompt text."""
    raw = task.raw_task or {}
    value = raw.get(key, raw.get("session_id"))
    if value is None:
        value = task.task_desc
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"webshop task {task.index} of taskset {task.taskset_name!r} has no goal index: expected an integer "
            f"in column {key!r} (or 'session_id', or the prompt column), got row keys {sorted(raw)}; "
            "write tasksets with `python -m trinity_webshop.tasks OUT_DIR`"
        ) from None


def _rollout_kwargs(rollout_args: Any) -> dict[str, Any]:
    if hasattr(rollout_args, "model_dump"):
        args = rollout_args.model_dump(exclude_none=True)
    else:
        args = {k: v for k, v in dict(rollout_args or {}).items() if v is not None}
    args["n"] = 1  # one reply per turn; repeats are separate episodes
    return args


class WebShopWorkflow(Workflow):
    """Multi-turn WebShop episode -> one Experience (see the module docstring for arguments)."""

    can_reset = True
    can_repeat = False
    is_async = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    def reset(self, task: Task) -> None:
        """Point this (reusable) instance at ``task``; episode state lives in :meth:`run_async`."""
        self.task = task
        self.repeat_times = task.repeat_times
        args = dict(task.workflow_args or {})
        self.max_env_steps = int(args.get("max_env_steps", DEFAULT_MAX_STEPS))
        if self.max_env_steps < 1:
            raise ValueError(f"workflow_args.max_env_steps must be at least 1, got {self.max_env_steps}")
        self.no_purchase_reward = float(args.get("no_purchase_reward", 0.0))
        self.goal_index = goal_index_of(task, str(args.get("goal_index_key", "goal_index")))
        self.env = get_env(args)

    def run(self) -> list[Experience]:
        """Synchronous entry point (for callers without an event loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async())
        raise RuntimeError("WebShopWorkflow.run() was called inside an event loop; await run_async() instead")

    async def run_async(self) -> list[Experience]:
        """Play one episode and return its Experience."""
        session = self.env.reset(goal_index=self.goal_index, max_steps=self.max_env_steps)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(max_steps=self.max_env_steps)},
            {"role": "user", "content": format_observation(session.observation)},
        ]
        rollout_args = _rollout_kwargs(self.task.rollout_args)
        searches = clicks = 0
        done = False
        while not done:
            replies = await self.model.chat_async(messages, **rollout_args)
            reply = replies[0].response_text or ""
            messages.append({"role": "assistant", "content": reply})
            action = extract_action(reply)
            observation, _, done, info = session.step(action)
            if not info["invalid"]:
                searches += action.lower().startswith("search")
                clicks += action.lower().startswith("click")
            if not done:
                messages.append({"role": "user", "content": format_observation(observation)})

        purchased = done and not session.truncated
        reward = float(session.reward) if purchased else self.no_purchase_reward
        exp = self.model.convert_messages_to_experience(messages)
        exp.reward = reward
        exp.info = {
            **(exp.info or {}),
            "session_id": session.session_id,
            "goal_index": self.goal_index,
            "env_steps": session.env_steps,
            "done": purchased,
            "invalid_actions": session.invalid_actions,
        }
        exp.metrics = {
            **(exp.metrics or {}),
            "env_steps": float(session.env_steps),
            "invalid_actions": float(session.invalid_actions),
            "invalid_action_ratio": session.invalid_actions / session.env_steps,
            "searches": float(searches),
            "clicks": float(clicks),
            "purchased": float(purchased),
            "truncated": float(session.truncated),
            "success": float(purchased and reward >= 1.0),
        }
        return [exp]
