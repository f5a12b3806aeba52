"""Attention over a fixed-capacity KV cache in Triton, split over the keys (flash-decoding).

    scores = (q1 . k1 + q2 . k2) * scale;  token t of sequence b sees keys j <= positions[b] + t
    o = softmax(scores) v                  (the definition: kernels/cache/naive.py)

The cache holds N rows a sequence, of which positions[b] + T are written (the rows before
this call and the T new ones); only those are read. Each sequence's written rows are cut
into `splits` equal ranges (multiples of BN keys): program (row block, split, b, g) walks
its range for a block of query rows, keeping the running max, the running sum and the
unnormalised output in fp32 (online softmax), and stores them; a second kernel combines
the splits of each query row, each rescaled to their common max. With one split the first
kernel writes the output itself. Rows past a sequence's written ones (unused capacity, rows
of an earlier sequence of the slot) are never loaded, so whatever they hold (NaN, inf)
cannot reach an output.

A query tile's rows are (token, head) pairs of one key/value head g: the H / G query heads
that share it (all H heads of absorbed MLA's one latent head) read each key row once.
Keys and values come with their (batch, row, head) strides, so MLA passes views of its
latent cache ([ckv | krope] keys, ckv values) without copies. Every offset is int64: at a
1M-row cache, b * N * 576 and t * H * 512 pass 2^31.
"""

from __future__ import annotations

import torch

from ....errors import InputError
from ...common.triton import INTERPRET, block, check_device, dot_precision, dots_in_fp32

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip

TARGET_PROGRAMS = 264  # split until a launch has about two waves of an H100/H200's 132 SMs
MAX_SPLITS = 64  # the merge reads every split of a row: bounded
BK = 64  # width of the slices of the query/key dim each dot takes (q is re-read, not held)


@triton.jit
def cached_split_kernel(q1, q2, k1, k2, v, pos, o, part_acc, part_ml,
                        s_q1b, s_q1t, s_q1h, s_q2b, s_q2t, s_q2h, s_k1b, s_k1n, s_k1g, s_k2b, s_k2n, s_k2g,
                        s_vb, s_vn, s_vg, s_ob, s_ot, s_oh, B, T, N, n_rows_m, SPLITS, scale,
                        H: tl.constexpr, G: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
                        BD1: tl.constexpr, BD2: tl.constexpr, BDV: tl.constexpr, BKD: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, DIRECT: tl.constexpr,
                        DOT_F32: tl.constexpr, PREC: tl.constexpr):
    HG: tl.constexpr = H // G
    # grid (B * G * row blocks, SPLITS): the large product in x (CUDA's y and z stop at 65535)
    i_x, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_bg, i_m = i_x // n_rows_m, i_x % n_rows_m
    i_b, i_g = i_bg // G, i_bg % G
    o_r = i_m * BM + tl.arange(0, BM).to(tl.int64)  # (token, head of the group) rows
    o_t, o_h = o_r // HG, i_g * HG + o_r % HG
    m_r = o_t < T
    o_dv = tl.arange(0, BDV)

    b_pos = tl.load(pos + i_b).to(tl.int64)
    n_used = tl.minimum(b_pos + T, N)  # rows written: those before this call and its T new ones
    per = tl.cdiv(tl.cdiv(n_used, SPLITS), BN) * BN
    lo = i_s * per
    t_last = tl.minimum((i_m * BM + BM - 1) // HG, T - 1)  # keys past pos + t_last are masked here
    hi = tl.minimum(tl.minimum(lo + per, n_used), b_pos + t_last + 1)

    b_max = tl.full([BM], float("-inf"), dtype=tl.float32)
    b_sum = tl.zeros([BM], dtype=tl.float32)
    b_acc = tl.zeros([BM, BDV], dtype=tl.float32)
    for s0 in range(lo, hi, BN):
        o_s = s0 + tl.arange(0, BN).to(tl.int64)
        m_s = o_s < hi
        b_s = tl.zeros([BM, BN], dtype=tl.float32)
        for d0 in tl.static_range(0, BD1, BKD):  # q re-read per slice (cached), not held in registers
            o_d = d0 + tl.arange(0, BKD)
            m_d = o_d < D1
            b_q = tl.load(q1 + i_b * s_q1b + o_t[:, None] * s_q1t + o_h[:, None] * s_q1h + o_d[None, :],
                          mask=m_r[:, None] & m_d[None, :], other=0.)
            b_k = tl.load(k1 + i_b * s_k1b + o_s[None, :] * s_k1n + i_g * s_k1g + o_d[:, None],
                          mask=m_d[:, None] & m_s[None, :], other=0.)
            if DOT_F32:
                b_s = tl.dot(b_q.to(tl.float32), b_k.to(tl.float32), b_s, input_precision=PREC)
            else:
                b_s = tl.dot(b_q, b_k, b_s)
        if D2 > 0:
            o_d2 = tl.arange(0, BD2)
            b_q2 = tl.load(q2 + i_b * s_q2b + o_t[:, None] * s_q2t + o_h[:, None] * s_q2h + o_d2[None, :],
                           mask=m_r[:, None] & (o_d2 < D2)[None, :], other=0.)
            b_k2 = tl.load(k2 + i_b * s_k2b + o_s[None, :] * s_k2n + i_g * s_k2g + o_d2[:, None],
                           mask=(o_d2 < D2)[:, None] & m_s[None, :], other=0.)
            if DOT_F32:
                b_s = tl.dot(b_q2.to(tl.float32), b_k2.to(tl.float32), b_s, input_precision=PREC)
            else:
                b_s = tl.dot(b_q2, b_k2, b_s)
        m_vis = (o_s[None, :] <= b_pos + o_t[:, None]) & m_s[None, :]
        b_s = tl.where(m_vis, b_s * scale, float("-inf"))
        b_new = tl.maximum(b_max, tl.max(b_s, axis=1))
        b_ref = tl.where(b_new == float("-inf"), 0.0, b_new)  # a row that sees no key yet: exp(-inf) = 0
        b_p = tl.exp(b_s - b_ref[:, None])
        b_old = tl.exp(b_max - b_ref)
        b_sum = b_sum * b_old + tl.sum(b_p, axis=1)
        b_v = tl.load(v + i_b * s_vb + o_s[:, None] * s_vn + i_g * s_vg + o_dv[None, :],
                      mask=m_s[:, None] & (o_dv < DV)[None, :], other=0.)
        if DOT_F32:
            b_acc = b_acc * b_old[:, None] + tl.dot(b_p, b_v.to(tl.float32), input_precision=PREC)
        else:
            b_acc = b_acc * b_old[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        b_max = b_new
    m_o = m_r[:, None] & (o_dv < DV)[None, :]
    if DIRECT:  # one split: key 0 is in it and visible to every row, so b_sum > 0
        p_o = o + i_b * s_ob + o_t[:, None] * s_ot + o_h[:, None] * s_oh + o_dv[None, :]
        tl.store(p_o, (b_acc / b_sum[:, None]).to(o.dtype.element_ty), mask=m_o)
    else:  # partials [SPLITS, B, T, H, *] in the rows' (b, t, h) order
        o_p = ((i_s * B + i_b) * T + o_t) * H + o_h
        tl.store(part_acc + o_p[:, None] * DV + o_dv[None, :], b_acc, mask=m_o)
        tl.store(part_ml + o_p * 2, b_max, mask=m_r)
        tl.store(part_ml + o_p * 2 + 1, b_sum, mask=m_r)


@triton.jit
def cached_merge_kernel(part_acc, part_ml, o, s_ob, s_ot, s_oh, T, R, SPLITS, H: tl.constexpr, DV: tl.constexpr,
                        BDV: tl.constexpr):
    """One program a query row (b, t, h) of R = B T H: o = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s."""
    i_r = tl.program_id(0).to(tl.int64)
    i_b, i_t, i_h = i_r // (T * H), (i_r // H) % T, i_r % H
    b_top = tl.load(part_ml + i_r * 2)  # finite: split 0 holds key 0, visible to every row
    o_p = i_r + R  # int64: split s's row is s R + i_r, past 2^31 at large R
    for _ in range(1, SPLITS):
        b_top = tl.maximum(b_top, tl.load(part_ml + o_p * 2))
        o_p += R
    o_dv = tl.arange(0, BDV)
    b_acc = tl.zeros([BDV], dtype=tl.float32)
    b_sum = tl.zeros([1], dtype=tl.float32)
    o_p = i_r
    for _ in range(SPLITS):
        b_w = tl.exp(tl.load(part_ml + o_p * 2) - b_top)  # an empty split: exp(-inf) = 0, its acc is 0
        b_sum += b_w * tl.load(part_ml + o_p * 2 + 1)
        b_acc += b_w * tl.load(part_acc + o_p * DV + o_dv, mask=o_dv < DV, other=0.)
        o_p += R
    tl.store(o + i_b * s_ob + i_t * s_ot + i_h * s_oh + o_dv, (b_acc / b_sum).to(o.dtype.element_ty),
             mask=o_dv < DV)


def _tiles(rows: int, dv: int, fp32_dots: bool) -> tuple[int, int, int, int]:
    """(BM query rows, BN keys, num_warps, num_stages) of the split kernel. Up to 64 rows and
    keys for head widths up to 128. For absorbed MLA's 512-wide latent, what compiled for
    sm_90 without spills at K3's shapes (tests/triton/test_triton_serving_aot.py): 32 rows
    and 32 keys of 16-bit operands (165 registers), 16 and 16 of fp32 ones (3xTF32 keeps
    each operand twice: 32 rows spilled 40 bytes), 8 warps, 2 stages (3 asked for more
    shared memory than sm_90 has with fp32 operands)."""
    if INTERPRET:  # the interpreter's cost is per operation: large tiles
        return max(16, min(64, triton.next_power_of_2(rows))), 32, 4, 1
    if dv > 128:
        bm = 16 if fp32_dots else 32
        return bm, bm, 8, 2
    bm = max(16, min(64, triton.next_power_of_2(rows)))
    return bm, 32 if fp32_dots else 64, 4, 3


def choose_splits(n: int, programs: int, bn: int) -> int:
    """Splits of each sequence's keys: enough that a launch of `programs` (row blocks x
    sequences x key/value heads) programs fills the GPU, no more than the capacity has key
    blocks; one (no merge) once the rows alone fill it. Two under the interpreter (coverage
    of the merge at little cost)."""
    if INTERPRET:
        return max(1, min(2, triton.cdiv(n, bn)))
    return max(1, min(MAX_SPLITS, triton.cdiv(TARGET_PROGRAMS, programs), triton.cdiv(n, bn)))


def _bngd(x: torch.Tensor) -> tuple[int, int, int]:
    if x.stride(-1) != 1:
        raise InputError("cached_attention: the last dim of every operand must be contiguous")
    return x.stride(0), x.stride(1), x.stride(2)


def cached_attention(q1: torch.Tensor, k1: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float,
                     q2: torch.Tensor | None = None, k2: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None, splits: int | None = None) -> torch.Tensor:
    """o [B, T, H, DV] = softmax((q1 k1^T + q2 k2^T) * scale, masked to j <= positions[b] + t) v.

    q1 [B, T, H, D1], q2 [B, T, H, D2]; k1 [B, N, G, D1], k2 [B, N, G, D2], v [B, N, G, DV]
    (G divides H; views are fine when the last dim is contiguous); positions int64 [B], the
    rows each sequence held before these T tokens, whose rows are already in the cache.
    `splits` (None: chosen from the shapes) cuts each sequence's written rows into ranges."""
    check_device("cached_attention", q1, k1, v, q2, k2, positions)
    B, T, H, D1 = q1.shape
    N, G, DV = k1.shape[1], k1.shape[2], v.shape[-1]
    if positions.dtype != torch.int64:
        raise InputError(f"cached_attention: positions must be int64, got {positions.dtype}")
    if H % G or v.shape[:3] != k1.shape[:3] or positions.shape != (B,):
        raise InputError(f"cached_attention: q {tuple(q1.shape)}, k {tuple(k1.shape)}, v {tuple(v.shape)}, "
                         f"positions {tuple(positions.shape)} do not fit [B, T, H, D], [B, N, G, D], [B]")
    positions = positions.contiguous()  # the kernels read positions[b] at pos + b
    D2 = q2.shape[-1] if q2 is not None else 0
    q2_, k2_ = (q2, k2) if q2 is not None else (q1, k1)
    fp32_dots = dots_in_fp32(q1, k1, v)
    rows = T * (H // G)
    BM, BN, warps, stages = _tiles(rows, DV, fp32_dots)
    n_rows_m = triton.cdiv(rows, BM)
    S = splits or choose_splits(N, B * G * n_rows_m, BN)
    o = q1.new_empty(B, T, H, DV, dtype=out_dtype or v.dtype)
    if S > 1:  # fp32 partials [S, B, T, H, DV] and (max, sum) [S, B, T, H, 2]
        part_acc = torch.empty(S, B, T, H, DV, dtype=torch.float32, device=q1.device)
        part_ml = torch.empty(S, B, T, H, 2, dtype=torch.float32, device=q1.device)
    else:
        part_acc = part_ml = o
    cached_split_kernel[(B * G * n_rows_m, S)](
        q1, q2_, k1, k2_, v, positions, o, part_acc, part_ml, *_bngd(q1), *_bngd(q2_), *_bngd(k1), *_bngd(k2_),
        *_bngd(v), *_bngd(o), B, T, N, n_rows_m, S, float(scale), H=H, G=G, D1=D1, D2=D2, DV=DV, BD1=block(D1),
        BD2=block(max(D2, 1)), BDV=block(DV), BKD=min(BK, block(D1)), BM=BM, BN=BN, DIRECT=S == 1,
        DOT_F32=fp32_dots, PREC=dot_precision(), num_warps=warps, num_stages=stages)
    if S > 1:
        cached_merge_kernel[(B * T * H,)](part_acc, part_ml, o, *_bngd(o), T, B * T * H, S, H=H, DV=DV,
                                          BDV=block(DV), num_warps=4)
    return o


def causal_attention_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """The IR op `causal_attention_cached`: q [B, T, H, D], k [B, N, G, D], v [B, N, G, Dv],
    positions int64 [B] -> o [B, T, H, Dv] in v's dtype; the keys' rows of these T tokens
    are written already (cache_write before it)."""
    return cached_attention(q.contiguous(), k, v, positions, scale)
