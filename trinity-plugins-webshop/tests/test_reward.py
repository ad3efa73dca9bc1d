"""WebShop's reward, component by component, on hand-computed cases."""

from __future__ import annotations

import pytest

from trinity_webshop import get_reward
from trinity_webshop.reward import get_attribute_reward, get_option_reward, get_type_reward

PRODUCT = {
    "asin": "B0TEST0001",
    "query": "shampoo",
    "product_category": "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
    "name": "Lumora Sulfate Free Shampoo for Dry Hair",
    "Title": "Lumora Sulfate Free Shampoo for Dry Hair",
    "title_nouns": ["lumora", "shampoo", "hair"],
    "Attributes": ["sulfate free", "paraben free", "cruelty free"],
    "BulletPoints": ["Gentle on color treated hair."],
    "Description": "A shampoo for every day.",
    "options": {"size": ["8 fl oz", "16 fl oz"], "scent": ["coconut", "lavender"]},
}


def goal(**overrides):
    base = {
        "asin": "B0TEST0001",
        "query": "shampoo",
        "product_category": PRODUCT["product_category"],
        "name": PRODUCT["name"],
        "title_nouns": PRODUCT["title_nouns"],
        "attributes": ["sulfate free", "paraben free"],
        "goal_options": {"size": "16 fl oz", "scent": "coconut"},
        "price_upper": 20.0,
    }
    base.update(overrides)
    return base


def test_perfect_purchase_scores_one_with_weights():
    reward, info = get_reward(
        PRODUCT, goal(), price=12.5, options={"size": "16 fl oz", "scent": "coconut"}, verbose=True
    )
    assert reward == 1.0
    assert (
        info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_option"] == 1.0 and info["r_price"] is True
    )
    # weights: 2 attributes, 2 options, 1 price over a denominator of 5
    assert (info["w_att"], info["w_option"], info["w_price"]) == (0.4, 0.4, 0.2)
    assert get_reward(PRODUCT, goal(), price=12.5, options={"size": "16 fl oz", "scent": "coconut"}) == 1.0


def test_partial_attribute_match():
    # "vegan" is neither an attribute nor in the text: 1 of 2 attributes match -> (1 + 2 + 1) / 5
    g = goal(attributes=["sulfate free", "vegan"])
    reward, info = get_reward(PRODUCT, g, 10.0, {"size": "16 fl oz", "scent": "coconut"}, verbose=True)
    assert info["r_att"] == 0.5
    assert reward == pytest.approx(4 / 5)


def test_attribute_found_in_text_counts():
    # "color treated hair" is not an attribute but occurs in the features
    assert get_attribute_reward(PRODUCT, goal(attributes=["color treated hair"])) == (1.0, 1)


def test_attribute_fuzzy_match_threshold():
    # token_set_ratio("sulfate free", "free sulfate") == 100 (> 85); "sulfur" is too far
    assert get_attribute_reward(PRODUCT, goal(attributes=["free sulfate"]))[1] == 1
    assert get_attribute_reward(PRODUCT, goal(attributes=["sulfur"]))[1] == 0


def test_option_fuzzy_vs_exact():
    # scent is fuzzy: "coconuts" vs "coconut" has ratio 93 > 85 and matches
    assert get_option_reward(PRODUCT, {"scent": "coconuts"}, {"scent": "coconut"}) == (1.0, 1)
    # size is exact: "16 fl oz." != "16 fl oz" even though the fuzzy ratio is high
    assert get_option_reward(PRODUCT, {"size": "16 fl oz."}, {"size": "16 fl oz"}) == (0.0, 0)
    assert get_option_reward(PRODUCT, ["16 fl oz"], {"Size": "16 FL OZ"}) == (1.0, 1)


def test_wrong_size_loses_its_share():
    # size 8 fl oz instead of 16: 2 attrs + 1 option + price = 4 of 5
    reward = get_reward(PRODUCT, goal(), 10.0, {"size": "8 fl oz", "scent": "coconut"})
    assert reward == pytest.approx(4 / 5)


def test_missing_option_and_no_options_goal():
    assert get_reward(PRODUCT, goal(), 10.0, {}) == pytest.approx(3 / 5)
    reward, info = get_reward(PRODUCT, goal(goal_options={}), 10.0, {}, verbose=True)
    assert reward == 1.0 and "r_option" not in info and info["w_att"] == pytest.approx(2 / 3)


def test_over_price():
    reward, info = get_reward(PRODUCT, goal(), 20.01, {"size": "16 fl oz", "scent": "coconut"}, verbose=True)
    assert info["r_price"] is False
    assert reward == pytest.approx(4 / 5)
    assert (
        get_reward(PRODUCT, goal(), 20.0, {"size": "16 fl oz", "scent": "coconut"}) == 1.0
    )  # limit inclusive
    # no price ceiling: the price term is left out of the breakdown but still in the denominator
    _, info = get_reward(PRODUCT, goal(price_upper=0), 999.0, {}, verbose=True)
    assert "r_price" not in info


def _other(query, category, nouns):
    return {**PRODUCT, "query": query, "product_category": category, "title_nouns": nouns}


FIVE_NOUNS = ["lumora", "shampoo", "hair", "bottle", "pump"]
TWELVE_NOUNS = ["hair", *[f"noun{i}" for i in range(11)]]


@pytest.mark.parametrize(
    ("query", "category", "nouns", "desired_nouns", "r_type"),
    [
        # title score 1/5 = 0.2 (not > 0.2), but the query matches
        ("shampoo", "Other › Things", ["hair"], FIVE_NOUNS, 1.0),
        # title score 0.2, >= 2 shared breadcrumb levels
        ("conditioner", "Beauty & Personal Care › Hair Care › Conditioners", ["hair"], FIVE_NOUNS, 1.0),
        # no query/category match, title score 2/5 > 0.2
        ("hair dryer", "Electronics › Dryers", ["hair", "pump"], FIVE_NOUNS, 1.0),
        # no query/category match, title score exactly 0.2
        ("conditioner", "Other › Things", ["hair"], FIVE_NOUNS, 0.5),
        # title score 1/12 < 0.1, even with the query matching
        ("shampoo", "Other › Things", ["hair"], TWELVE_NOUNS, 0.1),
        # no shared noun at all: 0, whatever the query and category say
        ("shampoo", PRODUCT["product_category"], ["cable", "usb"], FIVE_NOUNS, 0.0),
    ],
)
def test_type_reward_levels(query, category, nouns, desired_nouns, r_type):
    info = get_type_reward(_other(query, category, nouns), goal(title_nouns=desired_nouns))
    assert info["r_type"] == r_type, info


def test_wrong_type_scales_the_whole_reward():
    cable = _other("usb cable", "Electronics › Cables", ["cable", "usb"])
    assert get_reward(cable, goal(), 1.0, {"size": "16 fl oz", "scent": "coconut"}) == 0.0
    half = _other("conditioner", "Other › Things", ["hair"])
    g = goal(title_nouns=FIVE_NOUNS)
    assert get_reward(half, g, 1.0, {"size": "16 fl oz", "scent": "coconut"}) == pytest.approx(0.5)


def test_title_nouns_fallback_without_precomputed_nouns():
    bare = {k: v for k, v in PRODUCT.items() if k != "title_nouns"}
    g = {k: v for k, v in goal().items() if k != "title_nouns"}
    assert get_type_reward(bare, g)["title_score"] == 1.0
