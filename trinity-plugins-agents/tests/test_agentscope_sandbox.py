"""The AgentScope workflows' tools and answer checking, without AgentScope: the sandboxed Python
runner (time, memory, file-size limits, no network, a fresh working directory, a clean
environment), the AST calculator (valid, malformed and hostile input) and the math reward."""

from __future__ import annotations

import os
import time

import pytest

from trinity_agents.agentscope_react import (
    answers_match,
    as_number,
    final_answer,
    last_boxed,
    math_reward,
    reference_answer,
)
from trinity_agents.sandbox import CalculatorError, calculate, run_python

# -- sandbox ---------------------------------------------------------------------------------


def test_runs_code_and_captures_output():
    result = run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)")
    assert result.ok and result.returncode == 0
    assert result.stdout == "42\n" and result.stderr == "oops\n"
    assert result.to_text() == "<returncode>0</returncode><stdout>42\n</stdout><stderr>oops\n</stderr>"


def test_errors_are_reported_not_raised():
    result = run_python("raise ValueError('bad')")
    assert result.returncode == 1 and not result.ok
    assert "ValueError: bad" in result.stderr


def test_timeout_kills_an_infinite_loop_and_its_children():
    start = time.monotonic()
    code = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nwhile True: pass"
    result = run_python(code, timeout=1.0)
    assert time.monotonic() - start < 10
    assert result.timed_out and result.returncode == -9
    assert "TimeoutError" in result.to_text()


def test_cpu_limit_backs_up_the_timeout():
    # With a long wall-clock timeout, RLIMIT_CPU (1 s) still stops a busy loop.
    result = run_python("while True: pass", timeout=30, cpu_seconds=1)
    assert not result.timed_out and result.returncode is not None and result.returncode < 0
    assert result.seconds < 20


def test_memory_limit():
    result = run_python("x = bytearray(400 * 1024 * 1024)\nprint('allocated')", memory_mb=200)
    assert result.returncode != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert run_python("x = bytearray(20 * 1024 * 1024)\nprint(len(x))", memory_mb=200).stdout == "20971520\n"


def test_no_network():
    code = (
        "import socket\n"
        "for make in (lambda: socket.socket(), lambda: socket.create_connection(('127.0.0.1', 9))):\n"
        "    try:\n"
        "        make()\n"
        "        print('connected')\n"
        "    except PermissionError as exc:\n"
        "        print('blocked', exc)\n"
        "import _socket\n"
        "try:\n"
        "    _socket.socket()\n"
        "except PermissionError:\n"
        "    print('blocked raw')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("blocked") == 3 and "connected" not in result.stdout
    # the switch is real: with network allowed a socket can be made
    assert run_python("import socket; socket.socket().close(); print('ok')", network=True).stdout == "ok\n"


def test_fresh_working_directory_removed_afterwards(tmp_path):
    code = (
        "import os, tempfile\n"
        "print(os.listdir('.'))\n"
        "open('scratch.txt', 'w').write('x')\n"
        "print(os.getcwd())\n"
        "print(os.environ['HOME'] == os.getcwd() == tempfile.gettempdir())\n"
    )
    first = run_python(code)
    listing, cwd, same = first.stdout.splitlines()
    assert listing == "[]" and same == "True"
    assert not os.path.exists(cwd)  # deleted with what the code wrote there
    second = run_python(code)
    assert second.stdout.splitlines()[0] == "[]" and second.stdout.splitlines()[1] != cwd


def test_file_size_limit():
    code = "open('big', 'wb').write(b'x' * (3 * 1024 * 1024))\nprint('written')"
    result = run_python(code, file_size_mb=1)
    assert result.returncode != 0 and "File too large" in result.stderr and "written" not in result.stdout


def test_output_is_capped():
    result = run_python("print('y' * 100000)", max_output_chars=1000)
    assert result.truncated and len(result.stdout) < 1100 and result.stdout.endswith("[output truncated]")


def test_parent_environment_is_not_passed_on(monkeypatch):
    monkeypatch.setenv("SECRET_API_KEY", "s3cret")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    result = run_python("import os, sys\nprint('SECRET_API_KEY' in os.environ)\nprint(sys.flags.isolated)")
    assert result.stdout == "False\n1\n"


# -- calculator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("48 / 2 + 48", "72"),
        ("(48 + 24) / 3", "24"),
        ("2^10", "1024"),
        ("7 // 2 + 7 % 2", "4"),
        ("-3 ** 2", "-9"),
        ("sqrt(16) + abs(-2)", "6"),
        ("round(2 * pi, 3)", "6.283"),
        ("factorial(5) + comb(5, 2)", "130"),
        ("1 / 3", str(1 / 3)),
        ("12 × 3 ÷ 4", "9"),
    ],
)
def test_calculator_valid(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("", "empty"),
        ("(1 + 2", "invalid syntax"),
        ("1 +* 2", "invalid syntax"),
        ("1 / 0", "division by zero"),
        ("x + 1", "unknown name"),
        ("sqrt(-1)", "sqrt"),
        ("'a' * 3", "unsupported value"),
        ("True + 1", "unsupported value"),
    ],
)
def test_calculator_malformed(expression, reason):
    with pytest.raises(CalculatorError, match=reason):
        calculate(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('echo hi')",
        "().__class__.__bases__[0].__subclasses__()",
        "open('/etc/passwd').read()",
        "eval('1+1')",
        "(lambda: 1)()",
        "[x for x in range(10)]",
        "abs.__self__",
        "sqrt(x=4)",
        "9 ** 9 ** 9",
        "10 ** 10 ** 10",
        "factorial(10 ** 6)",
        "1" * 2000,
    ],
)
def test_calculator_refuses_hostile_input_quickly(expression):
    start = time.monotonic()
    with pytest.raises(CalculatorError):
        calculate(expression)
    assert time.monotonic() - start < 1


# -- answers ---------------------------------------------------------------------------------


def test_answer_extraction():
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed(r"\boxed{unclosed") is None
    assert reference_answer("Natalia sold 48/2 = 24 clips ... #### 72") == "72"
    assert reference_answer(r"so \boxed{5}") == "5" and reference_answer(" 17 ") == "17"
    assert final_answer(r"The answer is \boxed{72}.") == "72" and final_answer(" 72 ") == "72"


@pytest.mark.parametrize(
    ("answer", "truth", "equal"),
    [
        ("72", "72", True),
        ("72.0", "72", True),
        ("1,000", "1000", True),
        ("$18", "18", True),
        (r"\frac{1}{2}", "0.5", True),
        ("1/2", r"\dfrac{1}{2}", True),
        (r"72\%", "72", True),
        ("71", "72", False),
        ("", "72", False),
        (r"\text{seventy}", "72", False),
    ],
)
def test_answers_match(answer, truth, equal):
    assert answers_match(answer, truth) is equal


def test_numbers_are_exact():
    assert as_number("0.1") + as_number("0.2") == as_number("0.3")
    assert as_number("1e5") is None and as_number("12 apples") is None


def test_math_reward():
    assert math_reward(r"so it is \boxed{72}", "... #### 72") == 1.0
    assert math_reward(r"so it is \boxed{73}", "... #### 72") == 0.0
    assert math_reward("72", "72") == 1.0
    assert math_reward("I think 72", "72") == 0.0  # prose without a box is not an answer


def test_symbolic_answers_use_math_verify_when_trinity_math_is_installed():
    pytest.importorskip("trinity_math.verify", reason="symbolic comparison needs trinity-plugins-math")
    assert answers_match(r"\frac{\sqrt{8}}{2}", r"\sqrt{2}")
    assert not answers_match(r"\sqrt{3}", r"\sqrt{2}")
