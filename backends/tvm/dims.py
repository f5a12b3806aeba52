"""Symbolic dims of the IR as TIR expressions: `B`, `T`, `P` become int64 `tirx.Var`s, and
expressions over them (`B*T`, `P + 1`, `ceiling(T/64)`) become `+`, `*`, `floordiv`, `ceildiv`.

Every Relax function gets its own variables (Relax binds them from the parameters' shapes).
"""

from __future__ import annotations

import sympy
import tvm
from tvm import tirx

from ...ir import Graph
from ...ir import dims as D


class DimError(ValueError):
    """A dim expression with no TIR counterpart."""


class DimMap:
    """The TIR variables of one graph's dims, and the conversion of dim expressions."""

    def __init__(self, graph: Graph):
        self.vars: dict[str, tirx.Var] = {name: tirx.Var(name, "int64") for name in graph.dims}

    def expr(self, d: D.Dim) -> tvm.ir.PrimExpr:
        """The TIR expression of a dim (an int or a sympy expression)."""
        if isinstance(d, int):
            return tirx.IntImm("int64", d)
        return self._convert(sympy.sympify(d))

    def shape(self, shape) -> list[tvm.ir.PrimExpr]:
        return [self.expr(d) for d in shape]

    def _convert(self, e: sympy.Expr) -> tvm.ir.PrimExpr:
        if e.is_Integer:
            return tirx.IntImm("int64", int(e))
        if e.is_Symbol:
            if e.name not in self.vars:
                raise DimError(f"dim {e.name!r} is not declared by the graph")
            return self.vars[e.name]
        if isinstance(e, sympy.Add):
            return _fold(lambda a, b: a + b, [self._convert(a) for a in e.args])
        if isinstance(e, sympy.Mul):
            num, den = sympy.fraction(e)
            if den != 1:
                return self._divide(num, den, "floor")
            return _fold(lambda a, b: a * b, [self._convert(a) for a in e.args])
        if isinstance(e, (sympy.ceiling, sympy.floor)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self._convert(num)
            return self._divide(num, den, "ceil" if isinstance(e, sympy.ceiling) else "floor")
        if isinstance(e, sympy.Max):
            return _fold(tirx.max, [self._convert(a) for a in e.args])
        if isinstance(e, sympy.Min):
            return _fold(tirx.min, [self._convert(a) for a in e.args])
        if isinstance(e, sympy.Mod):
            return tirx.floormod(self._convert(e.args[0]), self._convert(e.args[1]))
        raise DimError(f"dim expression {D.to_str(e)} has no TIR form")

    def _divide(self, num: sympy.Expr, den: sympy.Expr, rounding: str) -> tvm.ir.PrimExpr:
        if not den.is_Integer:
            raise DimError(f"dim expression {D.to_str(num / den)}: only division by a constant has a TIR form")
        n, d = self._convert(num), int(den)
        return tirx.ceildiv(n, d) if rounding == "ceil" else tirx.floordiv(n, d)


def _fold(op, items: list) -> tvm.ir.PrimExpr:
    out = items[0]
    for x in items[1:]:
        out = op(out, x)
    return out


def static_int(d: D.Dim, what: str) -> int:
    """`d` as an int, or a DimError naming `what` when it is symbolic."""
    if not isinstance(d, int):
        raise DimError(f"{what} must be static, got {D.to_str(d)}")
    return d
