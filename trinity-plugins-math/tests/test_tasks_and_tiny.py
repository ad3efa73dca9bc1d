"""Task generators (determinism, disjoint splits, rows the rewards accept) and the tiny math model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trinity_math.equation import evaluate, parse_equation
from trinity_math.rewards import CountdownRewardFn, MathRewardFn
from trinity_math.tasks import (
    ARITHMETIC_LEVELS,
    arithmetic_problems,
    countdown_problems,
    fact_rows,
    main,
    split,
    untagged_solution,
    write_taskset,
)
from trinity_math.tiny import MATH_VOCAB_CHARS, create_math_model
from trinity_math.workflows import BOXED_SYSTEM_PROMPT, BOXED_THINK_SYSTEM_PROMPT, R1_SYSTEM_PROMPT


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("difficulty", sorted(ARITHMETIC_LEVELS))
def test_arithmetic_problems_are_distinct_correct_and_seeded(difficulty: int) -> None:
    problems = arithmetic_problems(80, difficulty=difficulty, seed=3)
    assert len({p.question for p in problems}) == 80
    ops, top = ARITHMETIC_LEVELS[difficulty]
    fn = MathRewardFn()
    for p in problems:
        value = evaluate(parse_equation(p.question))
        assert str(value) == p.answer and value >= 0
        assert all(ch.isdigit() or ch in ops for ch in p.question)
        assert (
            max(int(x) for x in p.question.replace("+", " ").replace("-", " ").replace("*", " ").split())
            <= top
        )
        assert fn(p.solution, p.answer) == {"accuracy": 1.0, "format_score": pytest.approx(0.1)}
        assert fn(p.wrong_solution, p.answer)["accuracy"] == 0.0
    assert [p.row() for p in arithmetic_problems(80, difficulty=difficulty, seed=3)] == [
        p.row() for p in problems
    ]
    assert [p.row() for p in arithmetic_problems(80, difficulty=difficulty, seed=4)] != [
        p.row() for p in problems
    ]


def test_arithmetic_refuses_more_problems_than_exist() -> None:
    assert len(arithmetic_problems(100, difficulty=1)) == 100  # every one-digit sum
    with pytest.raises(ValueError, match="only 100 distinct problems"):
        arithmetic_problems(101, difficulty=1)


def test_multi_step_sums_are_distinct_correct_seeded_and_solved_one_step_at_a_time() -> None:
    problems = arithmetic_problems(1000, terms=3, seed=0)  # every sum of three one-digit numbers
    assert len({p.question for p in problems}) == 1000
    fn = MathRewardFn()
    for p in problems[:200]:
        numbers = [int(x) for x in p.question.split("+")]
        assert len(numbers) == 3 and all(0 <= n <= 9 for n in numbers)
        assert p.answer == str(sum(numbers))
        first = numbers[0] + numbers[1]
        expected = f"{numbers[0]}+{numbers[1]}={first},{first}+{numbers[2]}={sum(numbers)}"
        assert p.solution == f"<think>{expected}</think><answer>{p.answer}</answer>"
        assert fn(p.solution, p.answer)["accuracy"] == 1.0
        assert fn(p.wrong_solution, p.answer)["accuracy"] == 0.0
    assert [p.row() for p in arithmetic_problems(50, terms=3, seed=0)] == [p.row() for p in problems[:50]]
    assert [p.row() for p in arithmetic_problems(50, terms=3, seed=1)] != [p.row() for p in problems[:50]]
    with pytest.raises(ValueError, match="only 1000 distinct problems"):
        arithmetic_problems(1001, terms=3)
    with pytest.raises(ValueError, match="sums only"):
        arithmetic_problems(10, difficulty=2, terms=3)
    with pytest.raises(ValueError, match="at least 2"):
        arithmetic_problems(10, terms=1)


def test_fact_rows_of_multi_step_sums_are_their_distinct_steps() -> None:
    rows = fact_rows(arithmetic_problems(1000, terms=3, seed=0))
    # a+b for a, b in 0..9 and then s+c for s in 0..18, c in 0..9: 190 distinct one-step sums
    assert len(rows) == len({r["prompt"] for r in rows}) == 190
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("+")
        assert int(a) <= 18 and int(b) <= 9
        assert row["response"] == f"{a}+{b}={int(a) + int(b)}"


def test_countdown_problems_are_solvable_by_construction() -> None:
    problems = countdown_problems(60, num_numbers=4, max_number=12, max_target=60, seed=1)
    reward = CountdownRewardFn()
    keys = set()
    for p in problems:
        row = p.row()
        truth = json.loads(row["answer"])
        assert truth == {"target": row["target"], "numbers": row["numbers"]}
        assert len(truth["numbers"]) == 4 and all(1 <= n <= 12 for n in truth["numbers"])
        assert 1 <= truth["target"] <= 60
        assert str(truth["target"]) in p.question and str(truth["numbers"]) in p.question
        assert reward(p.solution, row["answer"]) == {"score": 1.0}  # the recorded equation is right
        assert reward(f"<answer>{row['solution']}</answer>", row["answer"]) == {"score": 1.0}
        assert reward(p.wrong_solution, row["answer"]) == {"score": 0.1}
        keys.add((tuple(sorted(truth["numbers"])), truth["target"]))
    assert len(keys) == 60
    again = countdown_problems(60, num_numbers=4, max_number=12, max_target=60, seed=1)
    assert [p.row() for p in again] == [p.row() for p in problems]


def test_countdown_says_when_the_ranges_are_too_narrow() -> None:
    with pytest.raises(ValueError, match="could only make"):
        countdown_problems(50, num_numbers=2, max_number=2, max_target=4)


def test_fact_rows_state_each_sum_in_another_surface_form_than_the_task() -> None:
    problems = arithmetic_problems(100, difficulty=1, seed=0)
    rows = fact_rows(problems)
    assert [r["prompt"] for r in rows] == [p.question + "=" for p in problems]
    for row, problem in zip(rows, problems, strict=True):
        a, b = problem.question.split("+")
        assert row["response"] == f"{a}+{b}={int(a) + int(b)}"
    # No fact is a task prompt nor in the task's answer format: the quickstart's held-out task
    # prompts stay unseen although the warm-up states all 100 facts.
    assert not {r["prompt"] for r in rows} & {p.question for p in problems}
    assert not any("<answer>" in r["response"] for r in rows)


def test_write_taskset_heads_the_sft_file_with_facts_and_cli_agrees(tmp_path: Path) -> None:
    problems = arithmetic_problems(100, difficulty=1, seed=0)
    train, test = split(problems, 25)
    paths = write_taskset(tmp_path / "api", train, test, sft=10, facts=problems)
    rows = read_jsonl(paths["sft"])
    assert rows == fact_rows(problems) + [{"prompt": p.question, "response": p.solution} for p in train[:10]]
    assert not {p.question for p in test} & {r["prompt"] for r in rows}
    cli = ["arithmetic", "--out", str(tmp_path / "cli"), "--train", "75", "--test", "25", "--sft", "10"]
    assert main([*cli, "--facts"]) == 0
    assert (tmp_path / "cli" / "sft" / "train.jsonl").read_text() == paths["sft"].read_text()
    # The quickstart's data, as its YAML's comment builds it by hand.
    three = arithmetic_problems(1000, terms=3, seed=0)
    train3, test3 = split(three, 100)
    api3 = write_taskset(tmp_path / "api3", train3, test3, sft=300, facts=three, untagged=225)
    cli3 = ["arithmetic", "--out", str(tmp_path / "cli3"), "--train", "900", "--test", "100"]
    assert main([*cli3, "--sft", "300", "--untagged", "225", "--facts", "--terms", "3"]) == 0
    for name in ("train.jsonl", "test.jsonl", "sft/train.jsonl"):
        assert (tmp_path / "cli3" / name).read_text() == (tmp_path / "api3" / name).read_text()
    assert len(read_jsonl(api3["sft"])) == 190 + 300


def test_untagged_solutions_end_with_the_bare_answer_which_math_reward_does_not_read(tmp_path: Path) -> None:
    problems = arithmetic_problems(40, terms=3, seed=0)
    train, test = split(problems, 10)
    rows = read_jsonl(write_taskset(tmp_path, train, test, sft=8, untagged=6)["sft"])
    assert [r["response"] for r in rows] == [untagged_solution(p.solution) for p in train[:6]] + [
        p.solution for p in train[6:8]
    ]
    p = train[0]
    assert untagged_solution(p.solution) == p.solution.split("<answer>")[0] + p.answer
    reward = MathRewardFn(format_score=0.0)
    assert reward(untagged_solution(p.solution), truth=p.answer)["accuracy"] == 0.0
    assert reward(p.solution, truth=p.answer)["accuracy"] == 1.0
    with pytest.raises(ValueError, match="untagged"):
        write_taskset(tmp_path / "x", train, test, sft=2, untagged=3)


def test_write_taskset_layout_and_disjoint_splits(tmp_path: Path) -> None:
    train, test = split(arithmetic_problems(90, difficulty=2, seed=0), 20)
    paths = write_taskset(tmp_path, train, test, sft=30, dpo=10)
    rows = {k: read_jsonl(p) for k, p in paths.items()}
    assert paths["train"] == tmp_path / "train.jsonl" and paths["test"] == tmp_path / "test.jsonl"
    assert (len(rows["train"]), len(rows["test"]), len(rows["sft"]), len(rows["dpo"])) == (70, 20, 30, 10)
    test_questions = {r["question"] for r in rows["test"]}
    assert not test_questions & {r["question"] for r in rows["train"]}
    assert not test_questions & {r["prompt"] for r in rows["sft"]}
    assert not test_questions & {r["prompt"] for r in rows["dpo"]}
    assert set(rows["sft"][0]) == {"prompt", "response"}
    assert set(rows["dpo"][0]) == {"prompt", "chosen", "rejected"}
    fn = MathRewardFn()
    truth = {r["question"]: r["answer"] for r in rows["train"]}
    for r in rows["dpo"]:
        assert fn(r["chosen"], truth[r["prompt"]])["accuracy"] == 1.0
        assert fn(r["rejected"], truth[r["prompt"]])["accuracy"] == 0.0
    with pytest.raises(ValueError, match="only 70 train problems"):
        write_taskset(tmp_path / "x", train, test, sft=71)


def test_command_line_writes_the_same_files_as_the_api(tmp_path: Path) -> None:
    cli_sizes = ["--train", "8", "--test", "4", "--sft", "8"]
    assert main(["countdown", "--out", str(tmp_path / "a"), *cli_sizes]) == 0
    out = subprocess.run(
        [sys.executable, "-m", "trinity_math.tasks", "countdown", "--out", str(tmp_path / "b"), *cli_sizes],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "train:" in out.stdout
    for name in ("train.jsonl", "test.jsonl", "sft/train.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "trinity_math.tasks",
            "arithmetic",
            "--out",
            str(tmp_path / "c"),
            "--train",
            "200",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "only 100 distinct problems" in bad.stderr


def test_math_vocabulary_covers_every_prompt_and_solution() -> None:
    from trinity.testing.tiny_model import CHAT_TEMPLATE

    texts = [R1_SYSTEM_PROMPT, BOXED_SYSTEM_PROMPT, BOXED_THINK_SYSTEM_PROMPT, "system user assistant"]
    for p in arithmetic_problems(50, difficulty=5) + countdown_problems(50):
        texts += [p.question, p.answer, p.solution, p.wrong_solution]
    # the template's literal text, without its Jinja syntax and special tokens
    texts.append(CHAT_TEMPLATE.split("{{ '")[1].split("'")[0].replace("<|im_start|>", ""))
    missing = {ch for text in texts for ch in text} - set(MATH_VOCAB_CHARS)
    assert not missing, f"characters the tokenizer would drop: {sorted(missing)}"


def test_create_math_model_is_deterministic_and_loads_like_any_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = create_math_model(tmp_path / "m1", seed=7)
    create_math_model(tmp_path / "m2", seed=7)
    create_math_model(tmp_path / "m3", seed=8)
    tokenizer = AutoTokenizer.from_pretrained(path)
    solution = countdown_problems(1)[0].solution
    ids = tokenizer(solution, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(solution)  # one token per character, none dropped
    assert tokenizer.decode(ids) == solution
    assert len(tokenizer) == len(set(MATH_VOCAB_CHARS)) + 4  # + pad, eos, im_start, im_end
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    weights = [AutoModelForCausalLM.from_pretrained(tmp_path / m).state_dict() for m in ("m1", "m2", "m3")]
    name = next(iter(weights[0]))
    assert all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    assert not (weights[0][name] == weights[2][name]).all()
