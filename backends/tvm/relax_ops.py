"""Lowerings of the standard IR ops to Relax operators (`relax.op.*`), one small rule per op,
registered in the `tvm` table of k3c.backends.tables (cell "relax" of the support matrix).

Relax legalizes these to TensorIR, fuses neighbours, and the schedule rules of schedules.py
give the fused functions their loops. A `linear` by a weight on llvm is the exception: a
hand-written panel GEMM (kernels/common/tvm/gemm.py) whose weight packing the build lifts out
into the one-time parameter transform, as it does the transposes elsewhere.

A BF16 weight that compute-dtype widened (`cast(weight_bf16 -> f32)` where read) stays BF16 in
memory when its readers take the stored bytes (`stored`, STORED_READS): its cast lowers to
nothing, the GEMM packs BF16 panels and widens in registers, the embedding widens the rows it
gathers. Elsewhere the cast is Relax's, lifted to load time like any weight-only work.
"""

from __future__ import annotations

import numpy as np
import sympy
import torch
from tvm import relax

from ...ir import dims as D
from ...kernels.common.tvm.gemm import PANEL, WIDE_PANEL, packed_linear, packed_rows
from ...kernels.mxfp4.naive import GROUP_SIZE, e2m1_table, e8m0_to_float
from ..tables import builtin
from . import stable
from .context import DTYPES, LowerContext

R = relax.op


def _unary(fn):
    return lambda ctx, node, x: fn(x)


def _binary(fn):
    return lambda ctx, node, a, b: fn(a, b)


def _const(ctx: LowerContext, node, *, value=None, dtype=None):
    a = ctx.attrs(node)
    return relax.const(a["value"] if value is None else value, DTYPES[a["dtype"] if dtype is None else dtype])


def _dtype(ctx, node) -> str:
    """The TVM dtype of the node's first input (an elementwise op computes in it)."""
    return DTYPES[ctx.type_of(next(iter(ctx.ir(node).values()))).dtype]


def _softplus(ctx, node, x):  # TVM's own softplus is log(1 + exp(x)): see stable.py
    a = ctx.attrs(node)
    return stable.softplus(x, a["beta"], a["threshold"], _dtype(ctx, node))


def _tanh(ctx, node, x):  # TVM's own tanh cancels for small |x|: see stable.py
    return stable.tanh(x, _dtype(ctx, node))


def _elu(ctx, node, x):
    alpha, dt = ctx.attrs(node)["alpha"], _dtype(ctx, node)
    zero, one = relax.const(0.0, dt), relax.const(1.0, dt)
    neg = R.multiply(relax.const(alpha, dt), R.subtract(R.exp(R.minimum(x, zero)), one))
    return R.where(R.greater(x, zero), x, neg)


def _gelu(ctx, node, x):
    return R.nn.gelu_tanh(x) if ctx.attrs(node)["approximate"] == "tanh" else R.nn.gelu(x)


def _pow(ctx, node, a, b):
    producer = ctx.producer(ctx.ir(node)["b"])
    if producer is not None and producer.op == "const" and producer.attrs.get("value") == 2.0:
        return R.multiply(a, a)
    return R.power(a, b)


def _cast(ctx, node, x):
    if stored(ctx, node.outputs[0]):
        return x  # its readers take the stored weight and widen it themselves: no float32 copy
    dtype = DTYPES[ctx.attrs(node)["dtype"]]
    if dtype == "bfloat16" and ctx.type_of(ctx.ir(node)["x"]).dtype == "f32":
        from .bf16_dot import rounded  # TVM drops a fused cast to bf16 and back: round on the bits first

        x = rounded(ctx, x, ctx.ir(node)["x"])
    return R.astype(x, dtype)


def _full(ctx, node):
    a = ctx.attrs(node)
    return R.full(relax.ShapeExpr(ctx.dims.shape(a["shape"])), relax.const(a["value"], DTYPES[a["dtype"]]),
                  DTYPES[a["dtype"]])


def _arange(ctx, node):
    a = ctx.attrs(node)
    return R.arange(ctx.dims.expr(a["start"]), ctx.dims.expr(a["end"]), 1, DTYPES[a["dtype"]])


def _reshape(ctx, node, x):
    return R.reshape(x, relax.ShapeExpr(ctx.shape(node.outputs[0])))


def _permute(ctx, node, x):
    return R.permute_dims(x, list(ctx.attrs(node)["perm"]))


def _rank(ctx, node) -> int:
    """The rank of the node's first input (the whole list's first for concat and stack)."""
    first = next(iter(ctx.ir(node).values()))
    return ctx.type_of(first[0] if isinstance(first, list) else first).rank


def _axis(ctx, node, dim: int) -> int:
    return dim % max(_rank(ctx, node), 1)


def _slice(ctx, node, x):
    a = ctx.attrs(node)
    axis = _axis(ctx, node, a["dim"])  # bounds are canonical (0 <= start <= end <= n): the verifier says so
    return R.strided_slice(x, [axis], [ctx.dims.expr(a["start"])], [ctx.dims.expr(a["end"])], [a["step"]],
                           assume_inbound=True)


def _concat(ctx, node, xs):
    return R.concat(list(xs), axis=_axis(ctx, node, ctx.attrs(node)["dim"]))


def _stack(ctx, node, xs):
    return R.stack(list(xs), axis=ctx.attrs(node)["dim"] % (_rank(ctx, node) + 1))


def _split(ctx, node, x):
    a = ctx.attrs(node)
    axis = _axis(ctx, node, a["dim"])
    cuts, acc = [], sympy.Integer(0)
    for s in a["sizes"][:-1]:
        acc = acc + sympy.sympify(s)
        cuts.append(ctx.dims.expr(D.normalize(acc)))
    parts = ctx.bb.emit(R.split(x, cuts, axis=axis))
    return [relax.TupleGetItem(parts, i) for i in range(len(a["sizes"]))]


def _expand(ctx, node, x):
    return R.broadcast_to(x, relax.ShapeExpr(ctx.shape(node.outputs[0])))


def _reduce(fn):
    def rule(ctx, node, x):
        a = ctx.attrs(node)
        rank = _rank(ctx, node)
        return fn(x, axis=sorted({d % rank for d in a["dims"]}), keepdims=a["keepdim"])

    return rule


def _linear(ctx, node, x, w, b=None):
    y = _packed_linear(ctx, node, x, w)
    if y is None:
        y = R.matmul(x, R.permute_dims(as_f32(ctx, ctx.ir(node)["w"], w), [1, 0]))
    return y if b is None else R.add(y, b)


def weight_only(ctx, value: str) -> bool:
    """A weight, or a weight widened by a cast (compute-dtype's float32 of a BF16 weight): work
    on it depends on the parameters alone, so the build lifts it (a panel packing, a
    transpose) to load time. (A BF16 model's GEMMs fell back to Relax's matmul, 3.4x slower in
    k3-small's prefill.)"""
    if value in ctx.graph.weights:
        return True
    p = ctx.producer(value)
    return p is not None and p.op == "cast" and ctx.ir(p)["x"] in ctx.graph.weights


# The inputs (by the op's spec names) at which an op's TVM lowering reads a weight in its stored
# dtype (`as_f32` or a kernel that widens in registers). A BF16 weight that only such inputs
# read is held as BF16: its cast lowers to nothing, so no float32 copy is made at load.
STORED_READS = {"linear": ("w",), "gated_mlp": ("w",), "embedding": ("weight",), "mla_attention": ("w_kv_b",)}
STORED_DTYPES = {"bf16": "bfloat16"}


def stored(ctx, value: str) -> str | None:
    """The TVM dtype in which `value`, the float32 cast of a weight, is held ("bfloat16"),
    when every reader takes it at a STORED_READS input; None when it is a float32 value."""
    p = ctx.producer(value)
    source = ctx.ir(p)["x"] if p is not None and p.op == "cast" else None
    if source not in ctx.graph.weights or value in ctx.graph.output_values:
        return None
    dtype = STORED_DTYPES.get(ctx.type_of(source).dtype)
    if dtype is None or ctx.type_of(value).dtype != "f32":
        return None
    for n in ctx.consumers(value):
        if any(v == value and name not in STORED_READS.get(n.op, ()) for name, v in ctx.ir(n).items()):
            return None
    return dtype


def as_f32(ctx, value: str, expr: relax.Expr) -> relax.Expr:
    """`expr` (the Relax value of `value`) as float32: a stored weight widened where read."""
    return expr if stored(ctx, value) is None else R.astype(expr, "float32")


def packable(ctx, node) -> bool:
    """Whether node's weight operand `w` can go through the panel-packed GEMM: a float32 weight
    (or a weight cast to float32) of static shape, a float32 activation `x`, the llvm target."""
    wname, xname = ctx.ir(node)["w"], ctx.ir(node)["x"]
    wt, xt = ctx.type_of(wname), ctx.type_of(xname)
    return (ctx.target == "llvm" and weight_only(ctx, wname) and wt.dtype == "f32" and xt.dtype == "f32"
            and all(isinstance(d, int) for d in wt.shape))


def decode_step(ctx, value: str) -> bool:
    """The value's rows (its second to last axis) are the batch of a decode step: the entry's
    fact (k3c.ir.decode_step), so the flattened rows [B, D] of a decode step's MoE layer count
    too, not only a [B, 1, D] whose token axis is the constant 1."""
    return ctx.type_of(value).rank >= 2 and D.decode_step(ctx.graph, value, axis=-2)


def panel_width(mcpu: str | None = None) -> int:
    """Columns per GEMM panel for the CPU the llvm target builds for (this machine's, or the
    `-mcpu` named): two vectors, 32 with AVX-512, else 16 (kernels/common/tvm/gemm.py)."""
    from .bf16_dot import target_has

    return WIDE_PANEL if target_has("avx512f", mcpu) else PANEL


def packed_gemm(ctx, x2, w, M, N: int, K: int, decode: bool, wdtype: str | None = None,
                x_value: str | None = None) -> relax.Expr:
    """x2 [M, K] @ w[N, K]^T -> [M, N] through kernels/common/tvm/gemm.py; the packing of w is
    weight-only, so the build lifts it to load time. `wdtype` is w's stored dtype ("bfloat16":
    the panels stay BF16 and the kernel widens them), None for float32. `x_value`, x2's IR
    value, lets a BF16 GEMM take the CPU's BF16 dot products (bf16_dot.py decides)."""
    from .bf16_dot import dot_gemm, takes_dot

    if takes_dot(ctx, x_value, wdtype):
        return dot_gemm(ctx, x2, w, M, N, K)
    c = panel_width(ctx.options.get("mcpu"))
    P = -(-N // c)
    wpad = w if P * c == N else R.nn.pad(w, [0, P * c - N, 0, 0])
    wp = ctx.bb.emit(R.permute_dims(R.reshape(wpad, [P, c, K]), [0, 2, 1]))
    rows = packed_rows(decode, c)
    key = ("packed_linear", K, N, rows, c) + ((wdtype,) if wdtype else ())
    gv = ctx.kernel(key, lambda: packed_linear(K, N, rows, c, wdtype or "float32"))
    return ctx.call_tir(gv, [x2, wp], [relax.TensorType([M, N], "float32")])[0]


def _packed_linear(ctx, node, x, w):
    """x @ W^T through packed_gemm when `packable`, else None (Relax's matmul then)."""
    if not packable(ctx, node):
        return None
    xname, wname = ctx.ir(node)["x"], ctx.ir(node)["w"]
    N, K = ctx.type_of(wname).shape
    lead = ctx.shape(xname)[:-1]
    M = lead[0]
    for d in lead[1:]:
        M = M * d
    x2 = ctx.bb.emit(R.reshape(x, [M, K]))
    y = packed_gemm(ctx, x2, w, M, N, K, decode=decode_step(ctx, xname), wdtype=stored(ctx, wname),
                    x_value=xname)
    return R.reshape(y, [*lead, N])


def _embedding(ctx, node, weight, ids):
    rows = R.take(weight, ids, axis=0, mode="clip")  # the runner rejects ids out of range first
    return rows if stored(ctx, ctx.ir(node)["weight"]) is None else R.astype(rows, "float32")  # the rows read, widened


def _filled(ctx, value: str, dtype: str, fill: float):
    """[n] of `fill` for value's last dim n: a constant when n is static (Relax's FoldConstant
    would otherwise compile and run a kernel for every such call: 1.6 s of k3-tiny's build)."""
    n = ctx.type_of(value).shape[-1]
    if isinstance(n, int) and dtype in ("float32", "float16", "float64"):  # numpy has no bfloat16
        return relax.const(np.full((n,), fill, dtype=dtype))
    return (R.ones if fill == 1 else R.zeros)(relax.ShapeExpr([ctx.dims.expr(n)]), dtype)


def _ones(ctx, value: str, dtype: str):
    return _filled(ctx, value, dtype, 1.0)


def _rms_norm(ctx, node, x, w=None):
    xname = ctx.ir(node)["x"]
    w = _ones(ctx, xname, DTYPES[ctx.type_of(xname).dtype]) if w is None else w
    return R.nn.rms_norm(x, w, axes=[-1], epsilon=ctx.attrs(node)["eps"])


def _layer_norm(ctx, node, x, w=None, b=None):
    xname = ctx.ir(node)["x"]
    t = ctx.type_of(xname)
    w = _ones(ctx, xname, DTYPES[t.dtype]) if w is None else w
    b = _filled(ctx, xname, DTYPES[t.dtype], 0.0) if b is None else b
    return R.nn.layer_norm(x, w, b, axes=[-1], epsilon=ctx.attrs(node)["eps"])


def _topk(ctx, node, x):
    a = ctx.attrs(node)
    out = ctx.bb.emit(R.topk(x, a["k"], axis=a["dim"], ret_type="both", largest=True, dtype="int64"))
    return [relax.TupleGetItem(out, 0), relax.TupleGetItem(out, 1)]


def _gather(ctx, node, x, idx):
    return R.gather_elements(x, idx, axis=_axis(ctx, node, ctx.attrs(node)["dim"]))


_RULES = {
    "neg": _unary(R.negative), "exp": _unary(R.exp), "log": _unary(R.log), "sqrt": _unary(R.sqrt),
    "rsqrt": _unary(R.rsqrt), "abs": _unary(R.abs), "sigmoid": _unary(R.sigmoid), "tanh": _tanh,
    "relu": _unary(R.nn.relu), "silu": _unary(R.nn.silu), "softplus": _softplus, "elu": _elu, "gelu": _gelu,
    "reciprocal": lambda ctx, node, x: R.divide(relax.const(1.0, _dtype(ctx, node)), x),
    "add": _binary(R.add), "sub": _binary(R.subtract), "mul": _binary(R.multiply), "div": _binary(R.divide),
    "maximum": _binary(R.maximum), "minimum": _binary(R.minimum), "pow": _pow,
    "less": _binary(R.less), "greater": _binary(R.greater), "where": lambda ctx, node, cond, a, b: R.where(cond, a, b),
    "const": lambda ctx, node: _const(ctx, node), "cast": _cast, "full": _full, "arange": _arange,
    "reshape": _reshape, "permute": _permute, "slice": _slice, "concat": _concat, "stack": _stack,
    "split": _split, "expand": _expand,
    "reduce_sum": _reduce(R.sum), "reduce_mean": _reduce(R.mean), "reduce_max": _reduce(R.max),
    "softmax": lambda ctx, node, x: R.nn.softmax(x, axis=ctx.attrs(node)["dim"]),
    "linear": _linear, "matmul": _binary(R.matmul), "embedding": _embedding,
    "rms_norm": _rms_norm, "layer_norm": _layer_norm, "topk": _topk, "gather": _gather,
}


for _op, _fn in _RULES.items():
    builtin("tvm", _op, kind="relax")(_fn)


def _mxfp4_decode(ctx, node, packed, scale):
    """The codes of a byte by bitwise ops (low nibble first), values and scales by table lookup
    (the 16 E2M1 values, the 256 E8M0 powers of two): exact, as kernels/mxfp4 defines them."""
    shape = ctx.shape(ctx.ir(node)["packed"])
    lead, half = shape[:-1], shape[-1]
    lo = R.astype(R.bitwise_and(packed, relax.const(15, "uint8")), "int32")
    hi = R.astype(R.right_shift(packed, relax.const(4, "uint8")), "int32")
    codes = R.reshape(R.stack([lo, hi], axis=len(shape)), relax.ShapeExpr([*lead, half * 2]))
    values = R.take(relax.const(e2m1_table().numpy(), "float32"), codes, axis=0, mode="clip")  # codes < 16
    table = relax.const(e8m0_to_float(torch.arange(256, dtype=torch.uint8)).numpy().astype(np.float32), "float32")
    scales = R.take(table, R.astype(scale, "int32"), axis=0, mode="clip")  # [..., K/32]; bytes < 256
    groups = R.reshape(values, relax.ShapeExpr([*lead, half * 2 // GROUP_SIZE, GROUP_SIZE]))
    w = R.reshape(R.multiply(groups, R.expand_dims(scales, [len(shape)])), relax.ShapeExpr([*lead, half * 2]))
    dt = DTYPES[ctx.attrs(node)["dtype"]]
    return w if dt == "float32" else R.astype(w, dt)


builtin("tvm", "mxfp4_decode", kind="relax")(_mxfp4_decode)
