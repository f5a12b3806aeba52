"""TVM lowerings of the MXFP4 expert ops: the routed-expert TensorIR kernels with
weights="mxfp4" (kernels/moe/tvm), which decode the codes in registers. The stored bytes
reach the kernels re-laid out in panels by weight-only Relax ops (reshapes, permutes, one
concat), which the build lifts into the one-time parameter transform: the codes stay two a
byte and the scales stay E8M0 bytes, so the experts hold in memory what they hold on disk.
Nothing else of the model changes: the activation between the two GEMMs is the float
kernels'. The kernels compute in float32 (a BF16 model computes there in float32: compute-dtype).
"""

from __future__ import annotations

from tvm import relax

from ...kernels.moe.tvm import SCHEDULES as MOE_SCHEDULES
from ...kernels.moe.tvm import moe_down, moe_gate_up, panel
from ...kernels.mxfp4.naive import GROUP_SIZE
from .context import LowerContext
from .kernel_ops import _activation, _moe_rows, _static, tir

R = relax.op


def _panels(ctx: LowerContext, packed, scale, E: int, n_out: int, n_in: int) -> relax.Expr:
    """packed [E, out, in/2] u8 and scale [E, out, in/32] u8 -> [E, out/F, in/32, 17, F] u8: per
    group of 32 inputs, its 16 bytes of codes then its scale byte (kernels/moe/tvm/mxfp4.py)."""
    F, groups, half = panel(n_out), n_in // GROUP_SIZE, GROUP_SIZE // 2
    codes = R.permute_dims(R.reshape(packed, [E, n_out // F, F, groups, half]), [0, 1, 3, 4, 2])
    scales = R.permute_dims(R.reshape(scale, [E, n_out // F, F, groups, 1]), [0, 1, 3, 4, 2])
    return ctx.bb.emit(R.concat([codes, scales], axis=3))


def _by_table(ctx: LowerContext) -> str | None:
    """How the kernels decode MXFP4 on an llvm target (kernels/moe/tvm/mxfp4.py): by a 16-entry
    table with AVX-512, by an 8-entry one with AVX2, else by arithmetic (None)."""
    from .target import target_has

    if ctx.target != "llvm":
        return None
    mcpu = ctx.options.get("mcpu")
    return "avx512" if target_has("avx512f", mcpu) else "avx2" if target_has("avx2", mcpu) else None


def _gate_up(ctx, h, packed, scale, idx, E: int, D_: int, I2: int, k: int, N, rows: int) -> relax.Expr:
    lut = _by_table(ctx)
    gv = ctx.kernel(("moe_gate_up_mxfp4", E, D_, I2, k, rows, lut),
                    lambda: moe_gate_up(E, D_, I2, k, ctx.target, rows, weights="mxfp4", lut=lut), MOE_SCHEDULES)
    args = [h, _panels(ctx, packed, scale, E, I2, D_), idx]
    return ctx.call_tir(gv, args, [relax.TensorType([N, k, I2], "float32")])[0]


def _down(ctx, a, packed, scale, idx, w, E: int, I: int, Dout: int, k: int, N, rows: int) -> relax.Expr:
    lut = _by_table(ctx)
    gv = ctx.kernel(("moe_down_mxfp4", E, I, Dout, k, rows, lut),
                    lambda: moe_down(E, I, Dout, k, ctx.target, rows, weights="mxfp4", lut=lut), MOE_SCHEDULES)
    args = [a, _panels(ctx, packed, scale, E, Dout, I), idx, w]
    return ctx.call_tir(gv, args, [relax.TensorType([N, Dout], "float32")])[0]


def _dims(ctx, packed: str) -> tuple[int, int, int]:
    """(E, out, in) of the experts stored in `packed` [E, out, in/2]."""
    E, n_out, half = _static(ctx, packed, 0, 1, 2)
    return E, n_out, 2 * half


@tir("moe_gate_up_mxfp4")
def _moe_gate_up_mxfp4(ctx: LowerContext, node, h, w13_packed, w13_scale, idx):
    ir = ctx.ir(node)
    E, I2, D_ = _dims(ctx, ir["w13_packed"])
    (k,) = _static(ctx, ir["idx"], 1)
    return _gate_up(ctx, h, w13_packed, w13_scale, idx, E, D_, I2, k, ctx.shape(ir["h"])[0], _moe_rows(ctx, ir["h"]))


@tir("moe_down_mxfp4")
def _moe_down_mxfp4(ctx: LowerContext, node, a, w2_packed, w2_scale, idx, w):
    ir = ctx.ir(node)
    E, Dout, I = _dims(ctx, ir["w2_packed"])
    (k,) = _static(ctx, ir["idx"], 1)
    return _down(ctx, a, w2_packed, w2_scale, idx, w, E, I, Dout, k, ctx.shape(ir["a"])[0], _moe_rows(ctx, ir["a"]))


@tir("moe_experts_mxfp4")
def _moe_experts_mxfp4(ctx: LowerContext, node, h, w13_packed, w13_scale, w2_packed, w2_scale, idx, w):
    a, ir = ctx.attrs(node), ctx.ir(node)
    E, I2, D_ = _dims(ctx, ir["w13_packed"])
    _, Dout, _ = _dims(ctx, ir["w2_packed"])
    (k,) = _static(ctx, ir["idx"], 1)
    N = ctx.shape(ir["h"])[0]
    rows = _moe_rows(ctx, ir["h"])
    gu = _gate_up(ctx, h, w13_packed, w13_scale, idx, E, D_, I2, k, N, rows)
    gu2 = ctx.bb.emit(R.reshape(gu, relax.ShapeExpr([N * k, I2])))
    act = _activation(ctx, gu2, N * k, I2 // 2, a["act"], a["beta"], a["linear_beta"])
    act3 = ctx.bb.emit(R.reshape(act, relax.ShapeExpr([N, k, I2 // 2])))
    return _down(ctx, act3, w2_packed, w2_scale, idx, w, E, I2 // 2, Dout, k, N, rows)
