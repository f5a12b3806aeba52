"""Attention ops: causal softmax attention over a cache, MLA over a latent cache, AttnRes."""

from __future__ import annotations

import math

from ...kernels.attention.naive import causal_attention
from ...kernels.attn_res.naive import attn_res_mix
from ...kernels.mla.naive import mla_attention
from .. import dims as D
from ..types import TensorType
from .recurrent import _fmt, _same_dims
from .spec import attr, defop, expect

SCALE = attr("float", lo=0, lo_open=True)


def causal_pairs(T: int, S: int) -> int:
    """Query-key pairs of causal attention, bottom-right aligned (S >= T keys)."""
    return T * (S - T + 1) + T * (T - 1) // 2


def _attention_flops(ins, outs, a):
    B, T, H, Dq = ins[0]
    S, Dv = ins[1][1], ins[2][3]
    return causal_pairs(T, S) * B * H * (2 * Dq + 2 * Dv + 4)


def _mla_flops(ins, outs, a):
    B, T, H, Dq = ins[0]
    S, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dv = a["v_head_dim"]
    up = 2 * B * S * Dc * H * (Dq - Dr + Dv)
    return up + causal_pairs(T, S) * B * H * (2 * Dq + 2 * Dv + 4)


def _attn_infer(q: TensorType, k: TensorType, v: TensorType, *, scale) -> list[TensorType]:
    expect(q.rank == 4 and k.rank == 4 and v.rank == 4, "qkv-shape",
           f"causal_attention takes [B, T, H, D] q and [B, S, H, D] k, v; got {q}, {k}, {v}")
    B, T, H, Dq = q.shape
    expect(_same_dims((k.shape[0], k.shape[2], k.shape[3]), (B, H, Dq)), "qkv-shape",
           f"k must be [B, S, H, D] matching q {q}, got {k}")
    expect(_same_dims(v.shape[:3], k.shape[:3]), "qkv-shape", f"v must be [B, S, H, Dv] matching k {k}, got {v}")
    return [v.with_shape((B, T, H, v.shape[3]))]


defop("causal_attention", "q k v", "o", attrs={"scale": SCALE}, infer=_attn_infer,
      ref=lambda q, k, v, scale: causal_attention(q, k, v, scale), flops=_attention_flops, eager=True,
      families="attention",
      doc="softmax(q k^T * scale, causal, bottom-right aligned) v; S >= T keys")


def _mla_infer(q, ckv, krope, w_kv_b, *, v_head_dim, scale) -> list[TensorType]:
    expect(q.rank == 4, "mla-shape", f"q must be [B, T, H, nope + rope], got {q}")
    B, T, H, Dq = q.shape
    expect(ckv.rank == 3 and D.equal(ckv.shape[0], B), "mla-shape", f"ckv must be [B, S, Dc], got {ckv}")
    S, Dc = ckv.shape[1], ckv.shape[2]
    expect(_same_dims(krope.shape[:2], (B, S)) and krope.rank == 3, "mla-shape",
           f"krope must be [B, S, Dr] with ckv's S, got {krope} for ckv {ckv}")
    Dn = D.normalize(Dq - krope.shape[2])
    expected = (D.normalize(H * (Dn + v_head_dim)), Dc)
    expect(_same_dims(w_kv_b.shape, expected), "mla-shape",
           f"w_kv_b must be {_fmt(expected)} (H * (nope + v), kv_lora), got {w_kv_b}")
    return [q.with_shape((B, T, H, v_head_dim))]


defop("mla_attention", "q ckv krope w_kv_b", "o", attrs={"v_head_dim": attr("int", lo=1), "scale": SCALE},
      infer=_mla_infer, ref=lambda q, ckv, krope, w, v_head_dim, scale: mla_attention(q, ckv, krope, w, v_head_dim,
                                                                                       scale),
      flops=_mla_flops, eager=True, families="attention",
      doc="MLA over the latent cache: keys/values up-projected by w_kv_b (NoPE)")


def _res_infer(V: TensorType, w: TensorType, n: TensorType, *, eps) -> list[TensorType]:
    expect(V.rank >= 2, "attn-res-shape", f"AttnRes candidates must be [N, ..., d], got {V}")
    d = V.shape[-1]
    for p, what in ((w, "pseudo-query w"), (n, "norm weight n")):
        expect(p.rank == 1 and D.equal(p.shape[0], d), "attn-res-shape", f"{what} must be [{D.to_str(d)}], got {p}")
    return [V.with_shape(V.shape[1:])]


defop("attn_res_mix", "V w n", "y", attrs={"eps": attr("float", lo=0)}, infer=_res_infer,
      ref=lambda V, w, n, eps: attn_res_mix(V, w, n, eps), eager=True, families="attention",
      flops=lambda ins, outs, a: 6 * math.prod(ins[0]),
      doc="softmax over N of rmsnorm(V).(n*w), then the weighted sum of raw V")
