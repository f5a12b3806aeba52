"""The chunked (WY/UT) delta rule as TensorIR kernels: the three IR ops `chunk_prepare`,
`chunk_state_scan` and `chunk_output` (definitions: k3c.kernels.delta.chunk).

`chunk_prepare` is three kernels, each parallel over (batch, head, chunk):
    chunk_gates   G = cumsum(g) in the chunk, in float64 (common.py); q exp(G),
                  k exp(G_last - G), k exp(G), exp(G_last) (every exponent <= 0)
    chunk_scores  L[i, j] = beta_i sum_d k_i k_j exp(G_i - G_j) (j < i) and
                  Aqk[i, j] = sum_d q_i k_j exp(G_i - G_j) (j <= i): the pairwise exponent,
                  masked before the exp, so nothing overflows under strong decay; for
                  per-channel gates and C > 16, `chunk_scores_channel` factors the pairs of
                  different sub-blocks through a pivot row (every exponent still <= 0)
    chunk_solve   W = (I + L)^-1 diag(beta) k exp(G) and U = (I + L)^-1 diag(beta) v, by
                  forward substitution row by row (never an inverse)
`chunk_state_scan` is one block per (batch, head) carrying S [K, V] over the NC chunks;
`chunk_output` is one block per (batch, head, chunk), rows past T dropped.

Time is padded to NC * C with zeros (k = v = g = beta = 0), as the reference does: inputs are
read through a bounds check. Gates: "channel" (KDA, g [B, T, H, K]), "head" (gated delta rule,
g [B, T, H], given as [B, T, H, 1]), "none" (delta rule: no g), "linear" (linear attention:
no beta either, A = I, w = 0). Kernels that take no g or beta are given a placeholder.
The loops over the feature columns run as vectors (llvm) or threads (cuda); the schedules
run the chunk blocks in parallel (llvm) or one per thread block (cuda).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from .common import _check, _decay_between, _decay_of
from .scores import PIVOT_ROWS, chunk_scores, chunk_scores_channel  # noqa: F401  (part of this module's API)


def chunk_gates(H: int, K: int, C: int, gate: str, target: str = "llvm") -> tirx.PrimFunc:
    """q, k [B, L, H, K], g [B, L, H, KD] -> q_dec, k_dec, k_w [B, H, NC, C, K], G [B, H, NC, C, KD]
    (float64), decay_last [B, H, NC, KD]; KD = K for channel gates, else 1."""
    _check(gate)
    KD = K if gate == "channel" else 1
    per_channel = 1 if gate == "channel" else 0
    gated = gate in ("channel", "head")
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, g_h: T.handle, qd_h: T.handle, kd_h: T.handle, kw_h: T.handle,
               G_h: T.handle, dl_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, K), "float32")
        k = T.match_buffer(k_h, (B, L, H, K), "float32")
        g = T.match_buffer(g_h, (B, L, H, KD), "float32")
        qd = T.match_buffer(qd_h, (B, H, (L + C - 1) // C, C, K), "float32")
        kd = T.match_buffer(kd_h, (B, H, (L + C - 1) // C, C, K), "float32")
        kw = T.match_buffer(kw_h, (B, H, (L + C - 1) // C, C, K), "float32")
        G = T.match_buffer(G_h, (B, H, (L + C - 1) // C, C, KD), "float64")
        dl = T.match_buffer(dl_h, (B, H, (L + C - 1) // C, KD), "float32")
        for b, h, n in T.grid(B, H, (L + C - 1) // C):
            with T.sblock("chunk"):
                vb, vh, vn = T.axis.remap("SSS", [b, h, n])
                T.reads(q[vb, 0:L, vh, 0:K], k[vb, 0:L, vh, 0:K], g[vb, 0:L, vh, 0:KD])
                T.writes(qd[vb, vh, vn, 0:C, 0:K], kd[vb, vh, vn, 0:C, 0:K], kw[vb, vh, vn, 0:C, 0:K],
                         G[vb, vh, vn, 0:C, 0:KD], dl[vb, vh, vn, 0:KD])
                run = T.alloc_buffer((KD,), "float64", scope=scratch(target))
                for d in range(KD):
                    run[d] = T.float64(0)
                for c in range(C):
                    for d in range(KD):
                        if gated:
                            run[d] = run[d] + T.Cast("float64", T.if_then_else(
                                vn * C + c < L, g[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0)))
                        G[vb, vh, vn, c, d] = run[d]
                for d in range(KD):
                    dl[vb, vh, vn, d] = _decay_of(run[d])
                for c in range(C):
                    for d in cols(K):
                        kd[vb, vh, vn, c, d] = T.if_then_else(
                            vn * C + c < L, k[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0)
                        ) * _decay_between(run[d * per_channel], G[vb, vh, vn, c, d * per_channel])
                        kw[vb, vh, vn, c, d] = T.if_then_else(
                            vn * C + c < L, k[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0)
                        ) * _decay_of(G[vb, vh, vn, c, d * per_channel])
                        qd[vb, vh, vn, c, d] = T.if_then_else(
                            vn * C + c < L, q[vb, T.min(vn * C + c, L - 1), vh, d], T.float32(0)
                        ) * _decay_of(G[vb, vh, vn, c, d * per_channel])

    return kernel


def chunk_solve(H: int, K: int, V: int, C: int, gate: str, target: str = "llvm") -> tirx.PrimFunc:
    """L_ [B, H, NC, C, C], k_w [B, H, NC, C, K], v [B, L, H, V], beta [B, L, H]
    -> w [B, H, NC, C, K], u [B, H, NC, C, V]: (I + L_) w = beta k_w, (I + L_) u = beta v."""
    _check(gate)
    delta = gate != "linear"
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(Lm_h: T.handle, kw_h: T.handle, v_h: T.handle, beta_h: T.handle, w_h: T.handle, u_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        Lm = T.match_buffer(Lm_h, (B, H, (L + C - 1) // C, C, C), "float32")
        kw = T.match_buffer(kw_h, (B, H, (L + C - 1) // C, C, K), "float32")
        v = T.match_buffer(v_h, (B, L, H, V), "float32")
        beta = T.match_buffer(beta_h, (B, L, H), "float32")
        w = T.match_buffer(w_h, (B, H, (L + C - 1) // C, C, K), "float32")
        u = T.match_buffer(u_h, (B, H, (L + C - 1) // C, C, V), "float32")
        for b, h, n in T.grid(B, H, (L + C - 1) // C):
            with T.sblock("chunk"):
                vb, vh, vn = T.axis.remap("SSS", [b, h, n])
                T.reads(Lm[vb, vh, vn, 0:C, 0:C], kw[vb, vh, vn, 0:C, 0:K], v[vb, 0:L, vh, 0:V], beta[vb, 0:L, vh])
                T.writes(w[vb, vh, vn, 0:C, 0:K], u[vb, vh, vn, 0:C, 0:V])
                for i in range(C):
                    for d in cols(K):
                        if delta:
                            w[vb, vh, vn, i, d] = kw[vb, vh, vn, i, d] * T.if_then_else(
                                vn * C + i < L, beta[vb, T.min(vn * C + i, L - 1), vh], T.float32(0))
                        else:
                            w[vb, vh, vn, i, d] = T.float32(0)
                    for d in cols(V):
                        u[vb, vh, vn, i, d] = T.if_then_else(vn * C + i < L, v[vb, T.min(vn * C + i, L - 1), vh, d],
                                                             T.float32(0))
                        if delta:
                            u[vb, vh, vn, i, d] = u[vb, vh, vn, i, d] * T.if_then_else(
                                vn * C + i < L, beta[vb, T.min(vn * C + i, L - 1), vh], T.float32(0))
                    if delta:
                        for m in range(i):
                            for d in cols(K):
                                w[vb, vh, vn, i, d] = w[vb, vh, vn, i, d] - Lm[vb, vh, vn, i, m] * w[vb, vh, vn, m, d]
                            for d in cols(V):
                                u[vb, vh, vn, i, d] = u[vb, vh, vn, i, d] - Lm[vb, vh, vn, i, m] * u[vb, vh, vn, m, d]

    return kernel


def chunk_state_scan(H: int, K: int, V: int, C: int, KD: int, target: str = "llvm") -> tirx.PrimFunc:
    """w, k_dec [B, H, NC, C, K], u [B, H, NC, C, V], decay_last [B, H, NC, KD], s0 [B, H, K, V]
    -> v_new [B, H, NC, C, V], starts [B, H, NC, K, V], s1 [B, H, K, V]."""
    per_channel = 1 if KD == K else 0
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(w_h: T.handle, u_h: T.handle, kd_h: T.handle, dl_h: T.handle, s0_h: T.handle, vn_h: T.handle,
               st_h: T.handle, s1_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, NC = T.int64(), T.int64()
        w = T.match_buffer(w_h, (B, H, NC, C, K), "float32")
        u = T.match_buffer(u_h, (B, H, NC, C, V), "float32")
        kd = T.match_buffer(kd_h, (B, H, NC, C, K), "float32")
        dl = T.match_buffer(dl_h, (B, H, NC, KD), "float32")
        s0 = T.match_buffer(s0_h, (B, H, K, V), "float32")
        vn = T.match_buffer(vn_h, (B, H, NC, C, V), "float32")
        st = T.match_buffer(st_h, (B, H, NC, K, V), "float32")
        s1 = T.match_buffer(s1_h, (B, H, K, V), "float32")
        for b, h in T.grid(B, H):
            with T.sblock("head"):
                vb, vh = T.axis.remap("SS", [b, h])
                T.reads(w[vb, vh, 0:NC, 0:C, 0:K], u[vb, vh, 0:NC, 0:C, 0:V], kd[vb, vh, 0:NC, 0:C, 0:K],
                        dl[vb, vh, 0:NC, 0:KD], s0[vb, vh, 0:K, 0:V])
                T.writes(vn[vb, vh, 0:NC, 0:C, 0:V], st[vb, vh, 0:NC, 0:K, 0:V], s1[vb, vh, 0:K, 0:V])
                S = T.alloc_buffer((K, V), "float32", scope=scratch(target))
                for i in range(K):
                    for j in cols(V):
                        S[i, j] = s0[vb, vh, i, j]
                for n in range(NC):
                    for i in range(K):
                        for j in cols(V):
                            st[vb, vh, n, i, j] = S[i, j]
                    for c in range(C):
                        for j in cols(V):
                            vn[vb, vh, n, c, j] = u[vb, vh, n, c, j]
                        for i in range(K):
                            for j in cols(V):
                                vn[vb, vh, n, c, j] = vn[vb, vh, n, c, j] - w[vb, vh, n, c, i] * S[i, j]
                    for i in range(K):
                        for j in cols(V):
                            S[i, j] = S[i, j] * dl[vb, vh, n, i * per_channel]
                        for c in range(C):
                            for j in cols(V):
                                S[i, j] = S[i, j] + kd[vb, vh, n, c, i] * vn[vb, vh, n, c, j]
                for i in range(K):
                    for j in cols(V):
                        s1[vb, vh, i, j] = S[i, j]

    return kernel


def chunk_output(H: int, K: int, V: int, C: int, scale: float, target: str = "llvm") -> tirx.PrimFunc:
    """q_dec [B, H, NC, C, K], aqk [B, H, NC, C, C], v_new [B, H, NC, C, V], starts [B, H, NC, K, V]
    -> o [B, L, H, V] = scale (q_dec starts + aqk v_new), rows past L dropped."""
    scale = float(scale)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(qd_h: T.handle, aqk_h: T.handle, vn_h: T.handle, st_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, NC, L = T.int64(), T.int64(), T.int64()
        qd = T.match_buffer(qd_h, (B, H, NC, C, K), "float32")
        aqk = T.match_buffer(aqk_h, (B, H, NC, C, C), "float32")
        vn = T.match_buffer(vn_h, (B, H, NC, C, V), "float32")
        st = T.match_buffer(st_h, (B, H, NC, K, V), "float32")
        o = T.match_buffer(o_h, (B, L, H, V), "float32")
        for b, h, n in T.grid(B, H, NC):
            with T.sblock("chunk"):
                vb, vh, vnc = T.axis.remap("SSS", [b, h, n])
                T.reads(qd[vb, vh, vnc, 0:C, 0:K], aqk[vb, vh, vnc, 0:C, 0:C], vn[vb, vh, vnc, 0:C, 0:V],
                        st[vb, vh, vnc, 0:K, 0:V])
                T.writes(o[vb, vnc * C: vnc * C + C, vh, 0:V])
                acc = T.alloc_buffer((V,), "float32", scope=scratch(target))
                for c in range(C):
                    if vnc * C + c < L:
                        for j in cols(V):
                            acc[j] = T.float32(0)
                        for i in range(K):
                            for j in cols(V):
                                acc[j] = acc[j] + qd[vb, vh, vnc, c, i] * st[vb, vh, vnc, i, j]
                        for m in range(c + 1):
                            for j in cols(V):
                                acc[j] = acc[j] + aqk[vb, vh, vnc, c, m] * vn[vb, vh, vnc, m, j]
                        for j in cols(V):
                            o[vb, vnc * C + c, vh, j] = acc[j] * T.float32(scale)

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    """Every chunk (or head) block in parallel."""
    for block in ("chunk", "head"):
        try:
            rv = sch.get_sblock(block)
        except s_tir.ScheduleError:
            continue
        sch.parallel(sch.fuse(*sch.get_loops(rv)))


def schedule_cuda(sch: s_tir.Schedule) -> None:
    """A thread block per chunk (or head)."""
    for block in ("chunk", "head"):
        try:
            rv = sch.get_sblock(block)
        except s_tir.ScheduleError:
            continue
        sch.bind(sch.fuse(*sch.get_loops(rv)), "blockIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
