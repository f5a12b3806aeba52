"""The CPU form of the split-key latent attention (kernels/cache/tvm.py `latent_split`): each
split scores a block of KEYS cache rows against every head at once, so that both products of a
decode step run in vectors over a contiguous axis.

    per (b, t, split), over its rows [start, end) below positions[b] + t + 1, KEYS at a time:
      s[k, h]  = scale * sum_d ckv_rope[row k, d] * q[h, d]     lanes over the H heads
      m[h]    <- max(m[h], max_k s[k, h]);  p[k, h] = exp(s[k, h] - m[h])
      acc[h,:] = acc[h,:] exp(m_old - m) + sum_k p[k, h] ckv[row k, :]   lanes over the latent dim

The scores take the heads as lanes because the H heads share the one latent key: one cache
value broadcast against a vector of H query entries is an FMA with no transpose of the cache
(laying the block out as [D, KEYS] would move every element it reads once more than the
score reads it). The values take the latent dim, contiguous in each row. A split's range is
cut from the valid rows, not from the capacity: the valid rows' blocks of KEYS are dealt to
the splits evenly (2 or 3 blocks each at 1025 rows over 16 splits), so the threads that run
the splits get equal work at any position. Rounding each split's share of rows up to whole
blocks instead gave 1025 rows 10 full splits and 6 idle ones: of two threads, one read three
times the rows of the other (0.27 against 0.07 ms a k3-small decode step). Rows past a
sequence's position are never read: a block's tail reads its last valid row again (no branch
in the inner loops) and its weights are set to 0.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..common.tvm import exp_vec, scratch

KEYS = 32  # cache rows per block: the block's rows (KEYS x (Dc + Dr) floats) stay in L1
GROUP = 8  # keys scored together: 8 independent FMA chains (4 left the FMA units waiting on
# each one's latency: 8.7 ms against 12.8 ms for one 64k-row layer), one query load for 8 FMAs
NEG = -3.0e38


def latent_split_blocked(H: int, Dc: int, Dr: int, scale: float, S: int, keys: int = KEYS,
                         group: int = GROUP) -> tirx.PrimFunc:
    """q [B, L, H, Dc + Dr], ckv [B, N, Dc], krope [B, N, Dr], positions [B]
    -> acc [B, L, S, H, Dc], stats [B, L, S, H, 2]: as `latent_split`, for llvm; `keys` rows a
    block, `group` keys scored together (32 and 8 ran fastest of 32/64/128 x 8/16 at 64k rows).
    N is any: a fixed cache's capacity, or a growing cache's rows (a decode step's positions
    then being N - 1)."""
    Dk, KB, G = Dc + Dr, keys, group
    assert KB % G == 0, "a block holds whole groups of keys"
    Sc = T.int64(S)

    @T.prim_func
    def kernel(q_h: T.handle, c_h: T.handle, r_h: T.handle, p_h: T.handle, a_h: T.handle, s_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})  # 8: opaque
        B, L, Nc = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, Dk), "float32")
        ckv = T.match_buffer(c_h, (B, Nc, Dc), "float32")
        krope = T.match_buffer(r_h, (B, Nc, Dr), "float32")
        pos = T.match_buffer(p_h, (B,), "int64")
        acc_o = T.match_buffer(a_h, (B, L, Sc, H, Dc), "float32")
        st_o = T.match_buffer(s_h, (B, L, Sc, H, 2), "float32")
        for w in T.parallel(B * L * Sc):
            qt = T.decl_buffer((Dk, H), "float32", scope=scratch("llvm"))  # the query, heads innermost
            sc = T.decl_buffer((KB, H), "float32", scope=scratch("llvm"))  # the block's scores, then weights
            acc = T.decl_buffer((H, Dc), "float32", scope=scratch("llvm"))
            m = T.decl_buffer((3, H), "float32", scope=scratch("llvm"))  # running max, running sum, rescale
            o = T.decl_buffer((Dc,), "float32", scope=scratch("llvm"))  # one head's values of a block
            b: T.let = w // (L * Sc)
            t: T.let = w // Sc % L
            sp: T.let = w % Sc
            valid: T.let = T.min(pos[b] + t + T.int64(1), Nc)
            blocks: T.let = (valid + T.int64(KB - 1)) // T.int64(KB)
            start: T.let = sp * blocks // Sc * T.int64(KB)
            end: T.let = T.min((sp + T.int64(1)) * blocks // Sc * T.int64(KB), valid)
            for d, h in T.grid(Dk, H):
                qt[d, h] = q[b, t, h, d]
            for h in T.vectorized(H):
                m[0, h] = T.float32(NEG)
                m[1, h] = T.float32(0)
            for h in range(H):
                for j in T.vectorized(Dc):
                    acc[h, j] = T.float32(0)
            for blk in range((T.max(end - start, T.int64(0)) + T.int64(KB - 1)) // T.int64(KB)):
                r0: T.let = start + blk * T.int64(KB)
                for k4 in range(KB // G):
                    s4 = T.decl_buffer((G, H), "float32", scope=scratch("llvm"))
                    for i in T.unroll(G):
                        for h in T.vectorized(H):
                            s4[i, h] = T.float32(0)
                    for d in range(Dc):
                        for i in T.unroll(G):
                            for h in T.vectorized(H):
                                s4[i, h] = s4[i, h] + ckv[b, T.min(r0 + k4 * G + i, end - T.int64(1)), d] * qt[d, h]
                    for d in range(Dr):
                        for i in T.unroll(G):
                            for h in T.vectorized(H):
                                s4[i, h] = s4[i, h] + krope[b, T.min(r0 + k4 * G + i, end - T.int64(1)), d] * qt[
                                    Dc + d, h]
                    for i in T.unroll(G):
                        for h in T.vectorized(H):
                            sc[k4 * G + i, h] = T.Select(r0 + k4 * G + i < end, s4[i, h] * T.float32(scale),
                                                         T.float32(NEG))
                for h in T.vectorized(H):
                    m[2, h] = m[0, h]  # the old max, until the rescale below
                for k in range(KB):
                    for h in T.vectorized(H):
                        m[0, h] = T.max(m[0, h], sc[k, h])
                for k in range(KB):
                    for h in T.vectorized(H):
                        sc[k, h] = T.Select(r0 + k < end, exp_vec(sc[k, h] - m[0, h]), T.float32(0))
                for h in T.vectorized(H):
                    m[2, h] = exp_vec(m[2, h] - m[0, h])  # 0 (to 1e-38, times an empty sum) at the first block
                    m[1, h] = m[1, h] * m[2, h]
                for k in range(KB):
                    for h in T.vectorized(H):
                        m[1, h] = m[1, h] + sc[k, h]
                for h in range(H):
                    for j in T.vectorized(Dc):
                        o[j] = acc[h, j] * m[2, h]
                    for k in range(KB):
                        for j in T.vectorized(Dc):
                            o[j] = o[j] + sc[k, h] * ckv[b, T.min(r0 + k, end - T.int64(1)), j]
                    for j in T.vectorized(Dc):
                        acc[h, j] = o[j]
            for h in range(H):
                st_o[b, t, sp, h, 0] = m[0, h]
                st_o[b, t, sp, h, 1] = m[1, h]
                for j in T.vectorized(Dc):
                    acc_o[b, t, sp, h, j] = acc[h, j]

    return kernel
