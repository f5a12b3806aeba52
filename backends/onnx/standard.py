"""The lowering table of the standard IR ops: elementwise math, shapes, reductions, matmul,
norms, indexing. Each entry emits standard ONNX ops (opset 23) for one IR node.

    STANDARD["linear"](lx, node)      lx: the Lowering of the graph (lower.py)

Attributes holding symbolic dims (reshape shapes, slice bounds, arange ends) become int64
tensors computed at run time from the input shapes (`lx.b.shape`, `lx.b.dim`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import sympy

from ...ir import Node
from . import stable
from .builder import INT64_MAX, NUMPY_TYPES, ONNX_TYPES

STANDARD: dict[str, Callable] = {}


def lowers(*ops: str):
    def register(fn):
        for op in ops:
            STANDARD[op] = fn
        return fn
    return register


def _io(lx, node: Node):
    return [lx.x(i) for i in node.inputs], [lx.out(node, i) for i in range(len(node.outputs))]


def _simple(onnx_op: str, **fixed):
    def lower(lx, node: Node):
        ins, outs = _io(lx, node)
        lx.b.op(onnx_op, ins, outs, **fixed)
    return lower


for _ir, _onnx in {"neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "abs": "Abs",
                   "reciprocal": "Reciprocal", "tanh": "Tanh", "relu": "Relu",
                   "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
                   "maximum": "Max", "minimum": "Min", "less": "Less", "greater": "Greater",
                   "where": "Where", "matmul": "MatMul"}.items():
    STANDARD[_ir] = _simple(_onnx)


@lowers("rsqrt")
def _rsqrt(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Reciprocal(lx.b.Sqrt(x), outputs=[y])


@lowers("sigmoid")
def _sigmoid(lx, node):  # onnxruntime's Sigmoid loses the relative accuracy of negative inputs
    (x,), (y,) = _io(lx, node)
    stable.sigmoid(lx.b, x, lx.type(node.inputs[0]).dtype, outputs=[y])


@lowers("silu")
def _silu(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Mul(x, stable.sigmoid(lx.b, x, lx.type(node.inputs[0]).dtype), outputs=[y])


@lowers("softplus")
def _softplus(lx, node):
    """torch's softplus: x where beta x > threshold, else log(1 + exp(beta x)) / beta."""
    (x,), (y,) = _io(lx, node)
    b, dt = lx.b, lx.type(node.inputs[0]).dtype
    beta, threshold = node.attrs.get("beta", 1.0), node.attrs.get("threshold", 20.0)
    bx = b.Mul(x, b.const(beta, dt))
    soft = b.Div(b.Softplus(bx), b.const(beta, dt))
    b.Where(b.Greater(bx, b.const(threshold, dt)), x, soft, outputs=[y])


@lowers("elu")
def _elu(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Elu(x, outputs=[y], alpha=float(node.attrs.get("alpha", 1.0)))


@lowers("gelu")
def _gelu(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Gelu(x, outputs=[y], approximate=node.attrs.get("approximate", "none"))


@lowers("const")
def _const(lx, node):
    _, (y,) = _io(lx, node)
    dt = node.attrs["dtype"]
    lx.b.Identity(lx.b.const(node.attrs["value"], dt), outputs=[y])


@lowers("cast")
def _cast(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Cast(x, outputs=[y], to=ONNX_TYPES[node.attrs["dtype"]])


@lowers("full")
def _full(lx, node):
    _, (y,) = _io(lx, node)
    dt = node.attrs["dtype"]
    value = onnx.numpy_helper.from_array(np.array([node.attrs["value"]], dtype=NUMPY_TYPES[dt]), "value")
    lx.b.ConstantOfShape(lx.b.shape(node.attrs["shape"]), outputs=[y], value=value)


@lowers("arange")
def _arange(lx, node):
    _, (y,) = _io(lx, node)
    b, dt = lx.b, node.attrs.get("dtype", "i64")
    start, end = b.scalar_dim(node.attrs.get("start", 0)), b.scalar_dim(node.attrs["end"])
    r = b.Range(start, end, b.const(1, "i64"))
    b.Cast(r, outputs=[y], to=ONNX_TYPES[dt]) if dt != "i64" else b.Identity(r, outputs=[y])


@lowers("reshape")
def _reshape(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Reshape(x, lx.b.shape(node.attrs["shape"]), outputs=[y], allowzero=1)


@lowers("permute")
def _permute(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Transpose(x, outputs=[y], perm=list(node.attrs["perm"]))


def _bound(b, v) -> str:
    if isinstance(v, int) and v >= 2**62:
        return b.ints([INT64_MAX])
    return b.dim(v)


@lowers("slice")
def _slice(lx, node):
    (x,), (y,) = _io(lx, node)
    b, a = lx.b, node.attrs
    b.Slice(x, _bound(b, a.get("start", 0)), _bound(b, a["end"]), b.ints([a["dim"]]), b.ints([a.get("step", 1)]),
            outputs=[y])


@lowers("concat")
def _concat(lx, node):
    ins, (y,) = _io(lx, node)
    lx.b.op("Concat", ins, [y], axis=node.attrs["dim"])


@lowers("stack")
def _stack(lx, node):
    ins, (y,) = _io(lx, node)
    dim = node.attrs.get("dim", 0)
    rank = lx.type(node.inputs[0]).rank
    axis = dim % (rank + 1)
    lx.b.op("Concat", [lx.b.unsqueeze(x, axis) for x in ins], [y], axis=axis)


@lowers("split")
def _split(lx, node):
    (x,), outs = _io(lx, node)
    lx.b.op("Split", [x, lx.b.shape(node.attrs["sizes"])], outs, axis=node.attrs["dim"])


@lowers("expand")
def _expand(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Expand(x, lx.b.shape(node.attrs["shape"]), outputs=[y])


def _reduce(onnx_op: str):
    def lower(lx, node):
        (x,), (y,) = _io(lx, node)
        lx.b.op(onnx_op, [x, lx.b.ints(node.attrs["dims"])], [y], keepdims=int(bool(node.attrs.get("keepdim"))))
    return lower


STANDARD["reduce_sum"] = _reduce("ReduceSum")
STANDARD["reduce_mean"] = _reduce("ReduceMean")
STANDARD["reduce_max"] = _reduce("ReduceMax")


@lowers("softmax")
def _softmax(lx, node):
    (x,), (y,) = _io(lx, node)
    lx.b.Softmax(x, outputs=[y], axis=node.attrs["dim"])


@lowers("linear")
def _linear(lx, node):
    """x W^T (+ b): a weight W [out, in] is stored transposed, so this is one MatMul."""
    x, y = lx.x(node.inputs[0]), lx.out(node, 0)
    wt = lx.transposed(node.inputs[1])
    if len(node.inputs) == 3:
        lx.b.Add(lx.b.MatMul(x, wt), lx.x(node.inputs[2]), outputs=[y])
    else:
        lx.b.MatMul(x, wt, outputs=[y])


@lowers("embedding")
def _embedding(lx, node):
    (w, ids), (y,) = _io(lx, node)
    lx.b.Gather(w, ids, outputs=[y], axis=0)


def rms_norm_portable(lx, node):
    """x / sqrt(mean(x^2) + eps) * w in standard arithmetic (as torch's rms_norm)."""
    ins, (y,) = _io(lx, node)
    b, dt = lx.b, lx.type(node.inputs[0]).dtype
    x = ins[0]
    ms = b.ReduceMean(b.Mul(x, x), b.ints([-1]), keepdims=1)
    normed = b.Mul(x, b.Reciprocal(b.Sqrt(b.Add(ms, b.const(node.attrs["eps"], dt)))))
    b.Mul(normed, ins[1], outputs=[y]) if len(ins) > 1 else b.Identity(normed, outputs=[y])


STANDARD["rms_norm"] = rms_norm_portable


def ones_like_last(lx, value: str) -> str:
    """A [d] tensor of ones for the last dim of `value` (a norm without a weight)."""
    t = lx.type(value)
    d = t.shape[-1]
    if isinstance(d, sympy.Basic):
        return lx.b.Expand(lx.b.const(1.0, t.dtype), lx.b.dim(d))
    return lx.b.const(np.ones(d), t.dtype)


@lowers("layer_norm")
def _layer_norm(lx, node):
    ins, (y,) = _io(lx, node)
    scale = ins[1] if len(ins) > 1 else ones_like_last(lx, node.inputs[0])
    lx.b.op("LayerNormalization", [ins[0], scale] + ins[2:], [y], axis=-1, epsilon=float(node.attrs["eps"]))


@lowers("topk")
def _topk(lx, node):
    (x,), outs = _io(lx, node)
    lx.b.op("TopK", [x, lx.b.ints([node.attrs["k"]])], outs, axis=node.attrs.get("dim", -1), largest=1, sorted=1)


@lowers("gather")
def _gather(lx, node):
    (x, idx), (y,) = _io(lx, node)
    lx.b.GatherElements(x, idx, outputs=[y], axis=node.attrs["dim"])
