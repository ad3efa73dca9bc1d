"""Offline task generators: arithmetic and countdown tasksets, SFT solutions, DPO pairs.

Everything is seeded and deterministic, and train and test questions never overlap. Tasksets
use the Hugging Face folder layout Trinity's taskset reader takes as ``path``::

    <out>/train.jsonl  <out>/test.jsonl       {"question": ..., "answer": ...}
    <out>/sft/train.jsonl                     {"prompt": ..., "response": ...}
    <out>/dpo/train.jsonl                     {"prompt": ..., "chosen": ..., "rejected": ...}

SFT responses and DPO ``chosen`` are worked solutions in the ``<think>…</think><answer>…</answer>``
format ``math_reward`` / ``countdown_reward`` score; they come from train questions only.

Command line (also installed as ``trinity-math-tasks``)::

    python -m trinity_math.tasks arithmetic --out data/arith --train 2000 --test 200 --difficulty 1
    python -m trinity_math.tasks arithmetic --out data/qs --train 900 --test 100 --sft 300 --facts --terms 3
    python -m trinity_math.tasks countdown --out data/countdown --train 5000 --test 200
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

#: difficulty -> (operators, largest operand). 1: one-digit sums ... 5: three-digit + - *.
ARITHMETIC_LEVELS: dict[int, tuple[str, int]] = {
    1: ("+", 9),
    2: ("+-", 9),
    3: ("+-*", 9),
    4: ("+-*", 99),
    5: ("+-*", 999),
}
_ENUMERATE_LIMIT = 200_000  # below this many possible questions, enumerate them all


@dataclass
class Problem:
    """One generated problem: the taskset row plus what the SFT / DPO files need."""

    question: str
    answer: str  # the truth the reward function gets
    solution: str  # worked solution, "<think>...</think><answer>...</answer>"
    wrong_solution: str  # same format, wrong answer (DPO "rejected")
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The taskset row."""
        return {"question": self.question, "answer": self.answer, **self.extra}


def _solution(think: str, answer: str) -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


# -- arithmetic -------------------------------------------------------------------------------


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _arithmetic_problem(a: int, op: str, b: int, rng: random.Random) -> Problem:
    result = _apply(a, op, b)
    wrong = result + rng.choice([-2, -1, 1, 2])
    if wrong < 0:  # keep wrong answers plausible: non-negative like the right ones
        wrong = result + rng.choice([1, 2])
    expr = f"{a}{op}{b}"
    return Problem(
        question=expr,
        answer=str(result),
        solution=_solution(f"{expr}={result}", str(result)),
        wrong_solution=_solution(f"{expr}={wrong}", str(wrong)),
    )


def _sum_chain_problem(numbers: Sequence[int], rng: random.Random) -> Problem:
    """``"3+4+5"``, solved one step at a time: ``<think>3+4=7,7+5=12</think><answer>12</answer>``."""
    steps, total = [], numbers[0]
    for n in numbers[1:]:
        steps.append(f"{total}+{n}={total + n}")
        total += n
    wrong = total + rng.choice([-2, -1, 1, 2]) if total > 1 else total + rng.choice([1, 2])
    wrong_steps = [*steps[:-1], steps[-1].rsplit("=", 1)[0] + f"={wrong}"]
    return Problem(
        question="+".join(map(str, numbers)),
        answer=str(total),
        solution=_solution(",".join(steps), str(total)),
        wrong_solution=_solution(",".join(wrong_steps), str(wrong)),
    )


def _arithmetic_space(ops: str, top: int) -> int:
    n = top + 1
    # a - b is generated with a >= b only, so results stay non-negative.
    return sum(n * (n + 1) // 2 if op == "-" else n * n for op in ops)


def arithmetic_problems(count: int, *, difficulty: int = 1, seed: int = 0, terms: int = 2) -> list[Problem]:
    """``count`` distinct problems ``a<op>b`` (no repeats), in a seeded random order.

    ``difficulty`` picks operators and operand range from :data:`ARITHMETIC_LEVELS`; results
    are never negative. Questions are the bare expression (``"3+4"``), short on purpose so a
    tiny character-level model can learn them on a CPU in minutes.

    ``terms > 2`` (sums only, ``difficulty 1``) gives multi-step sums such as ``"3+4+5"`` whose
    worked solutions add one number at a time (``3+4=7,7+5=12``): every step is a one-step sum,
    so a model that knows those (see :func:`fact_rows`) can solve unseen problems by composing
    them, which is what makes held-out accuracy reachable for a tiny model.
    """
    if difficulty not in ARITHMETIC_LEVELS:
        raise ValueError(f"difficulty must be one of {sorted(ARITHMETIC_LEVELS)}, got {difficulty}")
    if terms < 2:
        raise ValueError(f"terms must be at least 2, got {terms}")
    ops, top = ARITHMETIC_LEVELS[difficulty]
    if terms > 2:
        if ops != "+":
            raise ValueError(f"terms > 2 is for sums only (difficulty 1), got difficulty {difficulty}")
        return _sum_chains(count, terms=terms, top=top, seed=seed)
    space = _arithmetic_space(ops, top)
    if count > space:
        raise ValueError(
            f"difficulty {difficulty} has only {space} distinct problems, {count} were requested; "
            "ask for fewer or raise the difficulty"
        )
    rng = random.Random(f"arithmetic/{difficulty}/{seed}")
    if space <= _ENUMERATE_LIMIT:
        triples = [
            (a, op, b) for op in ops for a in range(top + 1) for b in range(top + 1) if op != "-" or a >= b
        ]
        rng.shuffle(triples)
        chosen = triples[:count]
    else:
        seen: set[tuple[int, str, int]] = set()
        chosen = []
        while len(chosen) < count:
            op = rng.choice(ops)
            a, b = rng.randint(0, top), rng.randint(0, top)
            if op == "-" and a < b:
                a, b = b, a
            if (a, op, b) not in seen:
                seen.add((a, op, b))
                chosen.append((a, op, b))
    return [_arithmetic_problem(a, op, b, rng) for a, op, b in chosen]


def _sum_chains(count: int, *, terms: int, top: int, seed: int) -> list[Problem]:
    space = (top + 1) ** terms
    if count > space:
        raise ValueError(
            f"{terms}-term one-digit sums have only {space} distinct problems, {count} were requested"
        )
    rng = random.Random(f"sums/{terms}/{seed}")
    tuples = list(itertools.product(range(top + 1), repeat=terms))
    rng.shuffle(tuples)
    return [_sum_chain_problem(numbers, rng) for numbers in tuples[:count]]


_STEP = re.compile(r"^(\d+[-+*]\d+)=(\d+)$")


def fact_rows(problems: Iterable[Problem]) -> list[dict[str, str]]:
    """Plain "fact" SFT rows for the steps of arithmetic problems: prompt ``"3+4="``, response ``"3+4=7"``.

    One row per distinct step of the problems' worked solutions (``"3+4+5"`` gives ``3+4=7``
    and ``7+5=12``), in order of first appearance. A different surface form from the
    taskset's (bare ``"3+4"`` answered in ``<think>…</think><answer>…</answer>`` tags), like the
    facts a base model picks up in pre-training: a model warmed up on these knows the sums
    without knowing the task's format, which is what reinforcement fine-tuning then teaches it.
    """
    rows: dict[str, dict[str, str]] = {}
    for p in problems:
        think = p.solution.split("<think>", 1)[-1].split("</think>", 1)[0]
        for step in think.split(","):
            match = _STEP.match(step)
            if match is None:
                raise ValueError(f"{p.question!r}: {step!r} is not an arithmetic step like '3+4=7'")
            rows.setdefault(step, {"prompt": f"{match.group(1)}=", "response": step})
    return list(rows.values())


def untagged_solution(solution: str) -> str:
    """A worked solution that ends with the bare answer: ``<think>3+4=7,7+5=12</think>12``."""
    head, _, rest = solution.partition("<answer>")
    answer, _, tail = rest.partition("</answer>")
    return head + answer + tail


# -- countdown --------------------------------------------------------------------------------


def _combine(
    rng: random.Random, items: list[tuple[Fraction, str, list[str]]]
) -> tuple[Fraction, str, list[str]]:
    """Join random pairs with random operators until one expression is left.

    Each item is ``(value, expression, steps)``; ``steps`` are the intermediate results
    written out (``"3*7=21"``) for the worked solution.
    """
    items = list(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (va, ea, sa), (vb, eb, sb) = items[i], items[j]
        options = [("+", va + vb), ("*", va * vb)]
        if va - vb > 0:
            options.append(("-", va - vb))
        if vb != 0 and (va / vb).denominator == 1:
            options.append(("/", va / vb))
        op, value = rng.choice(options)
        expr = f"({ea}{op}{eb})"
        step = f"{_plain(va)}{op}{_plain(vb)}={_plain(value)}"
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [(value, expr, [*sa, *sb, step])]
    return items[0]


def _plain(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(value)


def _strip_outer(expr: str) -> str:
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for k, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and k < len(expr) - 1:
                return expr  # the first "(" closes early: the outer pair is not one group
        return expr[1:-1]
    return expr


def _wrong_equation(numbers: list[int], target: int) -> str:
    """A plausible equation that misses ``target`` (for DPO "rejected")."""
    total, product = sum(numbers), 1
    for n in numbers:
        product *= n
    if total != target:
        return "+".join(map(str, numbers))
    if product != target:
        return "*".join(map(str, numbers))
    return "+".join(map(str, numbers[:-1]))  # leaves a number out


def countdown_question(numbers: Sequence[int], target: int) -> str:
    """The TinyZero-style countdown prompt."""
    return (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. "
        "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once."
    )


def countdown_problems(
    count: int, *, num_numbers: int = 3, max_number: int = 20, max_target: int = 100, seed: int = 0
) -> list[Problem]:
    """``count`` distinct countdown problems, each solvable by construction.

    Numbers are drawn from ``1..max_number``; a random expression over all of them (with
    ``+ - * /``, only exact divisions and positive differences) gives the target, kept when it
    is a whole number in ``1..max_target``. The answer is the JSON truth ``countdown_reward``
    reads, and the row records the ``solution`` equation.
    """
    if num_numbers < 2:
        raise ValueError(f"num_numbers must be at least 2, got {num_numbers}")
    rng = random.Random(f"countdown/{num_numbers}/{max_number}/{max_target}/{seed}")
    seen: set[tuple[tuple[int, ...], int]] = set()
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 200 * count + 1000:
            raise ValueError(
                f"could only make {len(problems)} distinct countdown problems of {count} with "
                f"{num_numbers} numbers up to {max_number} and targets up to {max_target}; "
                "widen the ranges or ask for fewer"
            )
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        value, expr, steps = _combine(rng, [(Fraction(n), str(n), []) for n in numbers])
        if value.denominator != 1 or not 1 <= value <= max_target:
            continue
        target = int(value)
        key = (tuple(sorted(numbers)), target)
        if key in seen:
            continue
        seen.add(key)
        equation = _strip_outer(expr)
        wrong = _wrong_equation(numbers, target)
        problems.append(
            Problem(
                question=countdown_question(numbers, target),
                answer=json.dumps({"target": target, "numbers": numbers}),
                solution=_solution(", ".join(steps), equation),
                wrong_solution=_solution(f"{wrong} is close", wrong),
                extra={"target": target, "numbers": numbers, "solution": equation},
            )
        )
    return problems


# -- files ------------------------------------------------------------------------------------


def split(problems: list[Problem], test_size: int) -> tuple[list[Problem], list[Problem]]:
    """``(train, test)``: the first ``test_size`` problems are the test split."""
    return problems[test_size:], problems[:test_size]


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines (UTF-8, parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_taskset(
    out: str | Path,
    train: list[Problem],
    test: list[Problem],
    *,
    sft: int = 0,
    dpo: int = 0,
    facts: Sequence[Problem] = (),
    untagged: int = 0,
) -> dict[str, Path]:
    """Write the taskset folder, plus ``sft/`` and ``dpo/`` files built from the first train problems.

    ``facts`` (arithmetic problems, test ones allowed) put their :func:`fact_rows` at the head of
    ``sft/train.jsonl``, before the ``sft`` worked solutions: a warm-up corpus that states facts
    in another surface form than the task's prompts, which stay unseen. The first ``untagged``
    of those solutions end with the bare answer (:func:`untagged_solution`), as most text does,
    instead of the ``<answer>`` tags the task's reward reads.
    """
    out = Path(out)
    if len(train) < max(sft, dpo):
        raise ValueError(
            f"asked for {max(sft, dpo)} SFT/DPO rows but there are only {len(train)} train problems"
        )
    paths = {
        "train": write_jsonl(out / "train.jsonl", (p.row() for p in train)),
        "test": write_jsonl(out / "test.jsonl", (p.row() for p in test)),
    }
    if sft or facts:
        if untagged > sft:
            raise ValueError(f"asked for {untagged} untagged SFT solutions but only {sft} SFT rows")
        solutions = [
            {"prompt": p.question, "response": untagged_solution(p.solution) if i < untagged else p.solution}
            for i, p in enumerate(train[:sft])
        ]
        paths["sft"] = write_jsonl(out / "sft" / "train.jsonl", fact_rows(facts) + solutions)
    if dpo:
        rows = (
            {"prompt": p.question, "chosen": p.solution, "rejected": p.wrong_solution} for p in train[:dpo]
        )
        paths["dpo"] = write_jsonl(out / "dpo" / "train.jsonl", rows)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (``trinity-math-tasks`` / ``python -m trinity_math.tasks``)."""
    parser = argparse.ArgumentParser(prog="trinity-math-tasks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    for name in ("arithmetic", "countdown"):
        p = sub.add_parser(name, help=f"{name} taskset")
        p.add_argument("--out", required=True, help="output folder (train.jsonl, test.jsonl, sft/, dpo/)")
        p.add_argument("--train", type=int, default=1000, help="train problems (default 1000)")
        p.add_argument("--test", type=int, default=100, help="test problems (default 100)")
        p.add_argument("--sft", type=int, default=0, help="SFT rows from the first train problems")
        p.add_argument("--dpo", type=int, default=0, help="DPO pairs from the first train problems")
        p.add_argument(
            "--untagged", type=int, default=0, help="of the SFT rows, how many end with the bare answer"
        )
        if name == "arithmetic":
            p.add_argument(
                "--facts",
                action="store_true",
                help='head sft/ with the fact of every step of every problem ("3+4=" -> "3+4=7")',
            )
        p.add_argument("--seed", type=int, default=0)
        if name == "arithmetic":
            p.add_argument("--difficulty", type=int, default=1, choices=sorted(ARITHMETIC_LEVELS))
            p.add_argument(
                "--terms", type=int, default=2, help="numbers per problem; > 2 for sums (difficulty 1)"
            )
        else:
            p.add_argument("--num-numbers", type=int, default=3)
            p.add_argument("--max-number", type=int, default=20)
            p.add_argument("--max-target", type=int, default=100)
    args = parser.parse_args(argv)
    total = args.train + args.test
    try:
        if args.kind == "arithmetic":
            problems = arithmetic_problems(
                total, difficulty=args.difficulty, seed=args.seed, terms=args.terms
            )
        else:
            problems = countdown_problems(
                total,
                num_numbers=args.num_numbers,
                max_number=args.max_number,
                max_target=args.max_target,
                seed=args.seed,
            )
        train, test = split(problems, args.test)
        facts = problems if getattr(args, "facts", False) else ()
        paths = write_taskset(
            args.out, train, test, sft=args.sft, dpo=args.dpo, facts=facts, untagged=args.untagged
        )
    except ValueError as exc:
        parser.error(str(exc))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
