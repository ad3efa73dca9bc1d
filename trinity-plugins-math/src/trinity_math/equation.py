"""Safe evaluation of countdown equations written by a model.

Model output is never given to ``eval``: the text is parsed with :mod:`ast` and only integer
literals, ``+ - * /``, unary signs and parentheses are accepted; anything else (names, calls,
attributes, ``**``, ``%``, floats, strings) is rejected before any arithmetic happens.
Arithmetic is exact (:class:`fractions.Fraction`), and with no power operator and a length cap
the cost of evaluating is bounded by the input size, so no input can hang the caller.
"""

from __future__ import annotations

import ast
from fractions import Fraction

# Longer than any sensible equation over a handful of numbers; keeps parsing cheap.
MAX_EQUATION_CHARS = 256

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class EquationError(ValueError):
    """The text is not an arithmetic equation countdown accepts."""


def parse_equation(text: str) -> ast.expr:
    """Parse ``text`` into an expression tree made only of allowed nodes, or raise EquationError."""
    if len(text) > MAX_EQUATION_CHARS:
        raise EquationError(f"equation longer than {MAX_EQUATION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise EquationError(f"not an expression: {exc}") from None
    for node in ast.walk(tree.body):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise EquationError(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.UAdd, ast.USub)):
                raise EquationError(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:  # bool is an int subclass; floats are not countdown numbers
                raise EquationError(f"{node.value!r} is not an integer")
        elif not isinstance(node, ast.operator | ast.unaryop):
            raise EquationError(f"{type(node).__name__} is not allowed in an equation")
    return tree.body


def numbers_used(tree: ast.expr) -> list[int]:
    """The integer literals of a parsed equation, in reading order."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    nodes.sort(key=lambda n: (n.lineno, n.col_offset))
    return [n.value for n in nodes]


def evaluate(tree: ast.expr) -> Fraction:
    """Exact value of a tree from :func:`parse_equation`; EquationError on division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    if isinstance(tree, ast.UnaryOp):
        value = evaluate(tree.operand)
        return -value if isinstance(tree.op, ast.USub) else value
    if isinstance(tree, ast.BinOp):
        left, right = evaluate(tree.left), evaluate(tree.right)
        if isinstance(tree.op, ast.Div) and right == 0:
            raise EquationError("division by zero")
        return _BINARY[type(tree.op)](left, right)
    raise EquationError(f"{type(tree).__name__} is not allowed in an equation")
