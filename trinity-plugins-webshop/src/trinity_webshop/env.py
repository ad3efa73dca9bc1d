"""The built-in WebShop environment, speaking WebShop's text protocol (``web_agent_text_env``,
``observation_mode='text'``).

Pages are rendered as their visible texts joined by ``" [SEP] "``::

    search   WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search
    results  Instruction: [SEP] <goal> [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP]
             Next > [SEP] B0ABCDEFGH [SEP] <title> [SEP] $12.99 [SEP] ...
    item     Instruction: [SEP] <goal> [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] small [SEP]
             large [SEP] ... [SEP] <title> [SEP] Price: $12.99 [SEP] Rating: 4.5 [SEP] Description [SEP]
             Features [SEP] Reviews [SEP] Buy Now
    sub page Instruction: [SEP] <goal> [SEP] Back to Search [SEP] < Prev [SEP] <description|features|reviews>

Actions are ``search[query]`` (only where there is a search bar) and ``click[button]`` with a
button of the current page (case-insensitive; :meth:`WebShopSession.get_available_actions` lists
them in lower case, as WebShop does). Unlike WebShop, which silently ignores an action it cannot
perform, an invalid action returns an observation starting with ``Invalid action:`` that says
what to do instead, and is counted in ``invalid_actions``. An episode ends when ``Buy Now`` is
clicked (reward from :func:`trinity_webshop.reward.get_reward`) or after ``max_steps`` steps
(reward 0, ``info['truncated']``).

:class:`WebShopEnv` holds only the immutable catalog; every episode lives in its own
:class:`WebShopSession`, so one env serves any number of concurrent episodes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from trinity_webshop.catalog import PRODUCT_WINDOW, Catalog, default_catalog
from trinity_webshop.reward import get_reward

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
END_BUTTON = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
DEFAULT_MAX_STEPS = 15
INVALID_PREFIX = "Invalid action: "


def parse_action(action: str) -> tuple[str, str | None]:
    """Split ``"name[arg]"`` into ``(name, arg)``; ``(text, None)`` when it has no brackets."""
    text = str(action).strip()
    start, end = text.find("["), text.rfind("]")
    if start <= 0 or end < start or end != len(text) - 1:
        return text, None
    return text[:start].strip().lower(), text[start + 1 : end].strip()


@dataclass
class WebShopSession:
    """One episode: the goal, the page the agent is on and the counters. Not shared."""

    catalog: Catalog
    goal_index: int
    session_id: str
    max_steps: int = DEFAULT_MAX_STEPS
    page_kind: str = "search"  # search | results | item | sub | done
    keywords: str = ""
    results: list[str] = field(default_factory=list)
    page: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str = ""
    notice: str = ""
    env_steps: int = 0
    invalid_actions: int = 0
    done: bool = False
    truncated: bool = False
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)

    @property
    def goal(self) -> dict[str, Any]:
        return self.catalog.goal(self.goal_index)

    @property
    def instruction_text(self) -> str:
        return self.goal["instruction_text"]

    def get_instruction_text(self) -> str:
        """The goal's instruction, as WebShop's env method of the same name."""
        return self.instruction_text

    # -- rendering ------------------------------------------------------------------------

    def _pages(self) -> int:
        return max(1, -(-len(self.results) // PRODUCT_WINDOW))

    def _buttons(self) -> list[str]:
        """Clickable texts of the current page, in page order and original case."""
        if self.page_kind == "search":
            return ["Search"]
        if self.page_kind == "results":
            buttons = [BACK_TO_SEARCH]
            if self.page > 1:
                buttons.append(PREV_PAGE)
            if self.page < self._pages():
                buttons.append(NEXT_PAGE)
            return buttons + self._page_asins()
        if self.page_kind == "item":
            product = self.catalog.product(self.asin or "")
            values = [v for vs in product["options"].values() for v in vs]
            return [BACK_TO_SEARCH, PREV_PAGE, *values, *SUB_PAGES, END_BUTTON]
        if self.page_kind == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def _page_asins(self) -> list[str]:
        start = (self.page - 1) * PRODUCT_WINDOW
        return self.results[start : start + PRODUCT_WINDOW]

    @property
    def observation(self) -> str:
        """The current page in WebShop's simple text mode."""
        head = ["Instruction:", self.instruction_text]
        if self.page_kind == "search":
            parts = ["WebShop", *head, "Search"]
        elif self.page_kind == "results":
            parts = [*head, BACK_TO_SEARCH, f"Page {self.page} (Total results: {len(self.results)})"]
            parts += [b for b in (PREV_PAGE, NEXT_PAGE) if b in self._buttons()]
            for asin in self._page_asins():
                product = self.catalog.product(asin)
                parts += [asin, product["Title"], product["Price"]]
        elif self.page_kind == "item":
            product = self.catalog.product(self.asin or "")
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE]
            for name, values in product["options"].items():
                parts += [name, *values]
            parts += [
                product["Title"],
                f"Price: {product['Price']}",
                f"Rating: {product.get('Rating', 'N.A.')}",
            ]
            parts += [*SUB_PAGES, END_BUTTON]
        elif self.page_kind == "sub":
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE, *self._sub_page_texts()]
        else:
            parts = [
                "Thank you for shopping with us!", "Purchased", "asin", str(self.asin), "options",
                json.dumps(self.options), "Your score (min 0.0, max 1.0)", f"{self.reward:.4f}",
            ]  # fmt: skip
        text = SEP.join(parts)
        return f"{self.notice}{SEP}{text}" if self.notice else text

    def _sub_page_texts(self) -> list[str]:
        product = self.catalog.product(self.asin or "")
        if self.sub_page == "Description":
            return [product.get("Description", "")]
        if self.sub_page == "Features":
            return list(product.get("BulletPoints", []))
        texts = []
        for review in product.get("Reviews", []):
            texts += [review.get("title", ""), str(review.get("score", "")), review.get("body", "")]
        return texts

    def get_available_actions(self) -> dict[str, Any]:
        """``{"has_search_bar": bool, "clickables": [lower-case button texts]}`` (WebShop's shape)."""
        return {
            "has_search_bar": self.page_kind == "search",
            "clickables": [b.lower() for b in self._buttons()],
        }

    # -- stepping -------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply ``action``; return ``(observation, reward, done, info)`` where ``info`` has
        ``invalid`` (bool), ``error`` (str or None) and ``truncated`` (bool)."""
        if self.done:
            raise RuntimeError(
                f"session {self.session_id!r} is over (after {self.env_steps} steps); start a new one with env.reset()"
            )
        self.env_steps += 1
        self.notice = ""
        error = self._apply(action)
        if error is not None:
            self.invalid_actions += 1
        if not self.done and self.env_steps >= self.max_steps:
            self.done = self.truncated = True
        observation = INVALID_PREFIX + error if error is not None else self.observation
        info = {"invalid": error is not None, "error": error, "truncated": self.truncated}
        return observation, self.reward, self.done, info

    def _apply(self, action: str) -> str | None:
        """Perform ``action``; return an error message (for the agent) when it is invalid."""
        name, arg = parse_action(action)
        available = self.get_available_actions()
        if name == "search" and arg is not None:
            if not available["has_search_bar"]:
                return f"there is no search bar on this page; click[{BACK_TO_SEARCH}] first."
            if not arg:
                return "the search query is empty; write the words to search for inside search[...]."
            self.keywords = arg.lower()
            self.results = self.catalog.search(self.keywords)
            self.page_kind, self.page, self.asin, self.options = "results", 1, None, {}
            return None
        if name != "click" or arg is None:
            return (
                f"{str(action).strip()[:80]!r} is not an action; reply with search[your query] or "
                "click[button text], e.g. <action>click[Buy Now]</action>."
            )
        button = arg.lower()
        if button == "search" and available["has_search_bar"]:
            return "to search, write the query inside search[...], e.g. search[red running shoes]."
        if button not in available["clickables"]:
            shown = ", ".join(available["clickables"]) or "none (the episode is over)"
            return f"there is no button {arg!r} on this page. Buttons on this page: {shown}."
        self._click(button)
        return None

    def _click(self, button: str) -> None:
        if button == BACK_TO_SEARCH.lower():
            self.page_kind, self.keywords, self.results, self.asin, self.options = "search", "", [], None, {}
        elif button == NEXT_PAGE.lower():
            self.page += 1
        elif button == PREV_PAGE.lower():
            if self.page_kind == "results":
                self.page -= 1
            elif self.page_kind == "item":
                self.page_kind, self.asin, self.options = "results", None, {}
            else:
                self.page_kind = "item"
        elif button == END_BUTTON.lower():
            self._buy()
        elif self.page_kind == "results":
            self.page_kind, self.asin, self.options = "item", button.upper(), {}
        elif button in (s.lower() for s in SUB_PAGES):
            self.page_kind, self.sub_page = "sub", button.capitalize()
        else:  # an option value of the item page; the first option group holding it wins
            product = self.catalog.product(self.asin or "")
            group = next(n for n, vs in product["options"].items() if button in (v.lower() for v in vs))
            self.options[group] = button
            self.notice = f"You have clicked {button}."

    def _buy(self) -> None:
        product = self.catalog.product(self.asin or "")
        reward, info = get_reward(
            product, self.goal, price=self.catalog.price(product), options=dict(self.options), verbose=True
        )
        self.reward, self.reward_info = float(reward), info
        self.page_kind, self.done = "done", True


class WebShopEnv:
    """The shared part of the environment: the catalog. Start episodes with :meth:`reset`.

    ``split`` (``train`` / ``test`` / ``None``) restricts the goals a session without an explicit
    goal index is drawn from. ``max_steps`` is the default step limit of new sessions.
    """

    def __init__(
        self, catalog: Catalog | None = None, split: str | None = None, max_steps: int = DEFAULT_MAX_STEPS
    ):
        self.catalog = catalog if catalog is not None else default_catalog()
        self.split = split
        self.max_steps = max_steps

    @property
    def num_goals(self) -> int:
        return len(self.catalog.goals)

    def reset(
        self, session_id: int | str | None = None, goal_index: int | None = None, max_steps: int | None = None
    ) -> WebShopSession:
        """Start an episode. An ``int`` ``session_id`` doubles as the goal index (WebShop's
        convention); another ``session_id`` picks a goal of ``split`` deterministically from its
        text; no ``session_id`` picks one at random."""
        if goal_index is None:
            if isinstance(session_id, int) and not isinstance(session_id, bool):
                goal_index = session_id
            else:
                candidates = self.catalog.goal_indices(self.split)
                if not candidates:
                    raise ValueError(f"no goals in split {self.split!r} of {self.catalog.source}")
                rng = random.Random(str(session_id)) if session_id is not None else random.Random()
                goal_index = rng.choice(candidates)
        self.catalog.goal(goal_index)  # validates the index with a clear message
        if session_id is None:
            session_id = f"goal-{goal_index}-{random.getrandbits(32):08x}"
        limit = self.max_steps if max_steps is None else max_steps
        if limit < 1:
            raise ValueError(f"max_steps must be at least 1, got {limit}")
        return WebShopSession(self.catalog, goal_index, str(session_id), max_steps=limit)
