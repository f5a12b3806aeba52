"""Piece (c) of chunked KDA in Triton: the output, parallel over chunks.

One program per (block of BV value columns, chunk, batch * head):

    o = scale * ((q exp(G)) S_start + Aqk v_new)      written to [B, T, H, V], padding dropped
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, check_device, dot_precision
from .intra import causal_dot

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@autotune(configs=[triton.Config({"BK": 64, "BV": 64}, num_warps=4), triton.Config({"BK": 64, "BV": 32}, num_warps=4),
                   triton.Config({"BK": 64, "BV": 64}, num_warps=8)],
          key=["K", "V", "C"])
@triton.jit
def chunk_output_kernel(q_decayed, aqk, v_new, starts, o, scale, T, NC, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        PREC: tl.constexpr):
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, C)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_chunk = (i_bh * NC + i_n) * C

    b_o = tl.zeros([C, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q_decayed + (p_chunk + o_c[:, None]) * K + o_k[None, :], mask=m_k[None, :], other=0.)
        p_S = starts + (i_bh * NC + i_n) * K * V + o_k[:, None] * V + o_v[None, :]
        b_S = tl.load(p_S, mask=m_k[:, None] & m_v[None, :], other=0.)
        b_o += tl.dot(b_q, b_S, input_precision=PREC)
    # aqk's diagonal blocks above the diagonal hold 0 * k_j, NaN for a NaN key: selected away
    b_A = tl.where(o_c[:, None] >= o_c[None, :], tl.load(aqk + (p_chunk + o_c[:, None]) * C + o_c[None, :]), 0.)
    b_vn = tl.load(v_new + (p_chunk + o_c[:, None]) * V + o_v[None, :], mask=m_v[None, :], other=0.)
    b_o = scale * (b_o + causal_dot(b_A, b_vn, PREC))

    o_t = i_n * C + o_c
    p_o = o + (i_b * T + o_t[:, None]) * H * V + i_h * V + o_v[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=(o_t[:, None] < T) & m_v[None, :])


def chunk_output(q_decayed: torch.Tensor, aqk: torch.Tensor, v_new: torch.Tensor, starts: torch.Tensor,
                 scale: float, T: int, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(c): the IR op `chunk_output`. q_decayed [B, H, NC, C, K]; aqk [B, H, NC, C, C];
    v_new [B, H, NC, C, V]; starts [B, H, NC, K, V] -> o [B, T, H, V] in `out_dtype`."""
    check_device("chunk_output", q_decayed, aqk, v_new, starts)
    B, H, NC, C, V = v_new.shape
    K = q_decayed.shape[-1]
    q_decayed, aqk, v_new, starts = (x.float().contiguous() for x in (q_decayed, aqk, v_new, starts))
    o = v_new.new_empty(B, T, H, V, dtype=out_dtype)
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), NC, B * H)
    chunk_output_kernel[grid](q_decayed, aqk, v_new, starts, o, float(scale), T, NC, H=H, K=K, V=V, C=C,
                              PREC=dot_precision())
    return o
