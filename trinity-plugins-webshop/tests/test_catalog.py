"""The shipped catalog and goals: size, consistency, reproducibility, loading errors."""

from __future__ import annotations

import json

import pytest

from trinity_webshop.catalog import Catalog, UnknownProductError, default_catalog, load_catalog
from trinity_webshop.generate_catalog import generate, write


@pytest.fixture(scope="module")
def catalog():
    return default_catalog()


def test_sizes_and_splits(catalog):
    assert len(catalog.products) >= 500
    assert len(catalog.goals) >= 1000
    train, test = catalog.goal_indices("train"), catalog.goal_indices("test")
    assert len(train) >= 800 and len(test) >= 100
    assert sorted(train + test) == list(range(len(catalog.goals)))
    assert [g["goal_index"] for g in catalog.goals] == list(range(len(catalog.goals)))
    assert len({p["asin"] for p in catalog.products}) == len(catalog.products)


def test_every_goal_is_satisfiable_by_its_target(catalog):
    for goal in catalog.goals:
        product = catalog.product(goal["asin"])
        assert set(goal["attributes"]) <= set(product["Attributes"])
        for name, value in goal["goal_options"].items():
            assert value in product["options"][name]
        assert catalog.price(product) <= goal["price_upper"]
        assert goal["query"] == product["query"] and goal["title_nouns"] == product["title_nouns"]
        assert goal["instruction_text"].endswith(f"price lower than {goal['price_upper']:.2f} dollars")
        for fields in ("category", "product_category", "name"):
            assert goal[fields] == product[fields]


def test_shipped_files_are_what_the_generator_writes(catalog, tmp_path):
    products, goals = generate()
    assert products == catalog.products
    assert goals == catalog.goals
    write(tmp_path)
    assert load_catalog(tmp_path).goals == catalog.goals


def test_unknown_product_and_goal_index(catalog):
    with pytest.raises(UnknownProductError, match="unknown product id 'B0NOSUCH00'"):
        catalog.product("B0NOSUCH00")
    assert catalog.product(catalog.products[0]["asin"].lower()) is catalog.products[0]
    with pytest.raises(IndexError, match=r"goal_index 99999 is out of range.*0\.\.1199"):
        catalog.goal(99999)
    with pytest.raises(TypeError, match="goal_index must be an int"):
        catalog.goal("3")


def test_bad_catalogs_are_reported(tmp_path, catalog):
    with pytest.raises(FileNotFoundError, match=r"products\.jsonl not found"):
        load_catalog(tmp_path)
    (tmp_path / "products.jsonl").write_text(json.dumps(catalog.products[0]) + "\n{not json\n")
    (tmp_path / "goals.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"products\.jsonl, line 2: not valid JSON"):
        load_catalog(tmp_path)
    with pytest.raises(ValueError, match="row 1: missing field"):
        Catalog(products=[{"asin": "B0X"}], goals=[])
    with pytest.raises(ValueError, match="target asin 'B0NOSUCH00' is not a product"):
        Catalog(products=catalog.products[:1], goals=[{**catalog.goals[0], "asin": "B0NOSUCH00"}])


def test_search_ranks_matching_products_first(catalog):
    goal = catalog.goal(0)
    results = catalog.search(goal["instruction_text"])
    assert 0 < len(results) <= 50
    assert goal["asin"] in results
    top = catalog.product(results[0])
    assert top["query"] == goal["query"]
    assert catalog.search("the and of") == []  # only stopwords
    assert catalog.search("qwertyuiop") == []  # no known term
