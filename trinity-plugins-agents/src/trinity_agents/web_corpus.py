"""A small offline "web" for ``agentscope_v1_react_search_workflow``, and its questions.

Trinity-RFT's web search example (``examples/agentscope_websearch``) trains on WebWalkerQA rows
and searches the live web. Here the web is a generated one: made-up companies, each a website
(``https://www.<name>.example``) with a home page linking its pages, an about page (founding
year, founder, headquarters), product pages (maker, launch year, designer) and team pages
(birthplace, university). Every name is invented, so a model can only know the answers by
searching. Questions are one hop (a fact on one page) or two (a fact on a page named on
another: "In which city was the designer of the Quorvane X2 born?").

Rows are written in Trinity-RFT's format (``get_webwalkerQA_data.py``): ``{"problem",
"answer"}``, the problem being the question followed by upstream's sentence about navigating
the website from its root URL.

``python -m trinity_agents.web_corpus OUT_DIR [--train N] [--test N] [--seed S]`` writes
``train.jsonl``, ``test.jsonl``, ``dataset_dict.json`` and ``corpus.jsonl`` (the pages, one
``{"url", "title", "content"}`` object a line). The pages are always the same
(:data:`DEFAULT_WORLD_SEED`): the workflow searches them without being told where they are;
``--seed`` only draws which questions go to which split.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_WORLD_SEED = 0
DEFAULT_COMPANIES = 30
PROBLEM_SUFFIX = (
    " You should navigate the website to find the answer. The root url is {root}."
    " The answer should be based on the information on the website."
)

_ONSETS = ["b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "t", "tr", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m"]
_INDUSTRIES = ["bicycle", "kitchenware", "telescope", "drone", "keyboard", "lamp", "kayak", "clock"]
_KINDS = {
    "bicycle": "touring bicycle",
    "kitchenware": "cast-iron pan",
    "telescope": "refracting telescope",
    "drone": "survey drone",
    "keyboard": "mechanical keyboard",
    "lamp": "desk lamp",
    "kayak": "sea kayak",
    "clock": "mantel clock",
}
_ROLES = ["lead designer", "industrial designer", "product designer"]


@dataclass(frozen=True)
class WebPage:
    """One page of the corpus."""

    url: str
    title: str
    content: str


@dataclass(frozen=True)
class WebQuestion:
    """A question with its answer, its website and the path an agent can take to it:
    ``hops`` is ``(search query, url of the page holding the next fact)`` per hop."""

    question: str
    answer: str
    root_url: str
    hops: tuple[tuple[str, str], ...]

    @property
    def problem(self) -> str:
        """The question as Trinity-RFT's WebWalkerQA rows state it."""
        return self.question + PROBLEM_SUFFIX.format(root=self.root_url)

    def row(self) -> dict[str, str]:
        """The task row, in Trinity-RFT's format."""
        return {"problem": self.problem, "answer": self.answer}


@dataclass(frozen=True)
class WebWorld:
    """The generated pages and every question they answer."""

    pages: tuple[WebPage, ...]
    questions: tuple[WebQuestion, ...]

    def question_for(self, problem: str) -> WebQuestion | None:
        """The question whose row has this ``problem`` text."""
        return {q.problem: q for q in self.questions}.get(problem)


def _word(rng: random.Random, syllables: int) -> str:
    text = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
    return text.capitalize()


def _unique(rng: random.Random, used: set[str], make) -> str:
    while True:
        name = make()
        if name.lower() not in used and len(name) > 3:
            used.add(name.lower())
            return name


def _slug(text: str) -> str:
    return "-".join(text.lower().split())


def generate_world(companies: int = DEFAULT_COMPANIES, seed: int = DEFAULT_WORLD_SEED) -> WebWorld:
    """The pages of ``companies`` made-up company websites and their questions (seeded: the same
    arguments give the same world)."""
    rng = random.Random(seed)
    used: set[str] = set()
    cities = [
        _unique(rng, used, lambda: _word(rng, 2) + rng.choice(["wick", "ford", "haven", "port"]))
        for _ in range(12)
    ]
    universities = [f"the University of {c}" for c in cities[:6]] + [
        _unique(rng, used, lambda: _word(rng, 2)) + " Institute of Technology" for _ in range(4)
    ]

    def person() -> str:
        return _unique(rng, used, lambda: f"{_word(rng, 1)} {_word(rng, 2)}")

    pages: list[WebPage] = []
    questions: list[WebQuestion] = []
    for _ in range(companies):
        company = _unique(rng, used, lambda: _word(rng, rng.choice([2, 3])))
        industry = rng.choice(_INDUSTRIES)
        root = f"https://www.{company.lower()}.example"
        founded = rng.randint(1950, 2015)
        hq = rng.choice(cities)
        founder = person()
        about = f"{root}/about"
        people = {founder: ("founder and chief executive", rng.choice(cities), rng.choice(universities))}
        products = []
        for _ in range(2):
            product = _unique(rng, used, lambda: _word(rng, 2)) + f" {rng.choice('XSMQ')}{rng.randint(2, 9)}"
            designer = person()
            people[designer] = (rng.choice(_ROLES), rng.choice(cities), rng.choice(universities))
            launched = rng.randint(founded + 1, 2024)
            products.append((product, designer, launched, f"{root}/products/{_slug(product)}"))
        team = {name: f"{root}/team/{_slug(name)}" for name in people}

        links = [("About us", about)] + [(p[0], p[3]) for p in products] + [(n, u) for n, u in team.items()]
        pages.append(
            WebPage(
                root,
                f"{company} - official website",
                f"Welcome to {company}, makers of fine {industry} products. Pages on this site: "
                + "; ".join(f"{text}: {url}" for text, url in links)
                + ".",
            )
        )
        names = " and the ".join(p[0] for p in products)
        pages.append(
            WebPage(
                about,
                f"About {company}",
                f"{company} is a {industry} company. It was founded in {founded} by {founder}. "
                f"Its headquarters are in {hq}. Today it makes the {names}.",
            )
        )
        for product, designer, launched, url in products:
            pages.append(
                WebPage(
                    url,
                    f"{product} | {company}",
                    f"The {product} is a {_KINDS[industry]} made by {company}. It was launched in "
                    f"{launched}. The {product} was designed by {designer}.",
                )
            )
        for name, (role, born, studied) in people.items():
            pages.append(
                WebPage(
                    team[name],
                    f"{name} | {company} team",
                    f"{name} is the {role} at {company}. {name} was born in {born} and studied at {studied}.",
                )
            )

        company_hop = (f"{company} founded", about)
        founder_born, founder_studied = people[founder][1], people[founder][2]
        questions += [
            WebQuestion(f"In which year was {company} founded?", str(founded), root, (company_hop,)),
            WebQuestion(f"Who founded {company}?", founder, root, (company_hop,)),
            WebQuestion(
                f"Where did the founder of {company} study?",
                founder_studied,
                root,
                (company_hop, (founder, team[founder])),
            ),
            WebQuestion(
                f"In which city was the founder of {company} born?",
                founder_born,
                root,
                (company_hop, (founder, team[founder])),
            ),
        ]
        for product, designer, launched, url in products:
            product_hop = (product, url)
            questions += [
                WebQuestion(f"Who designed the {product}?", designer, root, (product_hop,)),
                WebQuestion(
                    f"In which year was the {product} launched?", str(launched), root, (product_hop,)
                ),
                WebQuestion(
                    f"In which city was the designer of the {product} born?",
                    people[designer][1],
                    root,
                    (product_hop, (designer, team[designer])),
                ),
                WebQuestion(
                    f"In which city is the company that makes the {product} headquartered?",
                    hq,
                    root,
                    (product_hop, (f"{company} headquarters", about)),
                ),
            ]
    return WebWorld(tuple(pages), tuple(questions))


@lru_cache(maxsize=4)
def default_world() -> WebWorld:
    """The world the generator writes and the workflow searches by default."""
    return generate_world()


def write_websearch(out_dir: str | Path, train: int = 160, test: int = 16, seed: int = 42) -> Path:
    """Write ``train.jsonl`` / ``test.jsonl`` (disjoint questions drawn with ``seed``, in
    Trinity-RFT's row format), ``dataset_dict.json`` and ``corpus.jsonl`` (the pages) to
    ``out_dir``; returns the corpus path."""
    world = default_world()
    if train < 0 or test < 0 or train + test > len(world.questions):
        raise ValueError(
            f"train + test must be between 0 and {len(world.questions)} (the questions there are)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = random.Random(seed).sample(list(world.questions), train + test)
    splits = {"train": drawn[:train], "test": drawn[train:]}
    for name, items in splits.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(q.row()) + "\n" for q in items))
    info = {
        "description": "Questions over trinity_agents.web_corpus's generated websites (WebWalkerQA's row format).",
        "splits": {name: {"name": name, "num_examples": len(items)} for name, items in splits.items()},
    }
    (out / "dataset_dict.json").write_text(json.dumps(info, indent=2) + "\n")
    corpus = out / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(asdict(p)) + "\n" for p in world.pages))
    return corpus


def main(argv: list[str] | None = None) -> None:
    """``python -m trinity_agents.web_corpus OUT_DIR [--train N] [--test N] [--seed S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m trinity_agents.web_corpus", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=160)
    parser.add_argument("--test", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    try:
        corpus = write_websearch(args.out_dir, train=args.train, test=args.test, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {args.train} train and {args.test} test questions and {corpus}")


if __name__ == "__main__":
    main()


__all__ = [
    "DEFAULT_WORLD_SEED",
    "WebPage",
    "WebQuestion",
    "WebWorld",
    "default_world",
    "generate_world",
    "write_websearch",
]
