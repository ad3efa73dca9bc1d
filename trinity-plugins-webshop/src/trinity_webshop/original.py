"""Adapter to the original WebShop (princeton-nlp/WebShop, package ``web_agent_site``).

Used when ``workflow_args.env: webshop``. The original package and its data are not on PyPI;
when they cannot be imported, :class:`OriginalWebShopEnv` raises an ``ImportError`` that says how
to install them. Sessions have the same interface as :class:`trinity_webshop.env.WebShopSession`
(``observation``, ``step``, ``get_available_actions``, counters), so the workflow does not care
which environment it talks to.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from trinity_webshop.env import DEFAULT_MAX_STEPS, INVALID_PREFIX, parse_action

INSTALL_HINT = (
    "workflow_args.env is 'webshop', which needs the original WebShop package (`web_agent_site`) and its "
    "product data, and they cannot be imported here ({error}). Install them with "
    "`git clone https://github.com/princeton-nlp/WebShop && cd WebShop && ./setup.sh -d small` "
    "(Python 3.8 and Java, see its README) and run Trinity in that environment, or set "
    "`workflow_args.env: builtin` to use the catalog shipped with trinity-plugins-webshop."
)

# The original simulator keeps a Flask app context and a Lucene searcher; it was written for one
# caller at a time, so every call into it goes through this lock.
_ORIGINAL_LOCK = threading.Lock()


class OriginalWebShopSession:
    """One episode in the original simulator, with invalid actions reported and counted."""

    def __init__(self, text_env: Any, goal_index: int, session_id: str, max_steps: int):
        self._env = text_env
        self.goal_index = goal_index
        self.session_id = session_id
        self.max_steps = max_steps
        self.env_steps = 0
        self.invalid_actions = 0
        self.done = False
        self.truncated = False
        self.reward = 0.0
        with _ORIGINAL_LOCK:
            self._observation, _ = self._env.reset(session=goal_index)

    @property
    def observation(self) -> str:
        return self._observation

    def get_instruction_text(self) -> str:
        with _ORIGINAL_LOCK:
            return self._env.get_instruction_text()

    def get_available_actions(self) -> dict[str, Any]:
        with _ORIGINAL_LOCK:
            return self._env.get_available_actions()

    def _error(self, action: str, available: dict[str, Any]) -> str | None:
        name, arg = parse_action(action)
        if name == "search" and arg is not None:
            if not available["has_search_bar"]:
                return "there is no search bar on this page; click[Back to Search] first."
            return (
                None
                if arg
                else "the search query is empty; write the words to search for inside search[...]."
            )
        if name != "click" or arg is None:
            return f"{action.strip()[:80]!r} is not an action; reply with search[your query] or click[button text]."
        if arg.lower() == "search" or arg.lower() not in available["clickables"]:
            return f"there is no button {arg!r} on this page. Buttons on this page: {', '.join(available['clickables'])}."
        return None

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Same contract as :meth:`trinity_webshop.env.WebShopSession.step`."""
        if self.done:
            raise RuntimeError(f"session {self.session_id!r} is over; start a new one with env.reset()")
        self.env_steps += 1
        error = self._error(str(action), self.get_available_actions())
        if error is None:
            with _ORIGINAL_LOCK:
                self._observation, reward, self.done, _ = self._env.step(str(action))
            self.reward = float(reward or 0.0)
        else:
            self.invalid_actions += 1
        if not self.done and self.env_steps >= self.max_steps:
            self.done = self.truncated = True
        observation = INVALID_PREFIX + error if error is not None else self._observation
        return (
            observation,
            self.reward,
            self.done,
            {"invalid": error is not None, "error": error, "truncated": self.truncated},
        )


class OriginalWebShopEnv:
    """The original simulator's server (products, goals, search index), shared by all sessions.

    ``num_products`` and ``human_goals`` are passed to ``WebAgentTextEnv`` (see its docs);
    loading the full product set needs ~15 GB of memory.
    """

    def __init__(
        self, num_products: int | None = None, human_goals: bool = True, max_steps: int = DEFAULT_MAX_STEPS
    ):
        try:
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        except Exception as err:  # ImportError, or its data files missing at import time
            raise ImportError(INSTALL_HINT.format(error=f"{type(err).__name__}: {err}")) from err
        self._text_env_cls = WebAgentTextEnv
        self.max_steps = max_steps
        with _ORIGINAL_LOCK:
            self._base = WebAgentTextEnv(
                observation_mode="text", num_products=num_products, human_goals=human_goals
            )

    def reset(
        self, session_id: int | str | None = None, goal_index: int | None = None, max_steps: int | None = None
    ) -> OriginalWebShopSession:
        """Start an episode on goal ``goal_index`` (an ``int`` ``session_id`` doubles as one)."""
        if goal_index is None:
            if not isinstance(session_id, int):
                raise ValueError("the original WebShop needs an integer goal index (session id) per task")
            goal_index = session_id
        # A unique prefix keeps concurrent rollouts of the same goal in separate server sessions.
        prefix = f"{uuid.uuid4().hex[:8]}-"
        with _ORIGINAL_LOCK:
            text_env = self._text_env_cls(
                observation_mode="text", server=self._base.server, session_prefix=prefix
            )
        limit = self.max_steps if max_steps is None else max_steps
        return OriginalWebShopSession(text_env, goal_index, f"{prefix}{goal_index}", limit)
