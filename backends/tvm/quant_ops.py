"""TVM lowerings of the MXFP4 expert ops: TensorIR GEMMs that decode the codes in their inner
loop (kernels/moe/tvm/mxfp4.py). The codes and scales reach the kernels re-laid out in panels
by weight-only Relax ops, which the build lifts into the one-time parameter transform: the
stored bytes are unpacked to one code per byte, the E8M0 scale bytes become their powers of
two. Nothing else of the model changes: the activation between the two GEMMs is the float
kernels'. The kernels compute in float32 (a BF16 model computes there in float32: compute-dtype).
"""

from __future__ import annotations

import numpy as np
import torch
from tvm import relax

from ...kernels.moe.tvm import SCHEDULES as MOE_SCHEDULES
from ...kernels.moe.tvm import panel
from ...kernels.moe.tvm.mxfp4 import moe_down_mxfp4, moe_gate_up_mxfp4
from ...kernels.mxfp4.naive import GROUP_SIZE, e2m1_table, e8m0_to_float
from ..tables import builtin
from .context import LowerContext
from .kernel_ops import _activation, _moe_rows, _static, kernel_supports

R = relax.op


def _lut() -> relax.Constant:
    return relax.const(e2m1_table().numpy(), "float32")


def _code_panels(ctx: LowerContext, packed, E: int, n_out: int, n_in: int) -> relax.Expr:
    """packed [E, out, in/2] u8 -> one code per byte in panels [E, out/F, in, F] (low nibble = even k)."""
    F = panel(n_out)
    lo = R.bitwise_and(packed, relax.const(15, "uint8"))
    hi = R.right_shift(packed, relax.const(4, "uint8"))
    codes = R.reshape(R.stack([lo, hi], axis=3), [E, n_out, n_in])
    return ctx.bb.emit(R.permute_dims(R.reshape(codes, [E, n_out // F, F, n_in]), [0, 1, 3, 2]))


def _scale_panels(ctx: LowerContext, scale, E: int, n_out: int, n_in: int) -> relax.Expr:
    """scale [E, out, in/32] u8 (E8M0) -> 2^(byte - 127) in panels [E, out/F, in/32, F]."""
    F, groups = panel(n_out), n_in // GROUP_SIZE
    table = relax.const(e8m0_to_float(torch.arange(256, dtype=torch.uint8)).numpy().astype(np.float32), "float32")
    s = R.take(table, R.astype(scale, "int32"), axis=0, mode="clip")  # bytes < 256
    return ctx.bb.emit(R.permute_dims(R.reshape(s, [E, n_out // F, F, groups]), [0, 1, 3, 2]))


def _gate_up(ctx, h, packed, scale, idx, E: int, D_: int, I2: int, k: int, N, rows: int) -> relax.Expr:
    gv = ctx.kernel(("moe_gate_up_mxfp4", E, D_, I2, k, rows),
                    lambda: moe_gate_up_mxfp4(E, D_, I2, k, ctx.target, rows), MOE_SCHEDULES)
    args = [h, _code_panels(ctx, packed, E, I2, D_), _scale_panels(ctx, scale, E, I2, D_), _lut(), idx]
    return ctx.call_tir(gv, args, [relax.TensorType([N, k, I2], "float32")])[0]


def _down(ctx, a, packed, scale, idx, w, E: int, I: int, Dout: int, k: int, N, rows: int) -> relax.Expr:
    gv = ctx.kernel(("moe_down_mxfp4", E, I, Dout, k, rows),
                    lambda: moe_down_mxfp4(E, I, Dout, k, ctx.target, rows), MOE_SCHEDULES)
    args = [a, _code_panels(ctx, packed, E, Dout, I), _scale_panels(ctx, scale, E, Dout, I), _lut(), idx, w]
    return ctx.call_tir(gv, args, [relax.TensorType([N, Dout], "float32")])[0]


def _dims(ctx, node, packed: str) -> tuple[int, int, int]:
    """(E, out, in) of the experts stored in `packed` [E, out, in/2]."""
    E, n_out, half = _static(ctx, packed, 0, 1, 2)
    return E, n_out, 2 * half


@builtin("tvm", "moe_gate_up_mxfp4", kind="TIR", supports=kernel_supports)
def _moe_gate_up_mxfp4(ctx: LowerContext, node, h, packed, scale, idx):
    E, I2, D_ = _dims(ctx, node, node.inputs[1])
    (k,) = _static(ctx, node.inputs[3], 1)
    return _gate_up(ctx, h, packed, scale, idx, E, D_, I2, k, ctx.shape(node.inputs[0])[0],
                    _moe_rows(ctx, node.inputs[0]))


@builtin("tvm", "moe_down_mxfp4", kind="TIR", supports=kernel_supports)
def _moe_down_mxfp4(ctx: LowerContext, node, a, packed, scale, idx, w):
    E, Dout, I = _dims(ctx, node, node.inputs[1])
    (k,) = _static(ctx, node.inputs[3], 1)
    return _down(ctx, a, packed, scale, idx, w, E, I, Dout, k, ctx.shape(node.inputs[0])[0],
                 _moe_rows(ctx, node.inputs[0]))


@builtin("tvm", "moe_experts_mxfp4", kind="TIR", supports=kernel_supports)
def _moe_experts_mxfp4(ctx: LowerContext, node, h, p13, s13, p2, s2, idx, w):
    a = ctx.attrs(node)
    E, I2, D_ = _dims(ctx, node, node.inputs[1])
    _, Dout, _ = _dims(ctx, node, node.inputs[3])
    (k,) = _static(ctx, node.inputs[5], 1)
    N = ctx.shape(node.inputs[0])[0]
    rows = _moe_rows(ctx, node.inputs[0])
    gu = _gate_up(ctx, h, p13, s13, idx, E, D_, I2, k, N, rows)
    gu2 = ctx.bb.emit(R.reshape(gu, relax.ShapeExpr([N * k, I2])))
    act = _activation(ctx, gu2, N * k, I2 // 2, a["act"], a["beta"], a["linear_beta"])
    act3 = ctx.bb.emit(R.reshape(act, relax.ShapeExpr([N, k, I2 // 2])))
    return _down(ctx, act3, p2, s2, idx, w, E, I2 // 2, Dout, k, N, rows)
