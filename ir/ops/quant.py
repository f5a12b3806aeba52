"""MXFP4 weights in the IR: the exact decode, and the routed-expert GEMMs that read packed
experts (what an MXFP4 model's eager code calls, one node each under torch.export).

A packed weight is two u8 weights, the E2M1 codes [..., K/2] and the E8M0 scales [..., K/32]
(k3c.kernels.mxfp4 has the format). `mxfp4_decode` turns them into floats exactly; the expert
ops decompose into it and the dense expert ops, so a backend without a kernel that reads codes
runs them, and one with such a kernel lowers them whole.
"""

from __future__ import annotations

import math

from ...kernels.moe.mxfp4 import moe_down_mxfp4, moe_gate_up_mxfp4
from ...kernels.mxfp4.naive import GROUP_SIZE, decode
from ...kernels.situ.naive import activation
from .. import dims as D
from ..types import DTYPES, TensorType
from .fused import GATED, SITU_FLOPS, _experts_infer
from .moe import _down_infer, _gate_up_infer
from .spec import attr, defop, expect


def _packed_dims(packed: TensorType, scale: TensorType, what: str):
    expect(packed.dtype == "u8" and scale.dtype == "u8", "mxfp4", f"{what}: codes and scales are u8, got {packed}, "
                                                                 f"{scale}")
    expect(packed.rank == scale.rank and packed.rank >= 1, "mxfp4", f"{what}: codes {packed} and scales {scale}")
    for a, b in zip(packed.shape[:-1], scale.shape[:-1]):
        expect(D.equal(a, b), "mxfp4", f"{what}: codes {packed} and scales {scale} differ before the last dim")
    K = D.normalize(2 * packed.shape[-1])
    expect(D.equal(scale.shape[-1] * GROUP_SIZE, K), "mxfp4",
           f"{what}: {D.to_str(K)} codes need {D.to_str(K)}/{GROUP_SIZE} scales, got {scale}")
    return K


def _decode_infer(packed, scale, *, dtype):
    K = _packed_dims(packed, scale, "mxfp4_decode")
    return [TensorType(dtype, tuple(packed.shape[:-1]) + (K,))]


defop("mxfp4_decode", "packed scale", attrs={"dtype": attr("dtype", "f32", choices=("f32", "bf16", "f16"))},
      infer=_decode_infer, ref=lambda packed, scale, dtype: decode(packed, scale, DTYPES[dtype]),
      flops=lambda ins, outs, a: 2 * math.prod(outs[0]), families="quant",
      doc="w[..., k] = E2M1[code k] * 2^(scale[k // 32] - 127): MXFP4 codes and E8M0 scales, decoded exactly")


def _as_dense(packed: TensorType, scale: TensorType, dtype: str, what: str) -> TensorType:
    return TensorType(dtype, tuple(packed.shape[:-1]) + (_packed_dims(packed, scale, what),))


def _gate_up_mxfp4_infer(h, w13_packed, w13_scale, idx):
    return _gate_up_infer(h, _as_dense(w13_packed, w13_scale, h.dtype, "moe_gate_up_mxfp4"), idx)


def _gate_up_mxfp4_decompose(b, h, w13_packed, w13_scale, idx):
    w13 = b.op("mxfp4_decode", [w13_packed, w13_scale], dtype=b.type(h).dtype)
    return [b.op("moe_gate_up", [h, w13, idx])]


defop("moe_gate_up_mxfp4", "h w13_packed w13_scale idx", "gu", infer=_gate_up_mxfp4_infer, ref=moe_gate_up_mxfp4,
      eager=True, decompose=_gate_up_mxfp4_decompose, families="moe quant",
      flops=lambda ins, outs, a: 2 * math.prod(outs[0]) * ins[0][1],
      doc="moe_gate_up with the experts' w13 in MXFP4 (each routed expert decoded once)")


def _down_mxfp4_infer(a, w2_packed, w2_scale, idx, w):
    return _down_infer(a, _as_dense(w2_packed, w2_scale, "f32", "moe_down_mxfp4"), idx, w)


def _down_mxfp4_decompose(b, a, w2_packed, w2_scale, idx, w):
    w2 = b.op("mxfp4_decode", [w2_packed, w2_scale], dtype=b.type(a).dtype)
    return [b.op("moe_down", [a, w2, idx, w])]


defop("moe_down_mxfp4", "a w2_packed w2_scale idx w", "y", infer=_down_mxfp4_infer, ref=moe_down_mxfp4, eager=True,
      decompose=_down_mxfp4_decompose, families="moe quant",
      flops=lambda ins, outs, a: 2 * math.prod(ins[0]) * ins[1][1] + math.prod(outs[0]) * ins[3][1],
      doc="moe_down with the experts' w2 in MXFP4 (fp32 accumulate)")


def _experts_mxfp4_infer(h, w13_packed, w13_scale, w2_packed, w2_scale, idx, w, **attrs):
    return _experts_infer(h, _as_dense(w13_packed, w13_scale, h.dtype, "moe_experts_mxfp4"),
                          _as_dense(w2_packed, w2_scale, h.dtype, "moe_experts_mxfp4"), idx, w, **attrs)


def _experts_mxfp4_ref(h, w13_packed, w13_scale, w2_packed, w2_scale, idx, w, act, beta, linear_beta):
    gu = moe_gate_up_mxfp4(h, w13_packed, w13_scale, idx)
    I = gu.shape[-1] // 2
    return moe_down_mxfp4(activation(gu[..., :I], gu[..., I:], act, beta, linear_beta), w2_packed, w2_scale, idx, w)


def _experts_mxfp4_decompose(b, h, w13_packed, w13_scale, w2_packed, w2_scale, idx, w, **attrs):
    dt = b.type(h).dtype
    w13 = b.op("mxfp4_decode", [w13_packed, w13_scale], dtype=dt)
    w2 = b.op("mxfp4_decode", [w2_packed, w2_scale], dtype=dt)
    return [b.op("moe_experts", [h, w13, w2, idx, w], **attrs)]


def _experts_mxfp4_flops(ins, outs, a):
    (N, d), two_i, k = ins[0], ins[1][1], ins[5][1]
    I, d_out = two_i // 2, ins[3][1]
    return 2 * N * k * two_i * d + SITU_FLOPS[a["act"]] * N * k * I + 2 * N * k * I * d_out + N * k * d_out


defop("moe_experts_mxfp4", "h w13_packed w13_scale w2_packed w2_scale idx w", attrs=GATED,
      infer=_experts_mxfp4_infer, ref=_experts_mxfp4_ref, decompose=_experts_mxfp4_decompose,
      flops=_experts_mxfp4_flops, families="fused moe quant",
      doc="moe_experts on MXFP4 experts: the decode folded into the expert GEMMs (fold-mxfp4)")
