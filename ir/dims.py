"""Symbolic dimensions: a dim is an int or a sympy expression over named symbols (B, T, P).

torch.export's symbols (s0, s1, ...) are renamed to the names the user gave the dynamic
dims, so that the IR reads `f32[B, T, 256]` and `P + 1`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

import sympy

Dim = int | sympy.Expr


def sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def normalize(d) -> Dim:
    """An int for a constant, else a canonical sympy expression."""
    if isinstance(d, bool):
        raise TypeError("a dim cannot be a bool")
    if isinstance(d, int):
        return d
    if isinstance(d, sympy.Basic):
        d = sympy.expand(d)
        return int(d) if d.is_Integer else d
    raise TypeError(f"not a dim: {d!r}")


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


_ASSUMED: ContextVar[list | None] = ContextVar("assumed_equal_dims", default=None)


def equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:  # the same expression (dims are kept normalized): no simplification needed
        return True
    diff = _difference(a, b)
    if diff == 0:
        return True
    assumed = _ASSUMED.get()
    if assumed is not None and diff.free_symbols:  # undecided: equal, and the caller will check it
        assumed.append((a, b))
        return True
    return False


@lru_cache(maxsize=4096)
def _difference(a: Dim, b: Dim):
    """a - b simplified (verify asks the same pairs again after every pass)."""
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b))


@contextmanager
def assuming_equal() -> Iterator[list]:
    """Inside the block, dims that may be equal are taken as equal and the pairs collected.
    torch.export's fake tensors need it: sizes that the dynamic-shape spec makes equal are
    distinct symbols while tracing, so the fake asserts each pair back to torch."""
    pairs: list = []
    token = _ASSUMED.set(pairs)
    try:
        yield pairs
    finally:
        _ASSUMED.reset(token)


def to_str(d: Dim) -> str:
    return str(d) if isinstance(d, int) else _sstr(d)


@lru_cache(maxsize=4096)
def _sstr(d: sympy.Expr) -> str:  # the shape checks' messages print the same few dims again and again
    return sympy.sstr(d)


def parse(text: str, symbols: Mapping[str, sympy.Symbol]) -> Dim:
    """A dim from its text (an int, or an expression of the declared dims), with bounded work."""
    from .dim_parser import parse_dim

    text = text.strip()
    if text.lstrip("-").isdigit() and len(text) <= 19:
        return int(text)
    return normalize(parse_dim(text, symbols))


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The value of `d` once the symbols are bound (a KeyError names an unbound one).

    A runner checks every dim of every input on every call (a decode step of k3-small: about
    180), so the answer is memoized per expression and the values of its symbols: sympy's
    substitution took about 60 us a dim, more than the step's kernels on small models."""
    if isinstance(d, int):
        return d
    names = _symbol_names(d)
    missing = [n for n in names if n not in env]
    if missing:
        raise KeyError(f"dim {to_str(d)} needs unbound symbol(s) {missing}")
    return _value(d, tuple((n, int(env[n])) for n in names))


@lru_cache(maxsize=4096)
def _symbol_names(d: sympy.Expr) -> tuple[str, ...]:
    return tuple(sorted(s.name for s in d.free_symbols))


@lru_cache(maxsize=65536)
def _value(d: sympy.Expr, bound: tuple[tuple[str, int], ...]) -> int:
    return int(d.subs({sympy.Symbol(n, integer=True, positive=True): v for n, v in bound}))


def symbols_of(d: Dim) -> set[str]:
    return set() if isinstance(d, int) else {s.name for s in d.free_symbols}


def decode_step(graph, value: str | None = None, axis: int = 1) -> bool:
    """Whether `graph` is a decode step (one new token per sequence), or, given `value`, whether
    that value's rows are a decode step's.

    The fact is the entry recorded at capture: `graph.meta["entry"] == "decode"` (a mesh's
    segment keeps it as "segment_of"). Apart from it, a value whose token `axis` (its rows:
    1 for [B, T, ...], 0 for the flattened [N, ...]) is the constant 1 is one token per sequence
    whatever its entry: a graph written as IR text, or a static capture of one token.
    The one test every pass and backend asks (chunk or not, absorb MLA or not, GEMM and expert
    row tiles, onnxruntime's expert forms)."""
    if graph.meta.get("segment_of", graph.meta.get("entry")) == "decode":
        return True
    return value is not None and graph.types[value].shape[axis] == 1
