"""Cheap refusal of hostile answers, before math-verify (sympy) ever evaluates them.

A model can write answers whose *evaluation* is absurdly expensive: ``9**9**9**9`` or
``10^{10^{100}}`` (sympy computes the integer), a 100,000-digit number, a brace nested 10,000
deep (the LaTeX parser's time grows exponentially with nesting), a megabyte of text. The
deadline in :mod:`trinity_math.verify` stops most of them, but only once it is spent, and some
of the work (big-integer arithmetic in C) cannot be interrupted at all. :func:`refusal_reason`
looks at the text alone, in time linear in its length and without evaluating anything, and
names what makes it hostile:

* more than ``max_chars`` characters;
* brackets or braces nested more than :data:`MAX_NESTING` deep;
* a number literal of more than :data:`MAX_LITERAL_DIGITS` digits;
* a value whose exact form would need more than :data:`MAX_VALUE_DIGITS` digits, by an upper
  bound computed over a tolerant parse of the expression (powers, factorials, binomials,
  products, sums, fractions): ``a^b`` costs ``digits(a) * |b|``, so towers and huge exponents
  are refused while ``2^{10}``, ``2^{2023}`` or ``x^{y^{z}}`` (symbolic, never expanded) pass.

The bounds are far above any answer in a math data set; a refused answer is scored as wrong.
"""

from __future__ import annotations

import logging
import math
import re
from typing import NamedTuple

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 2_000
"""Longest extracted answer (``<answer>`` content, ``\\boxed{}`` content) considered."""
MAX_RESPONSE_CHARS = 100_000
"""Longest whole response considered (``accuracy_reward`` without a ``\\boxed{}``)."""
MAX_NESTING = 10
"""Deepest nesting of ``( [ {`` accepted; the LaTeX parser's time grows exponentially with it."""
MAX_LITERAL_DIGITS = 1_000
"""Most digits in one written number."""
MAX_VALUE_DIGITS = 10_000
"""Most digits (log10 of numerator or denominator) an answer's value may need."""

# Groups plus command arguments: ``\\sqrt{\\frac{1}{2}}`` is 2 brackets deep, 4 structures deep.
_MAX_STRUCTURE = 4 * MAX_NESTING
_LOG10_2 = math.log10(2)
_LOG10_E = math.log10(math.e)
_OPENERS = "([{"
_CLOSERS = ")]}"

# One token at a time; anything else (a space, an unknown symbol) is skipped or a separator.
_TOKEN = re.compile(
    r"""
    (?P<num>(?:[0-9]+(?:(?:,|\{,\}|\\[,!\ ])[0-9]{3})*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<cmd>\\(?:[A-Za-z]+|.))
    | (?P<word>[A-Za-z]{2,})
    | (?P<sym>[A-Za-z])
    | (?P<pow>\*\*|\^)
    | (?P<rel>!=|<=|>=|==)
    | (?P<op>[-+*/!_'%()\[\]{}])
    | (?P<sep>[^\s])
    """,
    re.VERBOSE | re.DOTALL,
)
# Commands that are layout, not values.
_IGNORED = {
    "left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl",
    "biggr", "Biggl", "Biggr", "displaystyle", "textstyle", "scriptstyle", "limits", "nolimits",
    ",", ";", ":", "!", " ", "quad", "qquad", "%", "$",
}  # fmt: skip
_MUL = {"cdot", "times", "div", "ast", "star", "over"}
_ADD = {"pm", "mp"}
_FRAC = {"frac", "dfrac", "tfrac", "cfrac"}
_BINOM = {"binom", "dbinom", "tbinom", "choose"}
_TEXT = {"text", "textbf", "textit", "textrm", "mathrm", "mathbf", "mathit", "operatorname", "mbox"}
_BRACKET_TOKENS = {"(", "[", "{", ")", "]", "}", "\\{", "\\}"}
# Relations, set operations, delimiters: they separate values, they do not combine them.
_SEPARATOR_CMD = {
    "le", "leq", "ge", "geq", "ne", "neq", "lt", "gt", "approx", "equiv", "sim", "in", "notin",
    "cup", "cap", "setminus", "subset", "subseteq", "supset", "supseteq", "to", "rightarrow",
    "Rightarrow", "implies", "iff", "mid", "vert", "|", "\\", "land", "lor", "wedge", "vee",
    "begin", "end", "qquad", "ldots", "cdots", "dots", "langle", "rangle", "lfloor", "rfloor",
    "lceil", "rceil", "lbrace", "rbrace",
}  # fmt: skip


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Value(NamedTuple):
    """Upper bound on log10 of the value's numerator and denominator; whether it is a number."""

    mag: float
    numeric: bool


_SYMBOL = _Value(1.0, False)  # a letter: treated as if it were up to 10, but never computed


def _times_pow10(m: float, e: float) -> float:
    """``m * 10**e``, saturating at infinity."""
    if m <= 0:
        return 0.0
    if e > 300:
        return math.inf
    return m * 10.0**e


_BRACKET = re.compile(r"[()\[\]{}]")


def _matched_brackets(text: str) -> tuple[int, set[int]]:
    """Deepest nesting of matched ``( [ {`` pairs, and the positions of their characters.

    Any opener closes with any closer (``(1, 2]`` is an interval). Openers never closed and
    closers never opened are left out: parsers give up on them at once, at no cost.
    """
    stack: list[int] = []
    matched: set[int] = set()
    for m in _BRACKET.finditer(text):
        pos = m.start()
        if text[pos] in _OPENERS:
            stack.append(pos)
        elif stack:
            matched.add(stack.pop())
            matched.add(pos)
    depth = deepest = 0
    for pos in sorted(matched):
        if text[pos] in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest, matched


def nesting_depth(text: str) -> int:
    """Deepest nesting of matched ``( [ {`` pairs in ``text``."""
    return _matched_brackets(text)[0]


class _Estimator:
    """A tolerant precedence parser that computes :class:`_Value` bounds instead of values.

    It never fails on odd input (an unknown token is a symbol or a separator); recursion only
    happens for groups, whose depth :func:`refusal_reason` has already bounded.
    """

    def __init__(self, text: str, matched: set[int]) -> None:
        self.tokens: list[tuple[str, str]] = []
        for m in _TOKEN.finditer(text):
            kind, token = m.lastgroup or "sep", m.group()
            bracket = m.start() + (kind == "cmd")  # ``\{`` is a brace too
            if token in _BRACKET_TOKENS and bracket not in matched:
                kind = "sep"  # an opener never closed, or a closer never opened
            self.tokens.append((kind, token))
        self.i = 0
        self.depth = 0

    # -- token helpers -------------------------------------------------------------------
    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _check(self, value: _Value) -> _Value:
        if value.mag > MAX_VALUE_DIGITS:
            raise _Refused(f"value needs more than {MAX_VALUE_DIGITS} digits")
        return value

    def _is_opener(self, tok: tuple[str, str]) -> bool:
        kind, text = tok
        return kind in ("op", "cmd") and text[-1] in _OPENERS and text in _BRACKET_TOKENS

    def _is_closer(self, tok: tuple[str, str]) -> bool:
        kind, text = tok
        return kind in ("op", "cmd") and text[-1] in _CLOSERS and text in _BRACKET_TOKENS

    def _is_separator(self, tok: tuple[str, str]) -> bool:
        kind, text = tok
        if kind in ("sep", "word", "rel"):
            return True
        return kind == "cmd" and text[1:] in _SEPARATOR_CMD

    def _skip_ignored(self) -> None:
        while (tok := self._peek()) is not None and tok[0] == "cmd" and tok[1][1:] in _IGNORED:
            self.i += 1

    # -- grammar -------------------------------------------------------------------------
    def whole(self) -> _Value:
        """The whole text: a closer without an opener is skipped, not an end."""
        best = _Value(0.0, True)
        while self._peek() is not None:
            value = self.sequence()
            if value.mag > best.mag:
                best = value
            if self._peek() is not None:
                self.i += 1  # a stray closer
        return best

    def sequence(self) -> _Value:
        """Values separated by separators, up to a closer or the end: the largest bound."""
        best = _Value(0.0, True)
        while True:
            self._skip_ignored()
            tok = self._peek()
            if tok is None or self._is_closer(tok):
                return best
            if self._is_separator(tok):
                self.i += 1
                continue
            start = self.i
            value = self.sum()
            if value.mag > best.mag:
                best = value
            if self.i == start:  # nothing consumed (a stray operator): skip it
                self.i += 1

    def sum(self) -> _Value:
        value = self.term()
        while True:
            self._skip_ignored()
            tok = self._peek()
            if tok is None or not (tok[1] in ("+", "-") or (tok[0] == "cmd" and tok[1][1:] in _ADD)):
                return value
            self.i += 1
            right = self.term()
            # p/q + r/s = (ps + rq)/(qs)
            value = self._check(_Value(value.mag + right.mag + _LOG10_2, value.numeric and right.numeric))

    def _starts_factor(self, tok: tuple[str, str]) -> bool:
        kind, text = tok
        if kind in ("num", "sym") or self._is_opener(tok):
            return True
        if kind == "cmd":
            name = text[1:]
            return not (
                name in _SEPARATOR_CMD or name in _MUL or name in _ADD or name in _IGNORED or name == "}"
            )
        return False

    def term(self) -> _Value:
        value = self.factor()
        while True:
            self._skip_ignored()
            tok = self._peek()
            if tok is None:
                return value
            kind, text = tok
            if text in ("*", "/") or (kind == "cmd" and text[1:] in _MUL):
                self.i += 1
            elif not self._starts_factor(tok):  # implicit multiplication continues only on a factor
                return value
            right = self.factor()
            value = self._check(_Value(value.mag + right.mag, value.numeric and right.numeric))

    def factor(self) -> _Value:
        # Unary signs, iteratively.
        while True:
            self._skip_ignored()
            tok = self._peek()
            if tok is not None and (tok[1] in ("+", "-") or (tok[0] == "cmd" and tok[1][1:] in _ADD)):
                self.i += 1
                continue
            break
        # A right-associative chain of powers: collect the operands, then fold from the right.
        operands = [self.postfix()]
        while (tok := self._peek()) is not None and tok[0] == "pow":
            self.i += 1
            while (sign := self._peek()) is not None and sign[1] in ("+", "-"):
                self.i += 1
            operands.append(self.postfix())
        value = operands.pop()
        while operands:
            base = operands.pop()
            if value.numeric:
                # a^b with |b| <= 10^mag(b): numerator and denominator of a, raised to |b|.
                value = self._check(_Value(_times_pow10(base.mag, value.mag), base.numeric))
            else:
                value = _Value(base.mag, False)  # symbolic exponent: nothing is computed
        return value

    def postfix(self) -> _Value:
        value = self.atom()
        while (tok := self._peek()) is not None:
            kind, text = tok
            if text == "!":
                self.i += 1
                if value.numeric:
                    # n! < n^n with n <= 10^mag
                    value = self._check(_Value(_times_pow10(max(value.mag, 1.0), value.mag), True))
            elif text in ("%", "'") or (kind == "cmd" and text in ("\\%", "\\prime")):
                self.i += 1
            elif text == "_":
                self.i += 1
                self.atom()  # a subscript names a symbol; checked, not combined
                value = _SYMBOL
            else:
                return value
        return value

    def _group(self) -> _Value:
        """After an opener: the sequence up to the matching closer (or the end)."""
        value = self.sequence()
        if self._peek() is not None:
            self.i += 1  # the closer
        return value

    def atom(self) -> _Value:
        # Groups and command arguments (``\\sqrt\\sqrt\\sqrt...`` has no brackets) nest here.
        self.depth += 1
        if self.depth > _MAX_STRUCTURE:
            raise _Refused(f"expression nested more than {_MAX_STRUCTURE} deep")
        try:
            return self._atom()
        finally:
            self.depth -= 1

    def _atom(self) -> _Value:
        self._skip_ignored()
        tok = self._peek()
        if tok is None or self._is_closer(tok) or self._is_separator(tok):
            return _SYMBOL  # a missing operand (``^5`` with no base): an unknown
        kind, text = tok
        self.i += 1
        if kind == "num":
            return self._check(_number(text))
        if kind == "sym":
            return _SYMBOL
        if self._is_opener(tok):
            return self._group()
        if kind == "cmd":
            name = text[1:]
            if name in _FRAC:
                num, den = self.atom(), self.atom()
                return self._check(_Value(num.mag + den.mag, num.numeric and den.numeric))
            if name in _BINOM:
                n, _k = self.atom(), self.atom()
                if n.numeric:  # C(n, k) <= 2^n
                    return self._check(_Value(_times_pow10(_LOG10_2, n.mag), True))
                return _Value(n.mag, False)
            if name == "sqrt":
                if (tok := self._peek()) is not None and tok[1] == "[":
                    self.i += 1
                    self._group()
                return self.atom()  # a root is no bigger than its radicand
            if name == "exp":
                arg = self.atom()
                if arg.numeric:
                    return self._check(_Value(_times_pow10(_LOG10_E, arg.mag), False))
                return _SYMBOL
            if name in _TEXT:
                self.atom()
                return _SYMBOL
            return _SYMBOL  # \pi, \alpha, \sin, \boxed, ...: a symbol (its argument follows)
        return _SYMBOL  # a stray operator


def _number(text: str) -> _Value:
    """Bound for a written number: digits, thousands separators, a decimal point, an exponent."""
    mantissa, _, exponent = text.replace("E", "e").partition("e")
    whole, _, frac = re.sub(r"[^0-9.]", "", mantissa).partition(".")
    digits = (whole + frac).lstrip("0")
    if len(whole) + len(frac) > MAX_LITERAL_DIGITS:
        raise _Refused(f"a number of more than {MAX_LITERAL_DIGITS} digits")
    mag = max(math.log10(int(digits)) if 0 < len(digits) <= 15 else float(len(digits)), float(len(frac)))
    if exponent:
        exp_digits = exponent.lstrip("+-").lstrip("0")
        mag += float(exp_digits or 0) if len(exp_digits) <= 15 else math.inf
    return _Value(mag, True)


def refusal_reason(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Why ``text`` is too hostile to evaluate, or ``None`` if math-verify may look at it.

    Linear in ``len(text)`` (and nothing at all beyond ``max_chars``); evaluates nothing.
    """
    if len(text) > max_chars:
        return f"answer longer than {max_chars} characters"
    depth, matched = _matched_brackets(text)
    if depth > MAX_NESTING:
        return f"brackets nested {depth} deep (more than {MAX_NESTING})"
    try:
        _Estimator(text, matched).whole()
    except _Refused as refused:
        return refused.reason
    except RecursionError:  # not reachable within the bounds above; refuse rather than crash
        return "expression nested too deep"
    except Exception:  # a bug here must not cost a right answer: the deadline still bounds it
        logger.exception("trinity_math.guard failed on %.80r; not refusing it", text)
    return None
