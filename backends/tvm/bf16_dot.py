"""BF16 GEMM operands on the CPU: which GEMMs of an llvm module take the BF16 dot-product kernel
(kernels/common/tvm/gemm_bf16.py), the Relax calls that pack their operands and run it, and the
rounding of an activation to BF16 (`rounded`) that a cast to bf16 lowers to.

A GEMM takes it when all of these hold, decided once per node when the module is lowered:
the target (this host's, or `llvm -mcpu=NAME`'s) has `avx512bf16`; the weight is held as BF16
(relax_ops.stored); the activation is a float32 value cast from a BF16 one (the compute="bf16"
policy's rounding, passes/compute_dtype.py), so multiplying it as BF16 changes nothing. A
decode step's GEMMs take it too: they are bound by the weight's bytes, which are the same BF16
panels, and the build lifts a weight's packing to load time only when every entry packs it
alike (`LiftTransformParams(shared_transform=True)`): with the prefill on BF16 panels and the
decode step on float32 ones, the decode step packed each weight again on every call (k3-small,
B = 1: 23.8 ms a step against 9.5 ms now). Every other GEMM keeps the float32 panel kernel, so
a compute="f32" module, and any module built for a CPU without AVX-512 BF16, is unchanged.
"""

from __future__ import annotations

from tvm import relax

from ...kernels.common.tvm.gemm_bf16 import PANEL, ROWS, dot_linear, pack_panels, pack_rows, round_bf16
from .target import target_has


def holds_bf16(ctx, value: str) -> bool:
    """`value` is float32 cast from a BF16 activation (not a weight): its values are BF16's."""
    p = ctx.producer(value)
    source = ctx.ir(p)["x"] if p is not None and p.op == "cast" else None
    return (source is not None and ctx.type_of(value).dtype == "f32"
            and source not in ctx.graph.weights and ctx.type_of(source).dtype == "bf16")


def takes_dot(ctx, x_value: str | None, wdtype: str | None) -> bool:
    return (ctx.target == "llvm" and wdtype == "bfloat16" and x_value is not None
            and holds_bf16(ctx, x_value) and target_has("avx512bf16", ctx.options.get("mcpu")))


def dot_gemm(ctx, x2: relax.Expr, w: relax.Expr, M, N: int, K: int) -> relax.Expr:
    """x2 [M, K] float32 (BF16 values) @ w [N, K] bfloat16 ^T -> [M, N] float32 on vdpbf16ps; the
    weight's packing depends on it alone, so the build lifts it to load time."""
    P, K2 = -(-N // PANEL), (K + 1) // 2
    pw = ctx.kernel(("pack_panels_bf16", N, K, PANEL), lambda: pack_panels(N, K, PANEL, "bfloat16"))
    (wp,) = ctx.call_tir(pw, [w], [relax.TensorType([P, K2, PANEL], "uint32")])
    px = ctx.kernel(("pack_rows_bf16", K), lambda: pack_rows(K, "float32"))
    (xp,) = ctx.call_tir(px, [x2], [relax.TensorType([M, K2], "uint32")])
    gv = ctx.kernel(("dot_linear_bf16", K, N, ROWS, PANEL), lambda: dot_linear(K, N, ROWS, PANEL))
    return ctx.call_tir(gv, [xp, wp], [relax.TensorType([M, N], "float32")])[0]


def rounded(ctx, x: relax.Expr, value: str) -> relax.Expr:
    """x, the Relax value of float32 IR `value`, rounded to BF16's values (still float32), so a
    cast to bf16 and back rounds however TVM fuses the two casts (gemm_bf16.round_bf16)."""
    shape = ctx.shape(value)
    n = 1
    for d in shape:
        n = n * d
    gv = ctx.kernel(("round_bf16",), round_bf16)
    (r,) = ctx.call_tir(gv, [ctx.bb.emit(relax.op.reshape(x, relax.ShapeExpr([n])))],
                        [relax.TensorType([n], "float32")])
    return relax.op.reshape(r, relax.ShapeExpr(shape))
