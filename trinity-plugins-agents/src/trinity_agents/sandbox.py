"""The tools of the AgentScope workflows: a safe calculator and a sandboxed Python runner.

:func:`calculate` evaluates arithmetic by walking Python's AST: numbers, ``+ - * / // % **``
(``^`` is read as ``**``), parentheses and a fixed list of functions and constants
(:data:`FUNCTIONS`, :data:`CONSTANTS`). Nothing else is accepted (no names, attributes,
subscripts, calls of anything but those functions, comprehensions, lambdas, strings), so nothing
is ever ``eval``-ed. Big powers, factorials and numbers are refused before they are computed.

:func:`run_python` runs code in a child process, ``sys.executable -I`` (isolated mode: no
``PYTHON*`` variables, no user site-packages, the current directory not on ``sys.path``), with:

- a wall-clock ``timeout``: the child runs in its own session (process group), and the whole
  group is killed with ``SIGKILL`` when the time is up, and also after a normal exit (so
  background processes the code started do not outlive the call);
- resource limits set in the child before the code runs: ``RLIMIT_AS`` (address space,
  ``memory_mb``), ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_FSIZE`` (largest file it may write,
  ``file_size_mb``; writing more fails with ``OSError``) and no core dumps;
- a fresh temporary working directory, also ``HOME`` and ``TMPDIR``, deleted afterwards;
- a minimal environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``, one-thread BLAS settings):
  nothing of the parent's environment (tokens, keys) is passed on;
- no network for Python code: before the code runs, ``socket.socket`` (and ``_socket.socket``,
  ``socket.create_connection``, ``socket.socketpair``, ``socket.fromfd``) are replaced by
  functions raising ``PermissionError``;
- stdin closed; stdout and stderr go to files (capped by ``RLIMIT_FSIZE``), of which the first
  ``max_output_chars`` characters are returned.

What it does **not** stop: it is a guard against accidents and runaway code, not a security
boundary against hostile code. Code can still read and write any file the user running Trinity
can (outside the temporary directory too), start other programs (``subprocess``, ``os.system``)
that are not bound by the socket patch, reach the network through ``ctypes`` or such programs,
and fork (the children share the limits and are killed with the group unless they leave it with
``setsid``). For untrusted code, run the explorer in a container or VM without network.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

# -- calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 1000
MAX_ABS_VALUE = 10**100  # larger intermediate integers are refused
MAX_POWER_DIGITS = 10_000  # refuse a ** b when the result would have more digits
MAX_FACTORIAL = 1000

FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": math.factorial,
    "comb": math.comb,
    "perm": math.perm,
    "gcd": math.gcd,
    "lcm": math.lcm,
}
CONSTANTS = {"pi": math.pi, "e": math.e}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not one the calculator evaluates (the message says why)."""


def _check_size(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"unsupported value {value!r}")
    if isinstance(value, int) and abs(value) > MAX_ABS_VALUE:
        raise CalculatorError("number too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value


def _power(base: Any, exponent: Any) -> Any:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and exponent * math.log10(abs(base)) > MAX_POWER_DIGITS
    ):
        raise CalculatorError("power too large")
    try:
        result = base**exponent
    except OverflowError:
        raise CalculatorError("power too large") from None
    if isinstance(result, complex):
        raise CalculatorError("complex result")
    return result


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return _check_size(node.value)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("number too large") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords:
            raise CalculatorError("keyword arguments are not supported")
        args = [_evaluate(a) for a in node.args]
        name = node.func.id
        if name == "factorial" and args and isinstance(args[0], (int, float)) and args[0] > MAX_FACTORIAL:
            raise CalculatorError(f"factorial argument above {MAX_FACTORIAL}")
        if name in ("comb", "perm") and any(isinstance(a, int) and a > MAX_FACTORIAL for a in args):
            raise CalculatorError(f"{name} argument above {MAX_FACTORIAL}")
        try:
            return _check_size(FUNCTIONS[name](*args))
        except (TypeError, ValueError, OverflowError) as exc:
            raise CalculatorError(f"{name}: {exc}") from None
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def format_number(value: Any) -> str:
    """``24`` for ``24.0``, ``0.3333333333333333`` for a third: integral values print as integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def calculate(expression: str) -> str:
    """The value of an arithmetic ``expression`` as text; ``CalculatorError`` when it cannot be
    evaluated (bad syntax, anything but arithmetic, too large)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError("invalid syntax") from None
    return format_number(_evaluate(tree))


# -- Python sandbox --------------------------------------------------------------------------

# Runs in the child (``python -I -c``): argv[1] is the limits as JSON, argv[2] the code's path.
_BOOTSTRAP = r"""
import json, resource, signal, sys
_limits = json.loads(sys.argv[1])
_path = sys.argv[2]
def _set(kind, value):
    if value is not None:
        resource.setrlimit(kind, (value, value))
_set(resource.RLIMIT_CORE, 0)
_set(resource.RLIMIT_CPU, _limits["cpu_seconds"])
_set(resource.RLIMIT_FSIZE, _limits["file_size_bytes"])
_set(resource.RLIMIT_AS, _limits["memory_bytes"])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises OSError instead
if not _limits["network"]:
    import _socket, socket
    def _no_network(*args, **kwargs):
        raise PermissionError("network access is disabled in this sandbox")
    for _mod, _names in ((socket, ("socket", "create_connection", "socketpair", "fromfd",
                                   "create_server")), (_socket, ("socket", "socketpair"))):
        for _name in _names:
            if hasattr(_mod, _name):
                setattr(_mod, _name, _no_network)
with open(_path, encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
sys.argv = ["main.py"]
del json, resource, signal, _set, _f, _limits, _path
exec(_code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
"""


@dataclass
class SandboxResult:
    """What a :func:`run_python` call gave."""

    returncode: int | None  #: the exit status (negative: killed by that signal); None if it did not start
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0
    truncated: bool = False  #: stdout or stderr was cut at ``max_output_chars``

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def to_text(self) -> str:
        """The result as the tool shows it to the model."""
        stderr = self.stderr
        if self.timed_out:
            stderr = (
                stderr + "\n" if stderr else ""
            ) + "TimeoutError: the code was killed: it ran out of time"
        return (
            f"<returncode>{self.returncode}</returncode>"
            f"<stdout>{self.stdout}</stdout>"
            f"<stderr>{stderr}</stderr>"
        )


def _read(path: str, limit: int) -> tuple[str, bool]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(limit + 1)
    except OSError:
        return "", False
    if len(text) > limit:
        return text[:limit] + "\n[output truncated]", True
    return text, False


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_python(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int | None = 512,
    cpu_seconds: int | None = None,
    file_size_mb: float | None = 16,
    max_output_chars: int = 8000,
    network: bool = False,
) -> SandboxResult:
    """Run ``code`` in a sandboxed child Python (see the module docstring) and return its
    result. ``cpu_seconds`` defaults to ``ceil(timeout) + 1``; ``None`` limits turn that
    limit off. Blocking: call it through ``asyncio.to_thread`` from async code."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a string, got {type(code).__name__}")
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    limits = {
        "memory_bytes": None if memory_mb is None else int(memory_mb * 1024 * 1024),
        "cpu_seconds": math.ceil(timeout) + 1 if cpu_seconds is None else int(cpu_seconds),
        "file_size_bytes": None if file_size_mb is None else int(file_size_mb * 1024 * 1024),
        "network": bool(network),
    }
    root = tempfile.mkdtemp(prefix="trinity-sandbox-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work)
        code_path = os.path.join(root, "main.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": work,
            "TMPDIR": work,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",  # ignored under -I; kept for programs it starts
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        out_path, err_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP, json.dumps(limits), code_path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=work,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # the code's own children too
                proc.wait()
        seconds = time.monotonic() - start
        stdout, cut_out = _read(out_path, max_output_chars)
        stderr, cut_err = _read(err_path, max_output_chars)
        return SandboxResult(
            returncode=proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            seconds=seconds,
            truncated=cut_out or cut_err,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


__all__ = [
    "CONSTANTS",
    "FUNCTIONS",
    "CalculatorError",
    "SandboxResult",
    "calculate",
    "format_number",
    "run_python",
]
