"""Fused ops the passes create: SiTU, the gated MLP with its activation epilogue, the whole
routed-expert computation, and MLA in its absorbed (decode) form."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...kernels.mla.naive import mla_attention_absorbed
from ...kernels.moe.naive import moe_down, moe_gate_up
from ...kernels.situ.naive import silu_glu, situ
from .. import dims as D
from ..types import TensorType
from .recurrent import _fmt, _same_dims
from .spec import REQUIRED, defop, expect

ACTS = ("situ", "silu")


def activation(gate: torch.Tensor, up: torch.Tensor, act: str, beta: float, linear_beta: float | None):
    return situ(gate, up, beta, linear_beta) if act == "situ" else silu_glu(gate, up)


def _situ_infer(gate: TensorType, up: TensorType, *, beta, linear_beta) -> list[TensorType]:
    expect(gate.same_as(up), "situ-shape", f"SiTU gate {gate} and up {up} must match")
    return [gate]


defop("situ", "gate up", attrs={"beta": REQUIRED, "linear_beta": None}, infer=_situ_infer,
      ref=lambda gate, up, beta, linear_beta: situ(gate, up, beta, linear_beta), families="elementwise fused",
      doc="beta tanh(gate/beta) sigmoid(gate) * linear_beta tanh(up/linear_beta), in fp32")


def _gated_mlp_infer(x: TensorType, w: TensorType, *, act, beta, linear_beta) -> list[TensorType]:
    expect(act in ACTS, "attr", f"gated_mlp act must be one of {ACTS}, got {act!r}")
    expect(w.rank == 2 and D.equal(w.shape[1], x.shape[-1]), "gated-mlp-shape",
           f"gated_mlp weight must be [2I, {D.to_str(x.shape[-1])}], got {w}")
    expect(isinstance(w.shape[0], int) and w.shape[0] % 2 == 0, "gated-mlp-shape",
           f"gated_mlp weight rows must be even (gate rows, then up rows), got {w}")
    return [x.with_shape(x.shape[:-1] + (w.shape[0] // 2,))]


def _gated_mlp_ref(x, w, act, beta, linear_beta):
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return activation(gate, up, act, beta, linear_beta)


defop("gated_mlp", "x w", attrs={"act": REQUIRED, "beta": 4.0, "linear_beta": None}, infer=_gated_mlp_infer,
      ref=_gated_mlp_ref, families="fused matmul",
      doc="act(x W_gate^T, x W_up^T) with w = cat(W_gate, W_up) [2I, D]: the gate/up GEMM with its epilogue")


def _experts_infer(h, w13, w2, idx, w, *, act, beta, linear_beta) -> list[TensorType]:
    expect(act in ACTS, "attr", f"moe_experts act must be one of {ACTS}, got {act!r}")
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


defop("moe_experts", "h w13 w2 idx w", attrs={"act": REQUIRED, "beta": 4.0, "linear_beta": None},
      infer=_experts_infer, ref=_experts_ref, families="fused moe",
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


defop("mla_attention_absorbed", "q ckv krope w_uk w_uv", attrs={"scale": REQUIRED}, infer=_absorbed_infer,
      ref=_absorbed_ref, families="attention fused",
      doc="MLA with W_UK folded into the query and W_UV after attention: one KV head of width Dc + Dr")
