"""Piece (b) of chunked KDA in Triton: the inter-chunk state scan, the only sequential part.

One program per (block of BV value columns, batch * head) carries its [K, BV] slice of the
state S in fp32 registers through the NC chunks:

    for n:  starts[n] = S;  v_new = u - w S;  S = exp(G_last)[:, None] * S + k_decayed^T v_new

Shared by the delta family: decay_last is [B, H, NC, K] (per channel) or [B, H, NC, 1].
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, block, check_device, dot_precision

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@autotune(configs=[triton.Config({"BV": 64}, num_warps=4), triton.Config({"BV": 32}, num_warps=2),
                   triton.Config({"BV": 32}, num_warps=4), triton.Config({"BV": 64}, num_warps=8)],
          key=["K", "V", "C"])
@triton.jit
def chunk_state_scan_kernel(w, u, k_decayed, decay_last, h0, v_new, starts, ht, s_dn, s_dk, NC,
                            K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                            BV: tl.constexpr, PREC: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_c, o_k = tl.arange(0, C), tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]

    b_S = tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0.).to(tl.float32)
    for i_n in range(NC):
        p_chunk = (i_bh * NC + i_n) * C
        tl.store(starts + (i_bh * NC + i_n) * K * V + p_kv, b_S, mask=m_kv)
        b_w = tl.load(w + (p_chunk + o_c[:, None]) * K + o_k[None, :], mask=m_k[None, :], other=0.)
        p_cv = (p_chunk + o_c[:, None]) * V + o_v[None, :]
        b_vn = tl.load(u + p_cv, mask=m_v[None, :], other=0.) - tl.dot(b_w, b_S, input_precision=PREC)
        tl.store(v_new + p_cv, b_vn, mask=m_v[None, :])
        b_kd = tl.load(k_decayed + (p_chunk + o_c[:, None]) * K + o_k[None, :], mask=m_k[None, :], other=0.)
        b_d = tl.load(decay_last + (i_bh * NC + i_n) * s_dn + o_k * s_dk, mask=m_k, other=0.)
        b_S = b_S * b_d[:, None] + tl.dot(tl.trans(b_kd), b_vn, input_precision=PREC)
    tl.store(ht + i_bh * K * V + p_kv, b_S, mask=m_kv)


def chunk_state_scan(w: torch.Tensor, u: torch.Tensor, k_decayed: torch.Tensor, decay_last: torch.Tensor,
                     state: torch.Tensor | None):
    """(b): the IR op `chunk_state_scan`. w, k_decayed [B, H, NC, C, K]; u [B, H, NC, C, V];
    decay_last [B, H, NC, K or 1]; state [B, H, K, V] fp32 (None: zeros).
    Returns (v_new [B, H, NC, C, V], start states [B, H, NC, K, V], final state [B, H, K, V])."""
    check_device("chunk_state_scan", w, u, k_decayed, decay_last, state)
    B, H, NC, C, V = u.shape
    K = k_decayed.shape[-1]
    w, u, k_decayed, decay_last = (x.float().contiguous() for x in (w, u, k_decayed, decay_last))
    h0 = u.new_zeros(B, H, K, V) if state is None else state.float().contiguous()
    v_new = torch.empty_like(u)
    starts = u.new_empty(B, H, NC, K, V)
    ht = u.new_empty(B, H, K, V)
    s_dn = decay_last.shape[-1]  # K per channel, 1 per head: then one decay for every row of S
    s_dk = 1 if s_dn == K else 0
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), B * H)
    chunk_state_scan_kernel[grid](w, u, k_decayed, decay_last, h0, v_new, starts, ht, s_dn, s_dk, NC,
                                  K=K, V=V, C=C, BK=block(K), PREC=dot_precision())
    return v_new, starts, ht
