"""Parsing a dim expression of the text form ("B*T", "P + 1", "ceiling(T/64)") with bounded work.

A small recursive-descent parser over integers, the declared dims, + - * / //, integer powers
and the functions the printer writes (ceiling, floor, Max, Min, Mod, FloorDiv, CeilDiv). It
never evaluates text (sympify would), and it refuses what would make sympy work for long: a
text over MAX_CHARS, more than MAX_TOKENS tokens, nesting deeper than MAX_DEPTH, an integer
over MAX_INT, a power over MAX_POWER, and an expression whose expanded form would be large
(a degree over MAX_DEGREE or over MAX_TERMS terms: `(B+T+1)**8*(B+T+2)**8*...` is short text
that sympy's expansion takes a minute over). Every refusal is a ValueError naming the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import sympy

MAX_CHARS = 256
MAX_TOKENS = 128
MAX_DEPTH = 16
MAX_INT = 1 << 62
MAX_POWER = 8
MAX_DEGREE = 8
MAX_TERMS = 1024

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|\*\*|[-+*/(),]))")
_FUNCS = {
    "ceiling": (1, sympy.ceiling), "floor": (1, sympy.floor), "Max": (None, sympy.Max), "Min": (None, sympy.Min),
    "Mod": (2, sympy.Mod), "FloorDiv": (2, lambda a, b: sympy.floor(a / b)),
    "CeilDiv": (2, lambda a, b: sympy.ceiling(a / b)),
}


def _tokens(text: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        m = _TOKEN.match(text, i)
        if not m:
            raise ValueError(f"unexpected {text[i:].strip()[:10]!r} in dim {text!r}")
        num, name, op = m.groups()
        out.append(("int", num) if num else ("name", name) if name else ("op", op))
        if len(out) > MAX_TOKENS:
            raise ValueError(f"dim expression {text[:40]!r}... is too long (over {MAX_TOKENS} tokens)")
        i = m.end()
    return out


class _Parser:
    def __init__(self, text: str, symbols: Mapping[str, sympy.Symbol]):
        self.text, self.symbols = text, symbols
        self.toks, self.i, self.depth = _tokens(text), 0, 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ValueError(f"expected {value or 'more'} in dim {self.text!r}")
        self.i += 1
        return tok

    def nested(self, fn):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError(f"dim {self.text[:40]!r} nests deeper than {MAX_DEPTH}")
        try:
            return fn()
        finally:
            self.depth -= 1

    # Each method returns (value, degree, terms): upper bounds of the expanded form's degree
    # and number of terms, checked as the expression grows, before sympy expands anything.

    def bounded(self, value, degree: int, terms: int):
        if degree > MAX_DEGREE or terms > MAX_TERMS:
            raise ValueError(f"dim {self.text[:40]!r} expands too far (degree {degree}, {terms} terms; "
                             f"at most {MAX_DEGREE} and {MAX_TERMS})")
        return value, degree, terms

    def expr(self):
        value, deg, terms = self.term()
        while (tok := self.peek()) and tok[1] in ("+", "-"):
            self.take()
            rhs, d, t = self.term()
            value, deg, terms = self.bounded(value + rhs if tok[1] == "+" else value - rhs, max(deg, d), terms + t)
        return value, deg, terms

    def term(self):
        value, deg, terms = self.unary()
        while (tok := self.peek()) and tok[1] in ("*", "/", "//"):
            self.take()
            rhs, d, t = self.unary()
            value = value * rhs if tok[1] == "*" else value / rhs if tok[1] == "/" else sympy.floor(value / rhs)
            value, deg, terms = self.bounded(value, deg + d, terms * t)
        return value, deg, terms

    def unary(self):
        if (tok := self.peek()) and tok[1] == "-":
            self.take()
            value, deg, terms = self.nested(self.unary)
            return -value, deg, terms
        base, deg, terms = self.atom()
        if (tok := self.peek()) and tok[1] == "**":
            self.take()
            kind, exp = self.take()
            if kind != "int" or len(exp) > 2 or int(exp) > MAX_POWER:
                raise ValueError(f"dim {self.text!r}: only powers by an integer up to {MAX_POWER}")
            n = int(exp)
            return self.bounded(base ** n, deg * n, terms ** n)
        return base, deg, terms

    def atom(self):
        kind, value = self.take()
        if kind == "int":
            if len(value) > 19 or int(value) > MAX_INT:
                raise ValueError(f"dim {self.text!r}: integer {value[:20]} is too large")
            return sympy.Integer(int(value)), 0, 1
        if kind == "name":
            if value in _FUNCS:
                return self.nested(lambda: self.call(value))
            if value not in self.symbols:
                raise ValueError(f"undeclared dim {value!r} in {self.text!r}")
            return self.symbols[value], 1, 1
        if value == "(":
            inner = self.nested(self.expr)
            self.take(")")
            return inner
        raise ValueError(f"unexpected {value!r} in dim {self.text!r}")

    def call(self, name: str):
        arity, fn = _FUNCS[name]
        self.take("(")
        args = [self.expr()]
        while (tok := self.peek()) and tok[1] == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        if arity is not None and len(args) != arity:
            raise ValueError(f"{name} takes {arity} argument(s) in dim {self.text!r}")
        # a function of its arguments is one term: as wide as the widest argument, and its
        # arguments' own expansions are bounded by their own counts
        return self.bounded(fn(*(a[0] for a in args)), sum(a[1] for a in args), sum(a[2] for a in args))


def parse_dim(text: str, symbols: Mapping[str, sympy.Symbol]) -> sympy.Expr:
    """The sympy expression of a dim's text; a ValueError says what is wrong with it."""
    if len(text) > MAX_CHARS:
        raise ValueError(f"dim expression {text[:40]!r}... is longer than {MAX_CHARS} characters")
    p = _Parser(text, symbols)
    try:
        value = p.expr()[0]
    except (ArithmeticError, TypeError) as err:  # Mod(T, 0), a comparison sympy cannot decide
        raise ValueError(f"dim {text[:40]!r} has no value: {err}") from None
    if p.peek() is not None:
        raise ValueError(f"unexpected {p.peek()[1]!r} in dim {text!r}")
    if value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
        raise ValueError(f"dim {text!r} is not finite")
    return value
