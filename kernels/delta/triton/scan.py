"""Piece (b) of chunked KDA in Triton: the inter-chunk state scan, the only sequential part.

One program per (block of BV value columns, batch * head) carries its [K, BV] slice of the
state S in fp32 registers (up to four blocks of 64 rows: K <= 256) through the NC chunks:

    for n:  starts[n] = S;  v_new = u - w S;  S = exp(G_last)[:, None] * S + k_decayed^T v_new

Shared by the delta family: decay_last is [B, H, NC, K] (per channel) or [B, H, NC, 1].
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, block, check_device, dot_precision

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def _kv(p, o_k, o_v, K, V):
    """Rows o_k, columns o_v of a [K, V] matrix at p (zero outside)."""
    return tl.load(p + o_k[:, None] * V + o_v[None, :], mask=(o_k < K)[:, None] & (o_v < V)[None, :], other=0.)


@triton.jit
def _store_kv(p, x, o_k, o_v, K, V):
    tl.store(p + o_k[:, None] * V + o_v[None, :], x, mask=(o_k < K)[:, None] & (o_v < V)[None, :])


@triton.jit
def _ck(p, o_c, o_k, K):
    """Columns o_k of a [C, K] matrix at p: a [C, BK] block."""
    return tl.load(p + o_c[:, None] * K + o_k[None, :], mask=(o_k < K)[None, :], other=0.)


@triton.jit
def _decayed(b_S, p_d, s_dk, p_kd, o_c, o_k, K, b_vn, PREC: tl.constexpr):
    """One block of rows of S = exp(G_last)[:, None] * S + k_decayed^T v_new."""
    b_d = tl.load(p_d + o_k * s_dk, mask=o_k < K, other=0.)
    return b_S * b_d[:, None] + tl.dot(tl.trans(_ck(p_kd, o_c, o_k, K)), b_vn, input_precision=PREC)


# The state's K rows are up to four blocks of BK = 64, each a value of its own (as fla's
# kernels hold it): one [128, BV] block with the chunk's [C, 128] tiles of w and k_decayed,
# each split in two for 3xTF32, spilled on sm_90. Two stages of prefetch: three took 230 KB
# of shared memory at K = 128, and 64 value columns still spilled there.
@autotune(configs=[triton.Config({"BV": 32}, num_warps=4, num_stages=2),
                   triton.Config({"BV": 32}, num_warps=8, num_stages=2),
                   triton.Config({"BV": 16}, num_warps=4, num_stages=2)],
          key=["K", "V", "C"])
@triton.jit
def chunk_state_scan_kernel(w, u, k_decayed, decay_last, h0, v_new, starts, ht, s_dn, s_dk, NC,
                            K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                            BV: tl.constexpr, PREC: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_c, o_b = tl.arange(0, C), tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    p_h = h0 + i_bh * K * V
    b_S0 = _kv(p_h, o_b, o_v, K, V).to(tl.float32)
    b_S1 = _kv(p_h, BK + o_b, o_v, K, V).to(tl.float32) if K > BK else tl.zeros([BK, BV], dtype=tl.float32)
    b_S2 = _kv(p_h, 2 * BK + o_b, o_v, K, V).to(tl.float32) if K > 2 * BK else tl.zeros([BK, BV], dtype=tl.float32)
    b_S3 = _kv(p_h, 3 * BK + o_b, o_v, K, V).to(tl.float32) if K > 3 * BK else tl.zeros([BK, BV], dtype=tl.float32)
    for i_n in range(NC):
        p_chunk = (i_bh * NC + i_n) * C
        p_st = starts + (i_bh * NC + i_n) * K * V
        p_w, p_kd = w + p_chunk * K, k_decayed + p_chunk * K
        _store_kv(p_st, b_S0, o_b, o_v, K, V)
        b_vn = _kv(u + p_chunk * V, o_c, o_v, C, V) - tl.dot(_ck(p_w, o_c, o_b, K), b_S0, input_precision=PREC)
        if K > BK:
            _store_kv(p_st, b_S1, BK + o_b, o_v, K, V)
            b_vn -= tl.dot(_ck(p_w, o_c, BK + o_b, K), b_S1, input_precision=PREC)
        if K > 2 * BK:
            _store_kv(p_st, b_S2, 2 * BK + o_b, o_v, K, V)
            b_vn -= tl.dot(_ck(p_w, o_c, 2 * BK + o_b, K), b_S2, input_precision=PREC)
        if K > 3 * BK:
            _store_kv(p_st, b_S3, 3 * BK + o_b, o_v, K, V)
            b_vn -= tl.dot(_ck(p_w, o_c, 3 * BK + o_b, K), b_S3, input_precision=PREC)
        _store_kv(v_new + p_chunk * V, b_vn, o_c, o_v, C, V)
        p_d = decay_last + (i_bh * NC + i_n) * s_dn
        b_S0 = _decayed(b_S0, p_d, s_dk, p_kd, o_c, o_b, K, b_vn, PREC)
        if K > BK:
            b_S1 = _decayed(b_S1, p_d, s_dk, p_kd, o_c, BK + o_b, K, b_vn, PREC)
        if K > 2 * BK:
            b_S2 = _decayed(b_S2, p_d, s_dk, p_kd, o_c, 2 * BK + o_b, K, b_vn, PREC)
        if K > 3 * BK:
            b_S3 = _decayed(b_S3, p_d, s_dk, p_kd, o_c, 3 * BK + o_b, K, b_vn, PREC)
    p_h = ht + i_bh * K * V
    _store_kv(p_h, b_S0, o_b, o_v, K, V)
    if K > BK:
        _store_kv(p_h, b_S1, BK + o_b, o_v, K, V)
    if K > 2 * BK:
        _store_kv(p_h, b_S2, 2 * BK + o_b, o_v, K, V)
    if K > 3 * BK:
        _store_kv(p_h, b_S3, 3 * BK + o_b, o_v, K, V)


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
                                  K=K, V=V, C=C, BK=min(block(K), 64), PREC=dot_precision())
    return v_new, starts, ht
