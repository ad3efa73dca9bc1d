"""Taskset writers, offline and deterministic.

    python -m trinity_agents.tasks toolcall OUT_DIR [--train N] [--test N] [--seed S]
    python -m trinity_agents.tasks frozen_lake OUT_DIR [--train N] [--test N] [--map-max-size M] [--seed S]
    python -m trinity_agents.tasks email_search OUT_DIR [--train N] [--test N] [--seed S]
    python -m trinity_agents.tasks sciworld OUT_DIR [--percentage P] [--jar-path JAR] [--seed S]

Each writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/test.jsonl``.

- ``toolcall``: synthetic function-calling tasks in Trinity-RFT's ToolACE row format
  (``raw_system``, ``tools`` and ``answer`` as JSON text, ``conversations``, ``id``), drawn from a
  small catalog of made-up functions: single calls, parallel calls (two functions, or one function
  twice) and multi-turn dialogues that already hold an earlier call and its result. A stand-in for
  ToolACE (which needs a download) in tests and CPU runs.
- ``frozen_lake``: Trinity-RFT's FrozenLake rows (``seed``, ``size``, ``p``, ``index``,
  ``uid``), sizes in ``[2, map_max_size)`` and ``p`` in ``[0.6, 0.85)``.
- ``email_search``: a synthetic company mailbox, ``OUT_DIR/emails.db`` (Trinity-RFT's email
  database schema, SQLite FTS5), and question rows in Trinity-RFT's format about facts in it
  (:mod:`trinity_agents.email_inbox`); ``email_search_workflow`` reads the database from
  ``DEFAULT_EMAIL_DB_PATH`` or ``workflow_args.db_path``.
- ``sciworld``: Trinity-RFT's ScienceWorld rows (task name and variation), the first ``P`` (0.5)
  of each task's variations, its 17 training tasks in ``train`` and the others in ``test``, read
  from the simulator (:func:`trinity_agents.sciworld.write_sciworld_data`; extra ``sciworld``).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOOLACE_SYSTEM = (
    "You compose function calls. Given a request and the functions below, answer with the call or "
    "calls that fulfil it. If no function fits, or the request lacks a required argument, say so. "
    "Return function calls only in the tool-call section. The functions you can call:\n"
)


def _fn(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "dict",
            "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
            "required": list(params),
        },
    }


TOOLS: list[dict[str, Any]] = [
    _fn(
        "get_weather",
        "Current weather in a city.",
        city=("string", "City name"),
        unit=("string", "celsius or fahrenheit"),
    ),
    _fn(
        "convert_currency",
        "Convert an amount between currencies.",
        amount=("number", "Amount"),
        source=("string", "ISO code"),
        target=("string", "ISO code"),
    ),
    _fn(
        "send_email", "Send an email.", to=("string", "Recipient address"), subject=("string", "Subject line")
    ),
    _fn("set_timer", "Start a countdown timer.", minutes=("integer", "Duration in minutes")),
    _fn(
        "search_flights",
        "Find flights on a date.",
        origin=("string", "IATA code"),
        destination=("string", "IATA code"),
        date=("string", "YYYY-MM-DD"),
    ),
    _fn("stock_price", "Latest price of a stock.", symbol=("string", "Ticker symbol")),
    _fn(
        "translate_text", "Translate a text.", text=("string", "Text"), language=("string", "Target language")
    ),
    _fn(
        "add_calendar_event",
        "Add an event to the calendar.",
        title=("string", "Event title"),
        date=("string", "YYYY-MM-DD"),
        hour=("integer", "Start hour, 0-23"),
    ),
]
_BY_NAME = {t["name"]: t for t in TOOLS}

_CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Porto"]
_CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF", "CAD"]
_PEOPLE = ["ana@example.com", "bo@example.com", "chen@example.com", "dee@example.com"]
_AIRPORTS = ["CDG", "HND", "LIM", "OSL", "CAI", "DEN", "SGN", "OPO"]
_TICKERS = ["ACME", "GLOBX", "INITECH", "UMBRL", "HOOLI"]
_LANGS = ["French", "German", "Spanish", "Japanese"]
_PHRASES = ["good morning", "where is the station", "thank you very much", "see you tomorrow"]
_TITLES = ["dentist", "team sync", "piano lesson", "lunch with Sam"]


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _draw_call(rng: random.Random, name: str) -> tuple[dict[str, Any], str]:
    """A call of ``name`` with random arguments, and a request that asks for exactly it."""
    if name == "get_weather":
        args = {"city": rng.choice(_CITIES), "unit": rng.choice(["celsius", "fahrenheit"])}
        ask = f"what is the weather in {args['city']} in {args['unit']}"
    elif name == "convert_currency":
        src, dst = rng.sample(_CURRENCIES, 2)
        args = {"amount": rng.randint(5, 500), "source": src, "target": dst}
        ask = f"convert {args['amount']} {src} to {dst}"
    elif name == "send_email":
        args = {
            "to": rng.choice(_PEOPLE),
            "subject": rng.choice(["invoice", "meeting notes", "hello", "trip plan"]),
        }
        ask = f"email {args['to']} with the subject '{args['subject']}'"
    elif name == "set_timer":
        args = {"minutes": rng.randint(1, 90)}
        ask = f"set a timer for {args['minutes']} minutes"
    elif name == "search_flights":
        src, dst = rng.sample(_AIRPORTS, 2)
        args = {"origin": src, "destination": dst, "date": _date(rng)}
        ask = f"find flights from {src} to {dst} on {args['date']}"
    elif name == "stock_price":
        args = {"symbol": rng.choice(_TICKERS)}
        ask = f"get the latest price of {args['symbol']}"
    elif name == "translate_text":
        args = {"text": rng.choice(_PHRASES), "language": rng.choice(_LANGS)}
        ask = f"translate '{args['text']}' into {args['language']}"
    else:
        args = {"title": rng.choice(_TITLES), "date": _date(rng), "hour": rng.randint(7, 20)}
        ask = f"add '{args['title']}' to my calendar on {args['date']} at {args['hour']}:00"
    return {"name": name, "arguments": args}, ask


def _toolcall_row(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["single", "single", "parallel", "same_twice", "multi_turn"])
    offered = rng.sample(TOOLS, rng.randint(3, 5))
    names = [t["name"] for t in offered]
    conversations: list[dict[str, Any]] = []
    if kind == "multi_turn":
        earlier, ask = _draw_call(rng, names[0])
        conversations += [
            {"from": "user", "value": f"Please {ask}."},
            {"from": "function_call", "value": json.dumps([earlier])},
            {"from": "observation", "value": json.dumps({"status": "ok"})},
            {"from": "assistant", "value": "Done. Anything else?"},
        ]
        names = names[1:]
    if kind == "parallel":
        first, second = rng.sample(names, 2)
        (c1, a1), (c2, a2) = _draw_call(rng, first), _draw_call(rng, second)
        answer, request = [c1, c2], f"Please {a1}, and also {a2}."
    elif kind == "same_twice":
        c1, a1 = _draw_call(rng, names[0])
        c2, a2 = _draw_call(rng, names[0])
        while c2 == c1:
            c2, a2 = _draw_call(rng, names[0])
        answer, request = [c1, c2], f"Two things: {a1}; then {a2}."
    else:
        c1, a1 = _draw_call(rng, rng.choice(names))
        answer, request = [c1], f"Could you {a1}?"
    conversations.append({"from": "user", "value": request})
    return {
        "raw_system": TOOLACE_SYSTEM,
        "tools": json.dumps(offered),
        "conversations": conversations,
        "answer": json.dumps(answer),
        "id": "toolace_multiple_turn" if len(conversations) >= 2 else "toolace_single_turn",
    }


def toolcall_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` synthetic ToolACE-format rows (deterministic for a seed)."""
    rng = random.Random(seed)
    return [_toolcall_row(rng) for _ in range(count)]


def frozen_lake_rows(count: int, seed: int = 0, map_max_size: int = 6) -> list[dict[str, Any]]:
    """``count`` FrozenLake rows (deterministic for a seed)."""
    import numpy as np

    if map_max_size < 3:
        raise ValueError(
            f"map_max_size must be at least 3 (sizes are drawn from [2, map_max_size)), got {map_max_size}"
        )
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        map_seed = int(rng.integers(0, 100_000))
        size = int(rng.integers(2, map_max_size))
        p = round(float(rng.uniform(0.6, 0.85)), 4)
        rows.append({"seed": map_seed, "size": size, "p": p, "index": index, "uid": f"{map_seed}_{size}_{p}"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_splits(
    out: Path, make: Callable[[int, int], list[dict[str, Any]]], train: int, test: int, seed: int
) -> None:
    # Train and test come from different seeds, so the splits are disjoint draws.
    write_jsonl(out / "train.jsonl", make(train, seed))
    write_jsonl(out / "test.jsonl", make(test, seed + 1))
    print(f"wrote {train} train and {test} test tasks to {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trinity_agents.tasks", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind, train, test in (
        ("toolcall", 1000, 100),
        ("frozen_lake", 10000, 100),
        ("email_search", 1000, 100),
    ):
        p = sub.add_parser(kind)
        p.add_argument("out_dir", type=Path)
        p.add_argument("--train", type=int, default=train)
        p.add_argument("--test", type=int, default=test)
        p.add_argument("--seed", type=int, default=0)
        if kind == "frozen_lake":
            p.add_argument("--map-max-size", type=int, default=6)
    p = sub.add_parser("sciworld")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--percentage", type=float, default=0.5, help="share of each task's variations")
    p.add_argument("--jar-path", default=None, help="default: the installed scienceworld package's jar")
    p.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.kind == "sciworld":
        from trinity_agents.sciworld import write_sciworld_data

        counts = write_sciworld_data(
            args.out_dir, percentage=args.percentage, jar_path=args.jar_path, seed=args.seed
        )
        print(f"wrote {counts['train']} train and {counts['test']} test tasks to {args.out_dir}")
    elif args.kind == "email_search":
        from trinity_agents.email_inbox import write_email_search

        db, emails = write_email_search(args.out_dir, args.train, args.test, args.seed)
        print(
            f"wrote {args.train} train and {args.test} test questions to {args.out_dir}, {emails} emails to {db}"
        )
        print(f"export DEFAULT_EMAIL_DB_PATH={db.resolve()}")
    elif args.kind == "toolcall":
        _write_splits(args.out_dir, lambda n, s: toolcall_rows(n, s), args.train, args.test, args.seed)
    else:
        size = args.map_max_size
        _write_splits(
            args.out_dir, lambda n, s: frozen_lake_rows(n, s, size), args.train, args.test, args.seed
        )


if __name__ == "__main__":
    main()
