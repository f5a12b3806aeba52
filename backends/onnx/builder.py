"""Emitting ONNX nodes: one `Builder` per graph being written (the model's main graph, a
function body, a Loop or Scan body).

    b = Builder("kda")
    s = b.Mul(x, b.const(0.5))                     # capitalised names are ONNX ops
    o, st = b.op("Scan", [...], 2, body=graph)     # several outputs
    n = b.dim(sympy.ceiling(T / 64))               # a symbolic dim as an int64 [1] tensor

Symbolic dims (sympy expressions over B, T, P) are computed at run time from the shapes of
the inputs: `bind(symbol)` says where a symbol comes from (`Shape(x)[axis]`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import onnx
import sympy
from onnx import AttributeProto, TensorProto
from onnx import helper as oh

OPSET = 23  # the standard opset of every artifact (Attention and RMSNormalization are 23)
IR_VERSION = 11
DOMAIN = "k3c"  # the custom domain of k3c's function-bodied ops
MS_DOMAIN = "com.microsoft"

ONNX_TYPES = {"f64": TensorProto.DOUBLE, "f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16,
              "bf16": TensorProto.BFLOAT16, "i64": TensorProto.INT64, "i32": TensorProto.INT32,
              "i8": TensorProto.INT8, "u8": TensorProto.UINT8, "bool": TensorProto.BOOL}
NUMPY_TYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "i64": np.int64,
               "i32": np.int32, "i8": np.int8, "u8": np.uint8, "bool": np.bool_}
INT64_MAX = 2**63 - 1


class LoweringError(ValueError):
    """Something in the IR that the ONNX lowering cannot express; the message says what."""


@dataclass(frozen=True)
class Ref:
    """An attribute of a function body node that takes its value from the function's attribute."""

    name: str
    kind: int = AttributeProto.FLOAT


_IDS: ContextVar[Iterator[int] | None] = ContextVar("k3c_onnx_builder_ids", default=None)
_PROCESS_IDS = itertools.count()  # builders made outside `numbering` (a lone function body)


@contextmanager
def numbering() -> Iterator[None]:
    """Number the builders made inside the block from 0: the names of one model's nodes are
    unique within it and do not depend on what was lowered before in the process."""
    token = _IDS.set(itertools.count())
    try:
        yield
    finally:
        _IDS.reset(token)


class Builder:
    """Collects ONNX nodes under fresh names. `bind(symbol) -> name` gives a dim symbol's
    int64 [1] tensor; the builder computes any expression over bound symbols from it."""

    def __init__(self, hint: str = "g", bind: Callable[[str], str] | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self.prefix = f"k3c/{hint}{next(_IDS.get() or _PROCESS_IDS)}/"
        self._count = itertools.count()
        self._consts: dict = {}
        self._dims: dict[str, str] = {}
        self._bind = bind
        self.domains: set[str] = set()

    # ---- nodes ------------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        return f"{self.prefix}{hint}{next(self._count)}"

    def op(self, op_type: str, inputs: Sequence[str | None], outputs: int | Sequence[str] = 1,
           domain: str = "", **attrs) -> str | list[str]:
        """Emit one node; `outputs` is a count (fresh names) or the names. Returns the name(s)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        ins = ["" if i is None else i for i in inputs]
        while ins and ins[-1] == "":
            ins.pop()  # trailing optional inputs left out
        node = oh.make_node(op_type, ins, names,
                            name=self.fresh(op_type), domain=domain or None,
                            **{k: v for k, v in attrs.items() if not isinstance(v, Ref) and v is not None})
        for k, v in attrs.items():
            if isinstance(v, Ref):
                a = AttributeProto()
                a.name, a.ref_attr_name, a.type = k, v.name, v.kind
                node.attribute.append(a)
        if domain:
            self.domains.add(domain)
        self.nodes.append(node)
        return names[0] if isinstance(outputs, int) and outputs == 1 else names

    def __getattr__(self, name: str):
        if name[:1].isupper():
            return lambda *inputs, outputs=1, **attrs: self.op(name, inputs, outputs, **attrs)
        raise AttributeError(name)

    # ---- constants --------------------------------------------------------------
    def const(self, value, dtype: str = "f32") -> str:
        """A Constant node holding `value` (a scalar gives a 0-d tensor), cached per builder."""
        arr = np.asarray(value, dtype=NUMPY_TYPES[dtype])
        key = (dtype, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.op("Constant", [], 1, value=onnx.numpy_helper.from_array(arr, "value"))
        return self._consts[key]

    def ints(self, values: Sequence[int]) -> str:
        """An int64 1-D constant (axes, shapes, slice bounds)."""
        return self.const(list(values), "i64")

    def param(self, v, dtype: str = "f32") -> str:
        """An attribute as a 0-d tensor: `v` is a Ref (the enclosing function's attribute), a
        number, or already a tensor name (returned as it is)."""
        if isinstance(v, str):
            return v
        if not isinstance(v, Ref):
            return self.const(v, dtype)
        key = ("ref", v.name)
        if key not in self._consts:
            attr = "value_float" if v.kind == AttributeProto.FLOAT else "value_int"
            self._consts[key] = self.op("Constant", [], 1, **{attr: v})
        return self._consts[key]

    def unsqueeze(self, x: str, *axes: int) -> str:
        return self.Unsqueeze(x, self.ints(axes))

    def squeeze(self, x: str, *axes: int) -> str:
        return self.Squeeze(x, self.ints(axes))

    # ---- shapes -----------------------------------------------------------------
    def shape_of(self, x: str, start: int, end: int | None = None) -> str:
        """int64 [n]: dims start..end of x (negative axes count from the back)."""
        end = end if end is not None else (start + 1 if start != -1 else None)
        return self.op("Shape", [x], 1, start=start, end=end)

    def dim(self, d) -> str:
        """A dim (int or sympy expression over bound symbols) as an int64 [1] tensor."""
        if isinstance(d, (int, np.integer)):
            return self.ints([int(d)])
        key = sympy.srepr(d)
        if key not in self._dims:
            self._dims[key] = self._dim_expr(d)
        return self._dims[key]

    def scalar_dim(self, d) -> str:
        """A dim as an int64 0-d tensor (for Range and Loop trip counts)."""
        if isinstance(d, (int, np.integer)):
            return self.const(int(d), "i64")
        return self.Squeeze(self.dim(d), self.ints([0]))

    def shape(self, dims: Sequence) -> str:
        """int64 [len(dims)] from static and symbolic dims (one Concat of their tensors)."""
        if all(isinstance(d, (int, np.integer)) for d in dims):
            return self.ints([int(d) for d in dims])
        key = ("shape",) + tuple(d if isinstance(d, str) else sympy.srepr(sympy.sympify(d)) for d in dims)
        if key not in self._dims:
            self._dims[key] = self._shape(dims)
        return self._dims[key]

    def _shape(self, dims: Sequence) -> str:
        parts, static = [], []
        for d in dims:
            if isinstance(d, (int, np.integer)):
                static.append(int(d))
                continue
            if static:
                parts.append(self.ints(static))
                static = []
            parts.append(d if isinstance(d, str) else self.dim(d))
        if static:
            parts.append(self.ints(static))
        return parts[0] if len(parts) == 1 else self.Concat(*parts, axis=0)

    def _dim_expr(self, d) -> str:
        if isinstance(d, sympy.Integer):
            return self.ints([int(d)])
        if isinstance(d, sympy.Symbol):
            if self._bind is None:
                raise LoweringError(f"dim {d} cannot be computed here (no input carries it)")
            return self._bind(d.name)
        if isinstance(d, sympy.Add):
            terms = list(d.as_ordered_terms())
            acc = self.dim(terms[0])
            for t in terms[1:]:
                coeff, rest = t.as_coeff_Mul()
                if coeff < 0:
                    acc = self.Sub(acc, self.dim(-t))
                else:
                    acc = self.Add(acc, self.dim(t))
            return acc
        if isinstance(d, sympy.Mul):
            coeff, rest = d.as_coeff_Mul()
            if not coeff.is_Integer:
                raise LoweringError(f"dim {d} is not an integer expression (use floor/ceiling)")
            factors = [f for f in sympy.Mul.make_args(rest)]
            acc = self.dim(factors[0])
            for f in factors[1:]:
                acc = self.Mul(acc, self.dim(f))
            return acc if coeff == 1 else self.Mul(self.ints([int(coeff)]), acc)
        if isinstance(d, sympy.Pow) and d.exp.is_Integer and d.exp > 0:
            base = self.dim(d.base)
            acc = base
            for _ in range(int(d.exp) - 1):
                acc = self.Mul(acc, base)
            return acc
        kind = type(d).__name__
        if isinstance(d, (sympy.ceiling, sympy.floor)):
            num, den = sympy.fraction(sympy.together(d.args[0]))
            if not den.is_Integer or den <= 0:
                raise LoweringError(f"dim {d}: only division by a positive constant is supported")
            n = self.dim(sympy.expand(num))
            if int(den) == 1:
                return n
            if isinstance(d, sympy.ceiling):
                n = self.Add(n, self.ints([int(den) - 1]))
            return self.Div(n, self.ints([int(den)]))
        if kind in ("FloorDiv", "CeilDiv"):
            a, b = (self.dim(x) for x in d.args)
            if kind == "CeilDiv":
                a = self.Sub(self.Add(a, b), self.ints([1]))
            return self.Div(a, b)
        if isinstance(d, (sympy.Max, sympy.Min)):
            return self.op("Max" if isinstance(d, sympy.Max) else "Min", [self.dim(a) for a in d.args])
        if isinstance(d, sympy.Mod) or kind == "Mod":
            return self.Mod(self.dim(d.args[0]), self.dim(d.args[1]))
        raise LoweringError(f"cannot compute dim {d} ({kind}) in ONNX")


def value_info(name: str, dtype: str, shape: Sequence | int | None) -> onnx.ValueInfoProto:
    """A typed value; symbolic dims become dim_params spelled as in the IR ("B", "P + 1").
    An int shape is a rank with unknown dims; None leaves the shape open."""
    if shape is None:
        return oh.make_tensor_value_info(name, ONNX_TYPES[dtype], None)
    if isinstance(shape, int):
        return oh.make_tensor_value_info(name, ONNX_TYPES[dtype], [None] * shape)
    dims = [int(d) if isinstance(d, (int, np.integer)) else sympy.sstr(d) for d in shape]
    return oh.make_tensor_value_info(name, ONNX_TYPES[dtype], dims)


def subgraph(b: Builder, name: str, inputs: Sequence[tuple], outputs: Sequence[tuple]):
    """A Loop/Scan/If body from a builder: inputs and outputs are (name, dtype, rank or shape)."""
    def vi(x):
        return value_info(x[0], x[1], x[2] if len(x) > 2 else None)
    return oh.make_graph(b.nodes, name, [vi(x) for x in inputs], [vi(x) for x in outputs])


def loop_counter(b: Builder) -> tuple[tuple, tuple]:
    """The (iteration, condition) inputs of a Loop body: int64 and bool scalars."""
    return (b.fresh("i"), "i64", []), (b.fresh("cond"), "bool", [])
