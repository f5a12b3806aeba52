"""Fused ops the passes create: SiTU, the gated MLP with its activation epilogue, the whole
routed-expert computation, and MLA in its absorbed (decode) form."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...kernels.mla.naive import mla_attention_absorbed
from ...kernels.moe.naive import moe_down, moe_gate_up
from ...kernels.situ.naive import ACTIVATIONS as ACTS
from ...kernels.situ.naive import BETA, LINEAR_BETA, activation, situ
from .. import dims as D
from ..types import TensorType
from .recurrent import _fmt, _same_dims
from .spec import attr, defop, expect

# SiTU's parameters, with the kernel's defaults (a node that omits linear_beta keeps the clamp)
SITU = {"beta": attr("float", BETA, lo=0, lo_open=True),
        "linear_beta": attr("float", LINEAR_BETA, optional=True, lo=0, lo_open=True)}
GATED = {"act": attr("str", choices=ACTS), **SITU}
SITU_FLOPS = {"situ": 9, "silu": 3}  # per output element


def _situ_infer(gate: TensorType, up: TensorType, *, beta, linear_beta) -> list[TensorType]:
    expect(gate.same_as(up), "situ-shape", f"SiTU gate {gate} and up {up} must match")
    return [gate]


defop("situ", "gate up", attrs=SITU, infer=_situ_infer,
      ref=lambda gate, up, beta, linear_beta: situ(gate, up, beta, linear_beta), families="elementwise fused",
      flops=lambda ins, outs, a: SITU_FLOPS["situ"] * math.prod(outs[0]),
      doc="beta tanh(gate/beta) sigmoid(gate) * linear_beta tanh(up/linear_beta), in fp32")


def _gated_mlp_infer(x: TensorType, w: TensorType, *, act, beta, linear_beta) -> list[TensorType]:
    expect(w.rank == 2 and D.equal(w.shape[1], x.shape[-1]), "gated-mlp-shape",
           f"gated_mlp weight must be [2I, {D.to_str(x.shape[-1])}], got {w}")
    expect(isinstance(w.shape[0], int) and w.shape[0] % 2 == 0, "gated-mlp-shape",
           f"gated_mlp weight rows must be even (gate rows, then up rows), got {w}")
    return [x.with_shape(x.shape[:-1] + (w.shape[0] // 2,))]


def _gated_mlp_ref(x, w, act, beta, linear_beta):
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return activation(gate, up, act, beta, linear_beta)


def _gated_mlp_flops(ins, outs, a):
    rows, two_i, d = math.prod(ins[0][:-1]), ins[1][0], ins[1][1]
    return 2 * rows * two_i * d + SITU_FLOPS[a["act"]] * rows * two_i // 2


defop("gated_mlp", "x w", attrs=GATED, infer=_gated_mlp_infer, ref=_gated_mlp_ref, flops=_gated_mlp_flops,
      families="fused matmul",
      doc="act(x W_gate^T, x W_up^T) with w = cat(W_gate, W_up) [2I, D]: the gate/up GEMM with its epilogue")


def _experts_infer(h, w13, w2, idx, w, *, act, beta, linear_beta) -> list[TensorType]:
    expect(h.rank == 2 and w13.rank == 3 and D.equal(w13.shape[2], h.shape[1]), "moe-shape",
           f"moe_experts takes h [N, D] and w13 [E, 2I, D]; got {h}, {w13}")
    expect(w2.rank == 3 and D.equal(w2.shape[0], w13.shape[0]) and D.equal(2 * w2.shape[2], w13.shape[1]),
           "moe-shape", f"w2 must be [E, D_out, I] for w13 {w13}, got {w2}")
    expect(idx.rank == 2 and D.equal(idx.shape[0], h.shape[0]) and idx.dtype == "i64", "moe-shape",
           f"idx must be i64[N, k] with h's N, got {idx}")
    expect(_same_dims(w.shape, idx.shape), "moe-shape", f"combine weights must be {_fmt(idx.shape)}, got {w}")
    return [h.with_shape((h.shape[0], w2.shape[1]))]


def _experts_ref(h, w13, w2, idx, w, act, beta, linear_beta):
    gu = moe_gate_up(h, w13, idx)
    I = w2.shape[2]
    return moe_down(activation(gu[..., :I], gu[..., I:], act, beta, linear_beta), w2, idx, w)


def _experts_flops(ins, outs, a):
    (N, d), two_i, k = ins[0], ins[1][1], ins[3][1]
    I, d_out = two_i // 2, ins[2][1]
    return 2 * N * k * two_i * d + SITU_FLOPS[a["act"]] * N * k * I + 2 * N * k * I * d_out + N * k * d_out


defop("moe_experts", "h w13 w2 idx w", attrs=GATED, infer=_experts_infer, ref=_experts_ref,
      flops=_experts_flops, families="fused moe",
      doc="y[n] = sum_j w[n,j] * w2[e] act(w13[e] h[n]), e = idx[n,j]: routed experts in one op")


def _absorbed_infer(q, ckv, krope, w_uk, w_uv, *, scale) -> list[TensorType]:
    expect(q.rank == 4 and ckv.rank == 3 and krope.rank == 3, "mla-shape",
           f"mla_attention_absorbed takes q [B, T, H, nope + rope], ckv [B, S, Dc], krope [B, S, Dr]; "
           f"got {q}, {ckv}, {krope}")
    B, T, H, Dq = q.shape
    Dc, Dr = ckv.shape[2], krope.shape[2]
    Dn = D.normalize(Dq - Dr)
    expect(_same_dims(w_uk.shape, (H, Dn, Dc)), "mla-shape", f"w_uk must be {_fmt((H, Dn, Dc))}, got {w_uk}")
    expect(w_uv.rank == 3 and _same_dims((w_uv.shape[0], w_uv.shape[2]), (H, Dc)), "mla-shape",
           f"w_uv must be [{D.to_str(H)}, Dv, {D.to_str(Dc)}], got {w_uv}")
    return [q.with_shape((B, T, H, w_uv.shape[1]))]


def _absorbed_ref(q, ckv, krope, w_uk, w_uv, scale):
    w = torch.cat([w_uk, w_uv], dim=1)  # back to kv_b_proj's [H, Dn + Dv, Dc] rows
    return mla_attention_absorbed(q, ckv, krope, w.reshape(-1, w.shape[-1]), w_uv.shape[1], scale)


def _absorbed_flops(ins, outs, a):
    from .attention import causal_pairs

    B, T, H, Dq = ins[0]
    S, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dn, Dv = Dq - Dr, ins[4][1]
    return 2 * B * T * H * (Dn * Dc + Dc * Dv) + causal_pairs(T, S) * B * H * (2 * (Dc + Dr) + 2 * Dc + 4)


defop("mla_attention_absorbed", "q ckv krope w_uk w_uv", attrs={"scale": attr("float", lo=0, lo_open=True)},
      infer=_absorbed_infer, ref=_absorbed_ref, flops=_absorbed_flops, families="attention fused",
      doc="MLA with W_UK folded into the query and W_UV after attention: one KV head of width Dc + Dr")
