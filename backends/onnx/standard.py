"""The ONNX lowerings of the standard IR ops: elementwise math, shapes, reductions, matmul,
norms, indexing. Each emits standard ONNX ops (opset 23) for one IR node and registers in
the `onnx` table of k3c.backends.tables (cell "std" of the support matrix):

    @lowers("neg")
    def _neg(lx, node, x): ...     lx: the Lowering of the graph (lower.py); the inputs
                                   arrive as keywords named by the op's spec (IR values)

Attributes holding symbolic dims (reshape shapes, slice bounds, arange ends) become int64
tensors computed at run time from the input shapes (`lx.b.shape`, `lx.b.dim`).
"""

from __future__ import annotations

import numpy as np
import onnx
import sympy
import torch

from ...ir import Graph, Node
from ...kernels.mxfp4.naive import GROUP_SIZE, e2m1_table, e8m0_to_float
from ..tables import builtin
from . import stable
from .builder import NUMPY_TYPES, ONNX_TYPES


def _no_bf16_constant(node: Node, graph: Graph) -> tuple[bool, str]:
    if any(graph.types[v].dtype == "bf16" for v in node.outputs):
        return False, "bf16 constants have no ONNX lowering here"
    return True, ""


def lowers(*ops: str, supports=None):
    return builtin("onnx", *ops, kind="std", supports=supports)


def _simple(onnx_op: str, **fixed):
    def lower(lx, node: Node, **inputs):  # one ONNX op over the inputs in the spec's order
        lx.b.op(onnx_op, [lx.x(v) for v in inputs.values()], lx.outs(node), **fixed)
    return lower


for _ir, _onnx in {"neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "abs": "Abs",
                   "reciprocal": "Reciprocal", "tanh": "Tanh", "relu": "Relu",
                   "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
                   "maximum": "Max", "minimum": "Min", "less": "Less", "greater": "Greater",
                   "where": "Where", "matmul": "MatMul"}.items():
    lowers(_ir)(_simple(_onnx))


@lowers("rsqrt")
def _rsqrt(lx, node, x):
    lx.b.Reciprocal(lx.b.Sqrt(lx.x(x)), outputs=lx.outs(node))


@lowers("sigmoid")
def _sigmoid(lx, node, x):  # onnxruntime's Sigmoid loses the relative accuracy of negative inputs
    stable.sigmoid(lx.b, lx.x(x), lx.type(x).dtype, outputs=lx.outs(node))


@lowers("silu")
def _silu(lx, node, x):
    lx.b.Mul(lx.x(x), stable.sigmoid(lx.b, lx.x(x), lx.type(x).dtype), outputs=lx.outs(node))


@lowers("softplus")
def _softplus(lx, node, x):
    """torch's softplus: x where beta x > threshold, else log(1 + exp(beta x)) / beta."""
    (y,), b, dt = lx.outs(node), lx.b, lx.type(x).dtype
    x = lx.x(x)
    a = lx.attrs(node)
    beta, threshold = a["beta"], a["threshold"]
    bx = b.Mul(x, b.const(beta, dt))
    soft = b.Div(b.Softplus(bx), b.const(beta, dt))
    b.Where(b.Greater(bx, b.const(threshold, dt)), x, soft, outputs=[y])


@lowers("elu")
def _elu(lx, node, x):
    lx.b.Elu(lx.x(x), outputs=lx.outs(node), alpha=float(lx.attrs(node)["alpha"]))


@lowers("gelu")
def _gelu(lx, node, x):
    lx.b.Gelu(lx.x(x), outputs=lx.outs(node), approximate=lx.attrs(node)["approximate"])


@lowers("const", supports=_no_bf16_constant)
def _const(lx, node):
    (y,) = lx.outs(node)
    dt = node.attrs["dtype"]
    lx.b.Identity(lx.b.const(node.attrs["value"], dt), outputs=[y])


@lowers("cast")
def _cast(lx, node, x):
    lx.b.Cast(lx.x(x), outputs=lx.outs(node), to=ONNX_TYPES[node.attrs["dtype"]])


@lowers("full", supports=_no_bf16_constant)
def _full(lx, node):
    (y,) = lx.outs(node)
    dt = node.attrs["dtype"]
    value = onnx.numpy_helper.from_array(np.array([node.attrs["value"]], dtype=NUMPY_TYPES[dt]), "value")
    lx.b.ConstantOfShape(lx.b.shape(node.attrs["shape"]), outputs=[y], value=value)


@lowers("arange")
def _arange(lx, node):
    (y,) = lx.outs(node)
    b, a = lx.b, lx.attrs(node)
    dt = a["dtype"]
    start, end = b.scalar_dim(a["start"]), b.scalar_dim(a["end"])
    r = b.Range(start, end, b.const(1, "i64"))
    b.Cast(r, outputs=[y], to=ONNX_TYPES[dt]) if dt != "i64" else b.Identity(r, outputs=[y])


@lowers("reshape")
def _reshape(lx, node, x):
    lx.b.Reshape(lx.x(x), lx.b.shape(node.attrs["shape"]), outputs=lx.outs(node), allowzero=1)


@lowers("permute")
def _permute(lx, node, x):
    lx.b.Transpose(lx.x(x), outputs=lx.outs(node), perm=list(node.attrs["perm"]))


@lowers("slice")
def _slice(lx, node, x):
    b, a = lx.b, lx.attrs(node)
    b.Slice(lx.x(x), b.dim(a["start"]), b.dim(a["end"]), b.ints([a["dim"]]), b.ints([a["step"]]),
            outputs=lx.outs(node))


@lowers("concat")
def _concat(lx, node, xs):
    lx.b.op("Concat", [lx.x(v) for v in xs], lx.outs(node), axis=node.attrs["dim"])


@lowers("stack")
def _stack(lx, node, xs):
    dim = lx.attrs(node)["dim"]
    rank = lx.type(xs[0]).rank
    axis = dim % (rank + 1)
    lx.b.op("Concat", [lx.b.unsqueeze(lx.x(x), axis) for x in xs], lx.outs(node), axis=axis)


@lowers("split")
def _split(lx, node, x):
    lx.b.op("Split", [lx.x(x), lx.b.shape(node.attrs["sizes"])], lx.outs(node), axis=node.attrs["dim"])


@lowers("expand")
def _expand(lx, node, x):
    lx.b.Expand(lx.x(x), lx.b.shape(node.attrs["shape"]), outputs=lx.outs(node))


def _reduce(onnx_op: str):
    def lower(lx, node, x):
        a = lx.attrs(node)
        lx.b.op(onnx_op, [lx.x(x), lx.b.ints(a["dims"])], lx.outs(node), keepdims=int(a["keepdim"]))
    return lower


lowers("reduce_sum")(_reduce("ReduceSum"))
lowers("reduce_mean")(_reduce("ReduceMean"))
lowers("reduce_max")(_reduce("ReduceMax"))


@lowers("softmax")
def _softmax(lx, node, x):
    lx.b.Softmax(lx.x(x), outputs=lx.outs(node), axis=node.attrs["dim"])


@lowers("linear")
def _linear(lx, node, x, w, b):
    """x W^T (+ b): a weight W [out, in] is stored transposed, so this is one MatMul."""
    x, wt = lx.x(x), lx.transposed(w)
    if b is not None:
        lx.b.Add(lx.b.MatMul(x, wt), lx.x(b), outputs=lx.outs(node))
    else:
        lx.b.MatMul(x, wt, outputs=lx.outs(node))


@lowers("embedding")
def _embedding(lx, node, weight, ids):
    lx.b.Gather(lx.x(weight), lx.x(ids), outputs=lx.outs(node), axis=0)


@lowers("rms_norm")
def rms_norm_portable(lx, node, x, w):
    """x / sqrt(mean(x^2) + eps) * w in standard arithmetic (as torch's rms_norm)."""
    (y,), b, dt = lx.outs(node), lx.b, lx.type(x).dtype
    x = lx.x(x)
    ms = b.ReduceMean(b.Mul(x, x), b.ints([-1]), keepdims=1)
    normed = b.Mul(x, b.Reciprocal(b.Sqrt(b.Add(ms, b.const(node.attrs["eps"], dt)))))
    b.Mul(normed, lx.x(w), outputs=[y]) if w is not None else b.Identity(normed, outputs=[y])



def ones_like_last(lx, value: str) -> str:
    """A [d] tensor of ones for the last dim of `value` (a norm without a weight)."""
    t = lx.type(value)
    d = t.shape[-1]
    if isinstance(d, sympy.Basic):
        return lx.b.Expand(lx.b.const(1.0, t.dtype), lx.b.dim(d))
    return lx.b.const(np.ones(d), t.dtype)


@lowers("layer_norm")
def _layer_norm(lx, node, x, w, b):
    ins = [lx.x(v) for v in (x, w, b) if v is not None]
    scale = ins[1] if w is not None else ones_like_last(lx, x)
    bias = ins[-1:] if b is not None else []
    lx.b.op("LayerNormalization", [ins[0], scale] + bias, lx.outs(node), axis=-1, epsilon=float(node.attrs["eps"]))


@lowers("topk")
def _topk(lx, node, x):
    a = lx.attrs(node)
    lx.b.op("TopK", [lx.x(x), lx.b.ints([a["k"]])], lx.outs(node), axis=a["dim"], largest=1, sorted=1)


@lowers("gather")
def _gather(lx, node, x, idx):
    lx.b.GatherElements(lx.x(x), lx.x(idx), outputs=lx.outs(node), axis=node.attrs["dim"])


@lowers("mxfp4_decode")
def _mxfp4_decode(lx, node, packed, scale):
    """MXFP4 in standard ops: the two codes of a byte by BitwiseAnd / BitShift (low nibble
    first), their values from the 16-entry E2M1 table, each group's scale from the 256-entry
    E8M0 table (exact powers of two, 255 NaN), both by Gather. onnxruntime's DequantizeLinear
    has no float4e2m1 kernel on the CPU, and these ops compute the same values exactly."""
    (y,), packed, scale = lx.outs(node), lx.x(packed), lx.x(scale)
    b, dt = lx.b, lx.attrs(node)["dtype"]
    lo = b.BitwiseAnd(packed, b.const(0x0F, "u8"))
    hi = b.op("BitShift", [packed, b.const(4, "u8")], 1, direction="RIGHT")
    codes = b.Concat(b.unsqueeze(lo, -1), b.unsqueeze(hi, -1), axis=-1)  # [..., K/2, 2]
    values = b.Gather(b.const(e2m1_table().numpy(), "f32"), b.Cast(codes, to=ONNX_TYPES["i64"]), axis=0)
    scales = b.Gather(b.const(e8m0_to_float(torch.arange(256, dtype=torch.uint8)).numpy(), "f32"),
                      b.Cast(scale, to=ONNX_TYPES["i64"]), axis=0)  # [..., K/32]
    lead = b.Shape(packed, end=-1)
    groups = b.Reshape(values, b.Concat(lead, b.ints([-1, GROUP_SIZE]), axis=0))  # [..., K/32, 32]
    w = b.Reshape(b.Mul(groups, b.unsqueeze(scales, -1)), b.Concat(lead, b.ints([-1]), axis=0))
    b.Cast(w, outputs=[y], to=ONNX_TYPES[dt]) if dt != "f32" else b.Identity(w, outputs=[y])
