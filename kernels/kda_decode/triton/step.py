"""KDA's decode step as one Triton kernel (the math: ../README.md, the definition: ../naive.py).

One program per (batch, head) does the layer step of its head (HB heads under the
interpreter, as [HB, K] and [HB, K, V] tiles: heads_per_program): the short convs of its K, K
and V channels (and their new tails), the l2norms, the forget gate and beta, one delta step
and the gated RMSNorm of its output row. The [K, V] state is loaded once into fp32 registers
and stored once:

    P = exp(g)[:, None] * S;  w = beta (v - k^T P);  S' = P + k w^T;  o = scale q^T S'

The whole value row sits in one program (the norm sums over it), so V is bounded as in the
recurrent kernels (backends/triton/lowering.py's MAX_HEAD_DIM).
"""

from __future__ import annotations

import torch

from ...common.triton import block, check_device, interpreter_tiles
from ..naive import GATES

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def _conv(x, w, st, st1, o_c, m_c, W: tl.constexpr, BP: tl.constexpr, SILU: tl.constexpr):
    """The short conv of channels o_c of one token (x: its row), its tail shifted by one into st1."""
    P: tl.constexpr = W - 1
    o_p = tl.arange(0, BP)
    m_p = o_p < P
    m_cp = m_c[:, None] & m_p[None, :]
    b_x = tl.load(x + o_c, mask=m_c, other=0.).to(tl.float32)
    b_st = tl.load(st + o_c[:, None] * P + o_p[None, :], mask=m_cp, other=0.).to(tl.float32)
    b_w = tl.load(w + o_c[:, None] * W + o_p[None, :], mask=m_cp, other=0.).to(tl.float32)
    b_wl = tl.load(w + o_c * W + P, mask=m_c, other=0.).to(tl.float32)
    b_y = tl.sum(b_w * b_st, axis=1) + b_wl * b_x
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    # the new tail: entries 1..P-1 of the old one, then x
    b_next = tl.load(st + o_c[:, None] * P + o_p[None, :] + 1, mask=m_c[:, None] & (o_p[None, :] + 1 < P), other=0.)
    b_next = tl.where(o_p[None, :] == P - 1, b_x[:, None], b_next.to(tl.float32))
    tl.store(st1 + o_c[:, None] * P + o_p[None, :], b_next.to(st1.dtype.element_ty), mask=m_cp)
    return b_y


@triton.jit
def _log1p_exp_neg_abs(y):
    """log(1 + exp(-|y|)) without the cancellation of 1 + exp(.): 2 atanh(e / (2 + e)) as a series."""
    e = tl.exp(-tl.abs(y))
    s = e / (2.0 + e)
    s2 = s * s
    p = 1.0 / 17
    p = p * s2 + 1.0 / 15
    p = p * s2 + 1.0 / 13
    p = p * s2 + 1.0 / 11
    p = p * s2 + 1.0 / 9
    p = p * s2 + 1.0 / 7
    p = p * s2 + 1.0 / 5
    p = p * s2 + 1.0 / 3
    p = p * s2 + 1.0
    return 2.0 * s * p


@triton.jit
def kda_decode_kernel(qx, kx, vx, qw, kw, vw, qc, kc, vc, f, a, dt, b, h0, og, nw, o, ht, qc1, kc1, vc1,
                      scale, lower_bound, qk_eps, eps, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      W: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BP: tl.constexpr,
                      SILU: tl.constexpr, SIGMOID_GATE: tl.constexpr):
    NHB: tl.constexpr = (H + HB - 1) // HB
    i_p = tl.program_id(0).to(tl.int64)
    i_b = i_p // NHB
    P: tl.constexpr = W - 1
    o_h = (i_p % NHB) * HB + tl.arange(0, HB)
    o_k, o_v = tl.arange(0, BK), tl.arange(0, BV)
    m_h, m_k, m_v = o_h < H, o_k < K, o_v < V
    m_hk, m_hv = m_h[:, None] & m_k[None, :], m_h[:, None] & m_v[None, :]
    o_bh = i_b * H + o_h  # rows of [B * H, ...]
    # the convs of these heads' channels: rows of [B, 1, H*K] and tails [B, H*K, P], the
    # [HB, BK] channels taken as one vector
    c_k = tl.reshape(o_h[:, None] * K + o_k[None, :], [HB * BK])
    c_v = tl.reshape(o_h[:, None] * V + o_v[None, :], [HB * BV])
    f_k, f_v = tl.reshape(m_hk, [HB * BK]), tl.reshape(m_hv, [HB * BV])
    row_k, row_v = i_b * H * K, i_b * H * V
    b_q = tl.reshape(_conv(qx + row_k, qw, qc + row_k * P, qc1 + row_k * P, c_k, f_k, W, BP, SILU), [HB, BK])
    b_k = tl.reshape(_conv(kx + row_k, kw, kc + row_k * P, kc1 + row_k * P, c_k, f_k, W, BP, SILU), [HB, BK])
    b_v = tl.reshape(_conv(vx + row_v, vw, vc + row_v * P, vc1 + row_v * P, c_v, f_v, W, BP, SILU), [HB, BV])
    b_q = tl.where(m_hk, b_q, 0.)
    b_k = tl.where(m_hk, b_k, 0.)
    b_v = tl.where(m_hv, b_v, 0.)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + qk_eps)[:, None]
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + qk_eps)[:, None]
    # the forget gate's decay of each key row, and beta
    b_x = tl.load(f + o_bh[:, None] * K + o_k[None, :], mask=m_hk, other=0.).to(tl.float32) \
        + tl.load(dt + o_h[:, None] * K + o_k[None, :], mask=m_hk, other=0.).to(tl.float32)
    b_a = tl.load(a + o_h, mask=m_h, other=0.).to(tl.float32)[:, None]
    if SIGMOID_GATE:
        b_g = lower_bound * tl.sigmoid(b_a * b_x)
    else:
        b_g = b_a * tl.where(b_x > 20., b_x, tl.maximum(b_x, 0.) + _log1p_exp_neg_abs(b_x))
    b_beta = tl.sigmoid(tl.load(b + o_bh, mask=m_h, other=0.).to(tl.float32))
    # the state: loaded once, decayed, written to, stored once
    m_kv = m_hk[:, :, None] & m_v[None, None, :]
    p_kv = (o_bh[:, None, None] * K + o_k[None, :, None]) * V + o_v[None, None, :]
    b_S = tl.load(h0 + p_kv, mask=m_kv, other=0.).to(tl.float32) * tl.exp(b_g)[:, :, None]
    b_w = b_beta[:, None] * (b_v - tl.sum(b_k[:, :, None] * b_S, axis=1))
    b_S += b_k[:, :, None] * b_w[:, None, :]
    tl.store(ht + p_kv, b_S.to(ht.dtype.element_ty), mask=m_kv)
    b_o = scale * tl.sum(b_q[:, :, None] * b_S, axis=1)
    # the gated RMSNorm of each head's output row
    b_o = tl.where(m_hv, b_o, 0.)
    b_o = b_o * tl.rsqrt(tl.sum(b_o * b_o, axis=1) / V + eps)[:, None]
    p_o = o_bh[:, None] * V + o_v[None, :]
    b_o = b_o * tl.load(nw + o_v, mask=m_v, other=0.).to(tl.float32)[None, :] \
        * tl.sigmoid(tl.load(og + p_o, mask=m_hv, other=0.).to(tl.float32))
    tl.store(o + p_o, b_o.to(o.dtype.element_ty), mask=m_hv)


def heads_per_program(H: int) -> int:
    """One head a program on a GPU (B * H programs fill its SMs); under the interpreter, whose
    cost is per operation, up to 16 heads in one program."""
    return min(16, triton.next_power_of_2(H)) if interpreter_tiles() else 1


def kda_decode_step(q_x, k_x, v_x, q_w, k_w, v_w, q_conv, k_conv, v_conv, f, a, dt_bias, b, state, o_gate, norm_w,
                    scale: float, gate: str = "sigmoid", lower_bound: float = -5.0, activation: str = "silu",
                    qk_eps: float = 1e-6, eps: float = 1e-5):
    """The IR op's inputs in its order (../naive.py has the shapes) -> (o [B, 1, H, V] in v_x's
    dtype, state' fp32, q_conv', k_conv', v_conv')."""
    ins = (q_x, k_x, v_x, q_w, k_w, v_w, q_conv, k_conv, v_conv, f, a, dt_bias, b, state, o_gate, norm_w)
    check_device("kda_decode_step", *ins)
    if gate not in GATES or activation not in ("silu", "none"):
        raise ValueError(f"kda_decode_step: gate {gate!r} (one of {GATES}), activation {activation!r} (silu, none)")
    B, T, H, K = f.shape
    V, W = o_gate.shape[-1], q_w.shape[-1]
    if T != 1 or W < 2:
        raise ValueError(f"kda_decode_step: one token (got T={T}) and a conv of width >= 2 (got {W})")
    ins = [x.contiguous() for x in ins]
    out = torch.empty(B, 1, H, V, dtype=v_x.dtype, device=v_x.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=state.device)
    tails = [torch.empty_like(ins[i]) for i in (6, 7, 8)]
    HB = heads_per_program(H)
    kda_decode_kernel[(B * triton.cdiv(H, HB),)](*ins, out, ht, *tails, float(scale), float(lower_bound),
                                float(qk_eps), float(eps), H=H, K=K, V=V, W=W, HB=HB, BK=block(K, 2),
                                BV=block(V, 2), BP=block(W - 1, 2),
                                SILU=activation == "silu", SIGMOID_GATE=gate == "sigmoid")
    return out, ht, *tails
