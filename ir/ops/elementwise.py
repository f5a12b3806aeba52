"""Elementwise ops: unary math, broadcasting binary ops, constants, casts, fills."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import dims as D
from ..types import DTYPES, TensorType
from .spec import attr, defop, expect


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or D.equal(x, y):
            out.append(x)
        else:
            expect(False, "broadcast", f"shapes {list(a)} and {list(b)} do not broadcast (dim {x} vs {y})")
    return tuple(reversed(out))


def _same(x: TensorType, **_) -> list[TensorType]:
    return [x]


def _per_element(n: int):
    return lambda ins, outs, a: n * sum(math.prod(s) for s in outs)


def _unary(name: str, fn, attrs: dict | None = None, families: str = "", flops: int = 1) -> None:
    defop(name, "x", attrs=attrs, infer=_same, ref=fn, families="elementwise unary " + families,
          flops=_per_element(flops), doc=f"y = {name}(x), elementwise")


_unary("neg", lambda x: -x)
_unary("exp", torch.exp)
_unary("log", torch.log)
_unary("sqrt", torch.sqrt)
_unary("rsqrt", torch.rsqrt)
_unary("abs", torch.abs)
_unary("reciprocal", torch.reciprocal)
_unary("sigmoid", torch.sigmoid)
_unary("tanh", torch.tanh)
_unary("relu", torch.relu)
_unary("silu", F.silu, flops=2)
_unary("softplus", lambda x, beta, threshold: F.softplus(x, beta, threshold),
       {"beta": attr("float", 1.0, lo=0, lo_open=True), "threshold": attr("float", 20.0)}, flops=2)
_unary("elu", lambda x, alpha: F.elu(x, alpha), {"alpha": attr("float", 1.0)}, flops=2)
_unary("gelu", lambda x, approximate: F.gelu(x, approximate=approximate),
       {"approximate": attr("str", "none", choices=("none", "tanh"))}, flops=4)


def _binary_infer(a: TensorType, b: TensorType) -> list[TensorType]:
    expect(a.dtype == b.dtype, "dtype", f"operands have dtypes {a.dtype} and {b.dtype}; insert a cast")
    return [TensorType(a.dtype, broadcast_shapes(a.shape, b.shape))]


def _binary(name: str, fn, commutative: bool) -> None:
    defop(name, "a b", infer=_binary_infer, ref=fn, flops=_per_element(1),
          families="elementwise binary" + (" commutative" if commutative else ""),
          doc=f"y = {name}(a, b) with broadcasting; operands of one dtype")


_binary("add", torch.add, True)
_binary("sub", torch.sub, False)
_binary("mul", torch.mul, True)
_binary("div", torch.div, False)
_binary("pow", lambda a, b: torch.pow(a, b.item() if b.dim() == 0 else b), False)
_binary("maximum", torch.maximum, True)
_binary("minimum", torch.minimum, True)


def _compare_infer(a: TensorType, b: TensorType) -> list[TensorType]:
    return [TensorType("bool", _binary_infer(a, b)[0].shape)]


defop("less", "a b", infer=_compare_infer, ref=torch.lt, flops=_per_element(1), families="elementwise binary",
      doc="y = a < b (bool)")
defop("greater", "a b", infer=_compare_infer, ref=torch.gt, flops=_per_element(1), families="elementwise binary",
      doc="y = a > b (bool)")


def _where_infer(c: TensorType, a: TensorType, b: TensorType) -> list[TensorType]:
    expect(c.dtype == "bool", "dtype", f"where's condition must be bool, got {c.dtype}")
    t = _binary_infer(a, b)[0]
    return [t.with_shape(broadcast_shapes(c.shape, t.shape))]


defop("where", "cond a b", infer=_where_infer, ref=torch.where, flops=_per_element(1), families="elementwise",
      doc="y = cond ? a : b, broadcasting")


def _const_infer(*, value, dtype) -> list[TensorType]:
    return [TensorType(dtype, ())]


def _const_ref(*, value, dtype):
    return torch.tensor(value, dtype=DTYPES[dtype])


NONE = lambda ins, outs, a: 0  # noqa: E731  (no arithmetic)

defop("const", "", attrs={"value": attr("number"), "dtype": attr("dtype")}, infer=_const_infer,
      ref=_const_ref, flops=NONE, families="constant", doc="a 0-d tensor holding `value`")


def _cast_infer(x: TensorType, *, dtype) -> list[TensorType]:
    return [x.with_dtype(dtype)]


defop("cast", "x", attrs={"dtype": attr("dtype")}, infer=_cast_infer,
      ref=lambda x, dtype: x.to(DTYPES[dtype]), flops=NONE, families="elementwise unary",
      doc="y = x converted to `dtype`")


def _full_infer(*, shape, value, dtype) -> list[TensorType]:
    return [TensorType(dtype, tuple(shape))]


defop("full", "", attrs={"shape": attr("shape"), "value": attr("number"), "dtype": attr("dtype")},
      infer=_full_infer, flops=NONE,
      ref=lambda shape, value, dtype: torch.full(tuple(shape), value, dtype=DTYPES[dtype]),
      families="constant", doc="a tensor of `shape` filled with `value`")


def _arange_infer(*, start, end, dtype) -> list[TensorType]:
    return [TensorType(dtype, (D.normalize(end - start),))]


defop("arange", "", attrs={"start": attr("dim", 0), "end": attr("dim"), "dtype": attr("dtype", "i64")},
      infer=_arange_infer, flops=NONE,
      ref=lambda start, end, dtype: torch.arange(start, end, dtype=DTYPES[dtype]),
      families="constant", doc="[start, start + 1, ..., end - 1]; start and end may be symbolic")
