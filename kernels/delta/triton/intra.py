"""Piece (a) of chunked KDA in Triton: the intra-chunk work, parallel over chunks.

Three kernels, each over (chunk, batch * head) programs, write what `chunk_prepare`
(k3c.ir.ops.chunked) returns, in chunk layout [B, H, NC, C, ...] fp32, T padded to NC * C
with zero rows (k = v = g = beta = 0 there, so nothing leaks into the state):

  chunk_decay_kernel    G = cumsum(g) in the chunk, kept in float64: every decay between two
                        tokens is a difference of G, which in float32 cancels after a strong
                        decay earlier in the chunk (|G| ~ 1e3: an error of ulp(|G|), 6e-5),
                        while in float64 it is exact to float32; q exp(G), k exp(G_last - G),
                        exp(G_last), and beta k exp(G) for the WY transform
  chunk_scores_kernel   the masked, decayed scores of the chunk:
                          L[i, j]   = beta_i sum_d k_i k_j exp(G_i - G_j)     j < i
                          Aqk[i, j] = sum_d q_i k_j exp(G_i - G_j)            j <= i
                        by a binary split of the chunk: at level h (C/2, C/4, ..., 1) row i
                        of an upper half-block [m, m + h) meets column j of the lower half
                        [m - h, m) through m: exp(G_i - G_j) = exp(G_i - G_m) exp(G_m - G_j),
                        both exponents <= 0 (never exp(G_i) exp(-G_j), which overflows), and
                        each level is two [C, BK] x [BK, C] dots; the diagonal is q_i . k_i
  chunk_wy_kernel       (I + L)^-1 by forward substitution: the [16, 16] diagonal blocks row by
                        row (all blocks at once), then block row by block row
                        A[p, :p] = -D_p^-1 L[p, :p] A[:p, :p]; then
                        w = (I + L)^-1 (beta k exp(G)),  u = (I + L)^-1 (beta v)

The gate is per channel (KDA). The gated delta rule (one gate per head) and the delta rule
(no gate) run the same kernels with the gate broadcast over K by a zero stride.
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, block, check_device, dot_precision, interpreter_tiles

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def _nonfinite(x):
    return (x != x) | (tl.abs(x) == float("inf"))


@triton.jit
def causal_dot(b_A, b_x, PREC: tl.constexpr):
    """b_A @ b_x for b_A [C, C] lower-triangular (each row free of NaN before its own) and b_x
    [C, N] in time order: a non-finite entry of b_x reaches its row and the rows after it (in
    its column), as in the recurrence, where a plain dot multiplies the zeros above the
    diagonal by it (0 * NaN = NaN) and spreads it to earlier tokens."""
    bad = _nonfinite(b_x)
    b_y = tl.dot(b_A, tl.where(bad, 0., b_x), input_precision=PREC)
    return tl.where(tl.cumsum(bad.to(tl.int32), axis=0) > 0, float("nan"), b_y)


@triton.jit
def chunk_decay_kernel(q, k, g, beta, G, q_decayed, k_decayed, kbg, decay_last,
                       s_gb, s_gt, s_gh, s_gk, s_bb, s_bt, s_bh,
                       T, NC, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, BK: tl.constexpr):
    i_n, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_t = i_n * C + o_c
    m_t, m_k = o_t < T, o_k < K
    m_tk = m_t[:, None] & m_k[None, :]

    p_g = g + i_b * s_gb + o_t[:, None] * s_gt + i_h * s_gh + o_k[None, :] * s_gk
    b_g = tl.load(p_g, mask=m_tk, other=0.).to(tl.float64)
    b_G = tl.cumsum(b_g, axis=0)
    b_Glast = tl.sum(b_g, axis=0)  # padded rows add 0: the last row of G

    p_in = (i_b * T + o_t[:, None]) * H * K + i_h * K + o_k[None, :]
    b_q = tl.load(q + p_in, mask=m_tk, other=0.).to(tl.float32)
    b_k = tl.load(k + p_in, mask=m_tk, other=0.).to(tl.float32)
    b_beta = tl.load(beta + i_b * s_bb + o_t * s_bt + i_h * s_bh, mask=m_t, other=0.).to(tl.float32)

    p_out = ((i_bh * NC + i_n) * C + o_c[:, None]) * K + o_k[None, :]
    b_eG = tl.exp(b_G.to(tl.float32))
    tl.store(G + p_out, b_G, mask=m_k[None, :])
    tl.store(q_decayed + p_out, b_q * b_eG, mask=m_k[None, :])
    tl.store(k_decayed + p_out, b_k * tl.exp((b_Glast[None, :] - b_G).to(tl.float32)), mask=m_k[None, :])
    tl.store(kbg + p_out, b_beta[:, None] * b_k * b_eG, mask=m_k[None, :])
    tl.store(decay_last + (i_bh * NC + i_n) * K + o_k, tl.exp(b_Glast.to(tl.float32)), mask=m_k)


@autotune(configs=[triton.Config({"BK": 32}, num_warps=4), triton.Config({"BK": 16}, num_warps=4),
                   triton.Config({"BK": 32}, num_warps=8)],
          key=["K", "C"])
@triton.jit
def chunk_scores_kernel(q, k, G, beta, L, Aqk, s_bb, s_bt, s_bh, T, NC, H: tl.constexpr, K: tl.constexpr,
                        C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                        PREC: tl.constexpr):
    # One program per (block of BC rows, chunk, batch * head): rows [m, m + BC) of L and Aqk.
    # Columns j < m meet row i through the block's first row m, exp(G_i - G_j) =
    # exp(G_i - G_m) exp(G_m - G_j) with both exponents <= 0: one [BC, BK] x [BK, C] dot each
    # for Aqk and L. The [BC, BC] diagonal block is formed pair by pair.
    # (A [BC, C] block per program rather than the chunk's [C, C]: two accumulators of C * C
    # fp32 plus their operands did not fit the registers of one program on a GPU.)
    i_r, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    m = i_r * BC
    o_r = m + tl.arange(0, BC)  # rows of this block, in the chunk
    o_c = tl.arange(0, C)  # columns before the block
    o_d = tl.arange(0, BC)  # columns of the diagonal block, from m
    o_tr, o_tc = i_n * C + o_r, i_n * C + o_c
    m_tr, m_tc = o_tr < T, o_tc < T
    p_Gc = G + (i_bh * NC + i_n) * C * K  # this chunk of G [C, K]

    b_Aqk = tl.zeros([BC, C], dtype=tl.float32)
    b_Akk = tl.zeros([BC, C], dtype=tl.float32)
    b_Aqk_d = tl.zeros([BC, BC], dtype=tl.float32)
    b_Akk_d = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_r = (i_b * T + o_tr[:, None]) * H * K + i_h * K + o_k[None, :]
        b_q = tl.load(q + p_r, mask=m_tr[:, None] & m_k[None, :], other=0.).to(tl.float32)
        b_k = tl.load(k + p_r, mask=m_tr[:, None] & m_k[None, :], other=0.).to(tl.float32)
        b_G = tl.load(p_Gc + o_r[:, None] * K + o_k[None, :], mask=m_k[None, :], other=0.)
        b_Gm = tl.load(p_Gc + m * K + o_k, mask=m_k, other=0.)
        b_e = tl.exp((b_G - b_Gm[None, :]).to(tl.float32))  # i >= m; G is float64
        p_c = (i_b * T + o_tc[:, None]) * H * K + i_h * K + o_k[None, :]
        b_kc = tl.load(k + p_c, mask=(m_tc & (o_c < m))[:, None] & m_k[None, :], other=0.).to(tl.float32)
        b_Gc = tl.load(p_Gc + o_c[:, None] * K + o_k[None, :], mask=(o_c < m)[:, None] & m_k[None, :], other=0.)
        b_kt = tl.trans(b_kc * tl.exp(tl.minimum((b_Gm[None, :] - b_Gc).to(tl.float32), 0.)))  # j < m; 0 from m on
        b_Aqk += tl.dot(b_q * b_e, b_kt, input_precision=PREC)
        b_Akk += tl.dot(b_k * b_e, b_kt, input_precision=PREC)
        # The diagonal block pairwise, [BC, BC, BK] at once: exp(G_i - G_j) with j > i masked to
        # -inf before the exp, so every factor formed is <= 1
        b_Gij = tl.where((o_d[:, None] >= o_d[None, :])[:, :, None],
                         (b_G[:, None, :] - b_G[None, :, :]).to(tl.float32), float("-inf"))
        b_kj = tl.exp(b_Gij) * b_k[None, :, :]
        b_Aqk_d += tl.sum(b_q[:, None, :] * b_kj, axis=2)
        b_Akk_d += tl.sum(b_k[:, None, :] * b_kj, axis=2)
    b_beta = tl.load(beta + i_b * s_bb + o_tr * s_bt + i_h * s_bh, mask=m_tr, other=0.).to(tl.float32)
    b_Akk_d = tl.where(o_d[:, None] > o_d[None, :], b_Akk_d, 0.)  # L is strictly lower
    # three disjoint stores per row: columns before the block, the block, zeros after it
    p_A = (i_bh * NC + i_n) * C * C + o_r[:, None] * C
    m_off = ((o_c < m) | (o_c >= m + BC))[None, :]
    tl.store(L + p_A + o_c[None, :], b_Akk * b_beta[:, None], mask=m_off)
    tl.store(Aqk + p_A + o_c[None, :], b_Aqk, mask=m_off)
    tl.store(L + p_A + m + o_d[None, :], b_Akk_d * b_beta[:, None])
    tl.store(Aqk + p_A + m + o_d[None, :], b_Aqk_d)


# The [C, C] inverse and its operand splits (3xTF32) fill the registers: [C, 64] tiles of w and
# u on top spilled on sm_90 at 4 and at 8 warps, so the tiles are 32 columns wide.
@autotune(configs=[triton.Config({"BK": 32, "BV": 32}, num_warps=4), triton.Config({"BK": 32, "BV": 32}, num_warps=8)],
          key=["K", "V", "C"])
@triton.jit
def chunk_wy_kernel(L, kbg, v, beta, w, u, s_bb, s_bt, s_bh, T, NC, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    PREC: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, C)
    o_t = i_n * C + o_c
    m_t = o_t < T
    b_L = tl.load(L + (i_bh * NC + i_n) * C * C + o_c[:, None] * C + o_c[None, :])
    m_I = o_c[:, None] == o_c[None, :]
    # a non-finite entry of L: the inverse of L with it zeroed, NaN from its row on (the rows the
    # recurrence reaches); the products below would spread it to every row by 0 * NaN
    m_bad = _nonfinite(b_L)
    bad_rows = tl.cumsum(tl.max(m_bad.to(tl.int32), axis=1), axis=0) > 0
    b_L = tl.where(m_bad, 0., b_L)

    # The diagonal [BC, BC] blocks of (I + L)^-1, all at once, row by row:
    # N[r, :] = -L[r, :] - L[r, :] N for the r-th row of each block (N = inverse - I)
    b_Ld = tl.where((o_c[:, None] // BC) == (o_c[None, :] // BC), b_L, 0.)
    b_N = tl.zeros([C, C], dtype=tl.float32)
    for i in range(1, BC):
        b_l = tl.where((o_c % BC == i)[:, None], -b_Ld, 0.)
        b_N += b_l + tl.dot(b_l, b_N, input_precision=PREC)
    b_Di = b_N + tl.where(m_I, 1., 0.)
    # Then block row by block row: A[p, :p] = -Di[p] L[p, :p] A[:p, :p]
    b_A = b_Di
    for p in range(1, C // BC):
        m_row = (o_c // BC == p)[:, None] & (o_c < p * BC)[None, :]
        b_x = tl.dot(tl.where(m_row, b_L, 0.), b_A, input_precision=PREC)
        b_A -= tl.dot(b_Di, b_x, input_precision=PREC)
    b_A = tl.where(bad_rows[:, None], float("nan"), b_A)

    p_chunk = (i_bh * NC + i_n) * C
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        p_kk = (p_chunk + o_c[:, None]) * K + o_k[None, :]
        b_kbg = tl.load(kbg + p_kk, mask=o_k[None, :] < K, other=0.)
        tl.store(w + p_kk, causal_dot(b_A, b_kbg, PREC), mask=o_k[None, :] < K)
    b_beta = tl.load(beta + i_b * s_bb + o_t * s_bt + i_h * s_bh, mask=m_t, other=0.).to(tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_v = v + (i_b * T + o_t[:, None]) * H * V + i_h * V + o_v[None, :]
        b_v = tl.load(p_v, mask=m_t[:, None] & m_v[None, :], other=0.).to(tl.float32) * b_beta[:, None]
        tl.store(u + (p_chunk + o_c[:, None]) * V + o_v[None, :], causal_dot(b_A, b_v, PREC), mask=m_v[None, :])


def _gate_view(g: torch.Tensor | None, gate: str, q: torch.Tensor) -> torch.Tensor:
    """g as a [B, T, H, K] view: per channel as is, per head with a zero K stride, absent as
    one zero with every stride zero."""
    B, T, H, K = q.shape
    if gate == "channel":
        return g.contiguous()
    if gate == "head":
        return g.contiguous()[..., None].expand(B, T, H, K)
    return q.new_zeros(1, dtype=torch.float32).expand(B, T, H, K)


def chunk_prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | None,
                  g: torch.Tensor | None, chunk_size: int, gate: str):
    """(a) for the delta family; the arguments and results of the IR op `chunk_prepare`.

    q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; g [B, T, H, K] (gate "channel"),
    [B, T, H] ("head") or None ("none", "linear": then beta is None too and A = I).
    Returns (q_decayed, k_decayed, w, u, aqk, decay_last), fp32 in chunk layout.
    """
    check_device("chunk_prepare", q, k, v, beta, g)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    if C < 16 or C & (C - 1):
        raise ValueError(f"chunk_prepare (triton): chunk_size must be a power of two >= 16, got {C}")
    NC = triton.cdiv(T, C)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    gv = _gate_view(g, gate, q)
    bv = beta.contiguous() if beta is not None else q.new_ones(1, dtype=torch.float32).expand(B, T, H)
    f32 = dict(dtype=torch.float32, device=q.device)
    G = torch.empty(B, H, NC, C, K, dtype=torch.float64, device=q.device)  # cumulative gates
    q_dec, k_dec, kbg = (torch.empty(B, H, NC, C, K, **f32) for _ in range(3))
    decay = torch.empty(B, H, NC, K, **f32)
    BK = min(block(K), 32)  # the float64 cumulative gates of a [C, 64] tile spill on sm_90 at K = 128
    chunk_decay_kernel[(NC, triton.cdiv(K, BK), B * H)](
        q, k, gv, bv, G, q_dec, k_dec, kbg, decay, *gv.stride(), *bv.stride(), T, NC, H=H, K=K, C=C, BK=BK)
    L, aqk = torch.empty(B, H, NC, C, C, **f32), torch.empty(B, H, NC, C, C, **f32)
    prec = dot_precision()
    # rows per program of the scores (C is a power of two >= 16): 16 on a GPU (registers); the
    # whole chunk under the interpreter, a quarter of the programs, the same values to rounding
    BC = C if interpreter_tiles() else 16
    chunk_scores_kernel[(C // BC, NC, B * H)](q, k, G, bv, L, aqk, *bv.stride(), T, NC, H=H, K=K, C=C, BC=BC, PREC=prec)
    if gate == "linear":
        w = torch.zeros(B, H, NC, C, K, **f32)
        u = torch.zeros(B, H, NC * C, V, **f32)
        u[:, :, :T] = v.transpose(1, 2)
        u = u.view(B, H, NC, C, V)
    else:
        w, u = torch.empty(B, H, NC, C, K, **f32), torch.empty(B, H, NC, C, V, **f32)
        chunk_wy_kernel[(NC, B * H)](L, kbg, v, bv, w, u, *bv.stride(), T, NC, H=H, K=K, V=V, C=C, BC=16,
                                     PREC=prec)
    if gate != "channel":
        decay = decay[..., :1].contiguous()
    return q_dec, k_dec, w, u, aqk, decay
