"""The intra-chunk scores of the chunked delta rule as TensorIR kernels (see chunk.py):
L[i, j] = beta_i sum_d k_i k_j exp(G_i - G_j) (j < i) and Aqk[i, j] = sum_d q_i k_j exp(G_i - G_j)
(j <= i), the pairwise exponent masked before the exp; for per-channel gates the pairs of
different sub-blocks factor through a pivot row (`chunk_scores_channel`)."""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from .common import _check, _decay_between


def chunk_scores(H: int, K: int, C: int, gate: str, target: str = "llvm") -> tirx.PrimFunc:
    """q, k [B, L, H, K], beta [B, L, H], G [B, H, NC, C, KD] (float64) -> L_ [B, H, NC, C, C] (beta_i kk, j < i),
    aqk [B, H, NC, C, C] (j <= i)."""
    _check(gate)
    if gate == "channel" and C > PIVOT_ROWS and C % PIVOT_ROWS == 0:
        return chunk_scores_channel(H, K, C, target)
    KD = K if gate == "channel" else 1
    channel = gate == "channel"
    head = gate == "head"
    delta = gate != "linear"
    cols = inner_loop(target)
    shared = "shared" if target == "cuda" else scratch(target)  # the chunk's keys are read across columns

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, beta_h: T.handle, G_h: T.handle, Lm_h: T.handle, aqk_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, K), "float32")
        k = T.match_buffer(k_h, (B, L, H, K), "float32")
        beta = T.match_buffer(beta_h, (B, L, H), "float32")
        G = T.match_buffer(G_h, (B, H, (L + C - 1) // C, C, KD), "float64")
        Lm = T.match_buffer(Lm_h, (B, H, (L + C - 1) // C, C, C), "float32")
        aqk = T.match_buffer(aqk_h, (B, H, (L + C - 1) // C, C, C), "float32")
        for b, h, n in T.grid(B, H, (L + C - 1) // C):
            with T.sblock("chunk"):
                vb, vh, vn = T.axis.remap("SSS", [b, h, n])
                T.reads(q[vb, 0:L, vh, 0:K], k[vb, 0:L, vh, 0:K], beta[vb, 0:L, vh], G[vb, vh, vn, 0:C, 0:KD])
                T.writes(Lm[vb, vh, vn, 0:C, 0:C], aqk[vb, vh, vn, 0:C, 0:C])
                # the chunk's keys and cumulative gates, transposed so that a row of scores is
                # contiguous; zero-padded past L
                kT = T.alloc_buffer((K, C), "float32", scope=shared)
                GT = T.alloc_buffer((KD, C), "float64", scope=shared)
                kk = T.alloc_buffer((C,), "float32", scope=scratch(target))
                qk = T.alloc_buffer((C,), "float32", scope=scratch(target))
                e = T.alloc_buffer((C,), "float32", scope=scratch(target))
                for d in range(K):
                    for c in cols(C):
                        kT[d, c] = T.if_then_else(vn * C + c < L, k[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0))
                for d in range(KD):
                    for c in cols(C):
                        GT[d, c] = G[vb, vh, vn, c, d]
                for i in range(C):
                    for j in cols(C):
                        kk[j] = T.float32(0)
                        qk[j] = T.float32(0)
                    for d in range(K):
                        for j in cols(C):
                            if channel:  # exp(G_i - G_j), its exponent <= 0 where j <= i, masked elsewhere
                                e[j] = T.Select(j <= i, _decay_between(GT[d, i], GT[d, j]),
                                                T.float32(0))
                                kk[j] = kk[j] + kT[d, i] * kT[d, j] * e[j]
                                qk[j] = qk[j] + T.if_then_else(
                                    vn * C + i < L, q[vb, T.min(vn * C + i, L - 1), vh, d], T.float32(0)
                                ) * kT[d, j] * e[j]
                            else:
                                kk[j] = kk[j] + kT[d, i] * kT[d, j]
                                qk[j] = qk[j] + T.if_then_else(
                                    vn * C + i < L, q[vb, T.min(vn * C + i, L - 1), vh, d], T.float32(0)) * kT[d, j]
                    for j in cols(C):
                        if head:
                            e[j] = _decay_between(GT[0, i], GT[0, j])
                            kk[j] = kk[j] * e[j]
                            qk[j] = qk[j] * e[j]
                        if delta:
                            Lm[vb, vh, vn, i, j] = T.if_then_else(j < i, T.if_then_else(
                                vn * C + i < L, beta[vb, T.min(vn * C + i, L - 1), vh], T.float32(0)) * kk[j],
                                T.float32(0))
                        else:
                            Lm[vb, vh, vn, i, j] = T.float32(0)
                        aqk[vb, vh, vn, i, j] = T.if_then_else(j <= i, qk[j], T.float32(0))

    return kernel


PIVOT_ROWS = 16  # rows per sub-block of chunk_scores_channel


def chunk_scores_channel(H: int, K: int, C: int, target: str = "llvm", S: int = PIVOT_ROWS) -> tirx.PrimFunc:
    """`chunk_scores` for per-channel gates (KDA) with fewer exps: the chunk is cut into
    sub-blocks of S rows, and a score between rows i and j of different sub-blocks factors
    through the first row p of i's sub-block,

        exp(G_i - G_j) = exp(G_i - G_p) exp(G_p - G_j),      j < p <= i,

    where both exponents are <= 0 (G only falls), so each factor is a decay of its own row:
    C x K exps for the rows, S x K x C for the columns per sub-block, and the scores are
    plain dot products of decayed rows. Pairs inside one sub-block keep the exact pairwise
    exponent. About 3.5x fewer exps than the pairwise form at C = 64, S = 16."""
    if C % S:
        raise ValueError(f"chunk size {C} is not a multiple of the sub-block {S}")
    NS = C // S
    cols = inner_loop(target)
    shared = "shared" if target == "cuda" else scratch(target)
    local = scratch(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, beta_h: T.handle, G_h: T.handle, Lm_h: T.handle, aqk_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, K), "float32")
        k = T.match_buffer(k_h, (B, L, H, K), "float32")
        beta = T.match_buffer(beta_h, (B, L, H), "float32")
        G = T.match_buffer(G_h, (B, H, (L + C - 1) // C, C, K), "float64")
        Lm = T.match_buffer(Lm_h, (B, H, (L + C - 1) // C, C, C), "float32")
        aqk = T.match_buffer(aqk_h, (B, H, (L + C - 1) // C, C, C), "float32")
        for b, h, n in T.grid(B, H, (L + C - 1) // C):
            with T.sblock("chunk"):
                vb, vh, vn = T.axis.remap("SSS", [b, h, n])
                T.reads(q[vb, 0:L, vh, 0:K], k[vb, 0:L, vh, 0:K], beta[vb, 0:L, vh], G[vb, vh, vn, 0:C, 0:K])
                T.writes(Lm[vb, vh, vn, 0:C, 0:C], aqk[vb, vh, vn, 0:C, 0:C])
                kT = T.alloc_buffer((K, C), "float32", scope=shared)  # keys, transposed, zero past L
                GT = T.alloc_buffer((K, C), "float64", scope=shared)  # cumulative gates, transposed
                qT = T.alloc_buffer((K, C), "float32", scope=shared)  # queries, transposed, zero past L
                bT = T.alloc_buffer((K, C), "float32", scope=shared)  # k_j exp(G_p - G_j), j < p
                kk = T.alloc_buffer((C,), "float32", scope=local)
                qk = T.alloc_buffer((C,), "float32", scope=local)
                e = T.alloc_buffer((S,), "float32", scope=local)
                rk = T.alloc_buffer((K,), "float32", scope=local)  # a row's key and query, decayed to the pivot
                rq = T.alloc_buffer((K,), "float32", scope=local)
                for d in range(K):
                    for c in cols(C):
                        kT[d, c] = T.if_then_else(vn * C + c < L, k[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0))
                        qT[d, c] = T.if_then_else(vn * C + c < L, q[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0))
                        GT[d, c] = G[vb, vh, vn, c, d]
                for blk in range(NS):
                    for d in range(K):
                        for j in cols(C):
                            bT[d, j] = T.Select(j < blk * S, kT[d, j] * _decay_between(GT[d, blk * S], GT[d, j]),
                                                T.float32(0))
                    for ii in range(S):
                        for j in cols(C):
                            kk[j] = T.float32(0)
                            qk[j] = T.float32(0)
                        for d in cols(K):  # the row's decays to the pivot, once per row (not per column)
                            rk[d] = kT[d, blk * S + ii] * _decay_between(GT[d, blk * S + ii], GT[d, blk * S])
                            rq[d] = qT[d, blk * S + ii] * _decay_between(GT[d, blk * S + ii], GT[d, blk * S])
                        for d in range(K):
                            for j in cols(C):  # the earlier sub-blocks, through the pivot
                                kk[j] = kk[j] + rk[d] * bT[d, j]
                                qk[j] = qk[j] + rq[d] * bT[d, j]
                        for d in range(K):
                            for jj in cols(S):  # the row's own sub-block: the exact pairwise exponent
                                e[jj] = T.Select(jj <= ii, _decay_between(GT[d, blk * S + ii], GT[d, blk * S + jj]),
                                                 T.float32(0))
                                kk[blk * S + jj] = kk[blk * S + jj] + kT[d, blk * S + ii] * kT[d, blk * S + jj] * e[jj]
                                qk[blk * S + jj] = qk[blk * S + jj] + qT[d, blk * S + ii] * kT[d, blk * S + jj] * e[jj]
                        for j in cols(C):
                            Lm[vb, vh, vn, blk * S + ii, j] = T.if_then_else(j < blk * S + ii, T.if_then_else(
                                vn * C + blk * S + ii < L, beta[vb, T.min(vn * C + blk * S + ii, L - 1), vh],
                                T.float32(0)) * kk[j], T.float32(0))
                            aqk[vb, vh, vn, blk * S + ii, j] = T.if_then_else(j <= blk * S + ii, qk[j], T.float32(0))

    return kernel
