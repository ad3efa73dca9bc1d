"""WebShop's purchase reward: how well a bought product (with its chosen options and price)
matches a goal.

    reward = (matched attributes + matched options + [price <= price_upper])
             / (#goal attributes + #goal options + 1)  *  r_type

``r_type`` ∈ {0, 0.1, 0.5, 1} says whether the product is of the wanted type (same search query,
two shared breadcrumb levels, or enough shared title nouns). Argument shapes follow WebShop's
``web_agent_site.engine.goal``: products use its field names (``Title``, ``Attributes``,
``BulletPoints``, ``Description``, ``query``, ``product_category``, ``name``) and goals use
``attributes``, ``goal_options`` (dict or list), ``price_upper``, ``query``, ``product_category``,
``name``. Where WebShop runs spaCy over ``name`` to find its nouns, we read the precomputed
``title_nouns`` list (and fall back to a plain word split when it is missing).
"""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz import fuzz

#: Option names matched exactly rather than fuzzily (a "large" is not an "x-large").
EXACT_MATCH_OPTS = ("size",)
#: rapidfuzz ``token_set_ratio`` above which two strings count as the same attribute / option.
FUZZY_THRESHOLD = 85

_WORD = re.compile(r"[a-z][a-z0-9'-]*")
# Used only when a product or goal carries no precomputed ``title_nouns``.
_NOT_NOUNS = frozenset(
    [
        "a",
        "an",
        "and",
        "the",
        "for",
        "with",
        "of",
        "in",
        "on",
        "to",
        "by",
        "from",
        "at",
        "or",
        "'s",
        "free",
        "long",
        "lasting",
        "new",
        "natural",
        "best",
        "x",
        "small",
        "medium",
        "large",
        "pack",
        "oz",
        "fl",
        "ounce",
        "inch",
    ]
)


def normalize_option(value: str) -> str:
    """Lower-case and trim an option value (WebShop also canonicalises colour spellings)."""
    return " ".join(str(value).lower().split())


def title_nouns(item: dict[str, Any]) -> list[str]:
    """The nouns of ``item['name']``: the precomputed ``title_nouns`` when present."""
    nouns = item.get("title_nouns")
    if nouns is not None:
        return [str(n).lower() for n in nouns]
    return [w for w in _WORD.findall(str(item.get("name", "")).lower()) if w not in _NOT_NOUNS]


def _categories(text: str) -> set[str]:
    return {part.strip() for part in str(text).split("›") if part.strip()}


def get_type_reward(purchased_product: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """``r_type`` and what it was decided from (``query_match``, ``category_match``, ``title_score``)."""
    query_match = purchased_product.get("query") == goal.get("query")
    category_match = (
        len(
            _categories(purchased_product.get("product_category", ""))
            & _categories(goal.get("product_category", ""))
        )
        >= 2
    )
    desired = set(title_nouns(goal))
    purchased = set(title_nouns(purchased_product))
    # WebShop gives a neutral 0.2 when the goal's title has no noun at all.
    title_score = len(purchased & desired) / len(desired) if desired else 0.2

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _text_of(product: dict[str, Any]) -> tuple[str, str, str]:
    return (
        str(product.get("Title", "")).lower(),
        " ".join(product.get("BulletPoints", []) or []).lower(),
        str(product.get("Description", "")).lower(),
    )


def get_attribute_reward(purchased_product: dict[str, Any], goal: dict[str, Any]) -> tuple[float, int]:
    """``(r_att, matches)``: goal attributes found (fuzzily) among the product's attributes, or
    verbatim in its title, features or description."""
    goal_attrs = list(goal.get("attributes", []))
    product_attrs = list(purchased_product.get("Attributes", []))
    texts = _text_of(purchased_product)
    matches = 0
    for g_attr in goal_attrs:
        if any(fuzz.token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in product_attrs) or any(
            g_attr.lower() in t for t in texts
        ):
            matches += 1
    r_att = matches / len(goal_attrs) if goal_attrs else 0.0
    return r_att, matches


def get_option_reward(
    purchased_product: dict[str, Any],
    goal_options: list[str] | dict[str, str],
    purchased_options: dict[str, str],
) -> tuple[float | None, int]:
    """``(r_option, matches)``: purchased options that match a goal option (exactly for sizes,
    fuzzily otherwise) or occur verbatim in the product's text. ``r_option`` is ``None`` when
    the goal has no options."""
    values = goal_options.values() if isinstance(goal_options, dict) else goal_options
    wanted = [normalize_option(v) for v in values]
    texts = _text_of(purchased_product)
    matches = 0
    for name, value in (purchased_options or {}).items():
        value = normalize_option(value)
        if str(name).lower() in EXACT_MATCH_OPTS:
            matched = value in wanted
        else:
            matched = any(fuzz.token_set_ratio(w, value) > FUZZY_THRESHOLD for w in wanted)
        if matched or any(value in t for t in texts):
            matches += 1
    r_option = matches / len(wanted) if wanted else None
    return r_option, matches


def get_reward(
    purchased_product: dict[str, Any],
    goal: dict[str, Any],
    price: float,
    options: dict[str, str],
    verbose: bool = False,
    **kwargs: Any,
) -> float | tuple[float, dict[str, Any]]:
    """WebShop's reward for buying ``purchased_product`` at ``price`` with ``options``
    (``{option name: chosen value}``) when the goal was ``goal``.

    Returns the reward in [0, 1]; with ``verbose=True`` returns ``(reward, info)`` where
    ``info`` holds ``r_type``, ``r_att``, ``w_att``, ``r_option``/``w_option`` (when the goal
    has options), ``r_price``/``w_price`` (when it has a price ceiling), ``query_match``,
    ``category_match`` and ``title_score``.
    """
    type_info = get_type_reward(purchased_product, goal)
    price_upper = float(goal.get("price_upper", 0) or 0)
    r_price = (price <= price_upper) if price_upper > 0 else None
    r_att, attr_matches = get_attribute_reward(purchased_product, goal)
    goal_options = goal.get("goal_options", {}) or {}
    r_option, option_matches = get_option_reward(purchased_product, goal_options, options)

    denominator = len(goal.get("attributes", [])) + len(goal_options) + 1
    reward = (attr_matches + option_matches + bool(r_price)) / denominator * type_info["r_type"]
    if not verbose:
        return reward
    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal.get("attributes", [])) / denominator,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    if r_price is not None:
        info["r_price"] = r_price
        info["w_price"] = 1 / denominator
    return reward, info
