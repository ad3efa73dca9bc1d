"""Generate the shipped catalog and goals from :mod:`trinity_webshop.templates`.

    python -m trinity_webshop.generate_catalog [OUT_DIR]   # default: the package's data/ folder

Writes ``products.jsonl`` (one product per line, WebShop's field names) and ``goals.jsonl`` (one
goal per line, with ``split`` = ``train`` | ``test``). The output depends only on ``SEED`` and the
templates, so re-running it reproduces the committed files byte for byte.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from trinity_webshop.templates import BRANDS, PRODUCT_TYPES, ProductType

SEED = 20240607
PRODUCTS_PER_TYPE = 24
GOALS_PER_PRODUCT = 2
TEST_GOALS = 200
# WebShop picks a goal's price ceiling among the first few multiples of 10 above the price.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]

_INSTRUCTION_TEMPLATES = (
    "i'm looking for {attrs} {noun}",
    "i need {attrs} {noun}",
    "find me {attrs} {noun}",
    "i want to buy {attrs} {noun}",
    "i would like {attrs} {noun}",
)
_REVIEW_LINES = (
    ("Exactly what I was looking for.", 5),
    ("Good value for the money.", 4),
    ("Works as described, would buy again.", 5),
    ("Decent, but shipping took a while.", 3),
    ("Not bad overall.", 4),
    ("Quality could be better.", 2),
)


def _asin(rng: random.Random) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "B0" + "".join(rng.choice(alphabet) for _ in range(8))


def _title_case(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _make_product(ptype: ProductType, rng: random.Random, asin: str) -> dict[str, Any]:
    brand = rng.choice(BRANDS)
    attributes = sorted(rng.sample(ptype.attributes, 3))
    options = {
        name: sorted(rng.sample(values, min(len(values), rng.randint(2, 4))), key=values.index)
        for name, values in ptype.options.items()
    }
    suffix, suffix_nouns = rng.choice(ptype.suffixes)
    # A suffix that repeats the lead attribute ("Dry Hair Shampoo for Dry Hair") reads badly.
    lead = "" if attributes[0] in suffix.lower() else _title_case(attributes[0])
    title = " ".join(part for part in (brand, lead, ptype.noun, suffix) if part)
    # What spaCy tags NOUN/PROPN in this title, precomputed for the type reward.
    title_nouns = [brand.lower(), *ptype.noun.lower().split(), *suffix_nouns]
    price = round(rng.uniform(*ptype.price), 2)
    noun = ptype.noun.lower()
    description = (
        f"The {brand} {noun} is made for everyday use. "
        f"Each {noun} is checked by hand before it ships, and the {brand} team answers questions quickly."
    )
    bullets = [f"{_title_case(a)} {noun}, tested by {brand}." for a in attributes]
    bullets.append(f"Backed by the {brand} satisfaction promise.")
    reviews = [
        {"title": line.split(",")[0], "body": line, "score": score}
        for line, score in rng.sample(_REVIEW_LINES, 2)
    ]
    return {
        "asin": asin,
        "category": ptype.category,
        "query": ptype.query,
        "product_category": ptype.product_category,
        "name": title,
        "Title": title,
        "title_nouns": title_nouns,
        "Description": description,
        "BulletPoints": bullets,
        "Reviews": reviews,
        "Rating": round(sum(r["score"] for r in reviews) / len(reviews), 1),
        "Attributes": attributes,
        "options": options,
        "pricing": [price],
        "Price": f"${price:.2f}",
    }


def _check_options_not_in_text(product: dict[str, Any], ptype: ProductType) -> None:
    """WebShop's option reward also accepts an option value found in the title, features or
    description; keep option values out of that text so a wrong option never scores."""
    text = " ".join([product["Title"], " ".join(product["BulletPoints"]), product["Description"]]).lower()
    for values in ptype.options.values():
        for value in values:
            if value in text:
                raise AssertionError(f"option value {value!r} occurs in the text of {product['asin']}")


def _make_goal(product: dict[str, Any], ptype: ProductType, rng: random.Random) -> dict[str, Any]:
    attributes = sorted(rng.sample(product["Attributes"], rng.randint(1, 2)))
    goal_options = {name: rng.choice(values) for name, values in product["options"].items()}
    price = product["pricing"][0]
    ceilings = [p for p in PRICE_RANGE if p > price][:4]
    price_upper = max(rng.sample(ceilings, 2))
    text = rng.choice(_INSTRUCTION_TEMPLATES).format(attrs=" and ".join(attributes), noun=ptype.noun.lower())
    option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
    instruction = f"{text} with {option_text}" if option_text else text
    instruction += f", and price lower than {price_upper:.2f} dollars"
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "title_nouns": product["title_nouns"],
        "product_category": product["product_category"],
        "instruction_text": instruction,
        "attributes": attributes,
        "goal_options": goal_options,
        "price_upper": price_upper,
        "weight": 1,
    }


def generate(seed: int = SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return ``(products, goals)``; goals carry ``split`` and their global ``goal_index``."""
    rng = random.Random(seed)
    products: list[dict[str, Any]] = []
    types: list[ProductType] = []
    seen: set[str] = set()
    for ptype in PRODUCT_TYPES:
        for _ in range(PRODUCTS_PER_TYPE):
            asin = _asin(rng)
            while asin in seen:
                asin = _asin(rng)
            seen.add(asin)
            product = _make_product(ptype, rng, asin)
            _check_options_not_in_text(product, ptype)
            products.append(product)
            types.append(ptype)
    goals = [_make_goal(p, t, rng) for p, t in zip(products, types) for _ in range(GOALS_PER_PRODUCT)]
    rng.shuffle(goals)
    for index, goal in enumerate(goals):
        goal["goal_index"] = index
        goal["split"] = "test" if index < TEST_GOALS else "train"
    return products, goals


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def write(out_dir: Path, seed: int = SEED) -> tuple[Path, Path]:
    """Generate and write ``products.jsonl`` and ``goals.jsonl`` into ``out_dir``."""
    products, goals = generate(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out_dir / "products.jsonl", products)
    _write_jsonl(out_dir / "goals.jsonl", goals)
    return out_dir / "products.jsonl", out_dir / "goals.jsonl"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out_dir = Path(args[0]) if args else Path(__file__).parent / "data"
    for path in write(out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
