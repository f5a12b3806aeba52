"""Fixed-capacity cache kernels in TensorIR: the in-place row write and MLA's absorbed
attention over the valid rows of each sequence (split over key ranges, flash-decoding).

    cache_write:  cache[b, positions[b] + t, :] = new[b, t, :]      (in place: call_tir_inplace)
    latent_split: per (b, t, split) one block walks its share of the N cache rows, only those
                  below positions[b] + t + 1, scoring every head against each row it loads
                  (the H heads share the one latent key/value head): partial running max,
                  sum and o[h, Dc] per split
    latent_merge: o[b, t, h] = sum over splits, each rescaled to the common max

A step reads each valid cache row once, whatever the capacity N; rows past a sequence's
position are skipped, never read. Splits give the cores work at B = T = 1. `latent_split`
here is the form for cuda (a thread block a split, the latent dim over its threads); on llvm
the backend takes `latent_split_blocked` (tvm_blocked.py), which scores blocks of keys in
vectors: this one's scalar dot product a key and head ran 20 times slower at 64k rows.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ..common.tvm import inner_loop, scratch

SPLITS = 16  # key ranges per (b, t): parallel work for a decode step, merged after
NEG = -3.0e38  # the running max before any key: exp(NEG - m) = 0


def cache_write(C: int, N: int) -> tirx.PrimFunc:
    """cache [B, N, C] (written in place), new [B, L, C], positions int64 [B]."""

    @T.prim_func(s_tir=True)
    def kernel(c_h: T.handle, n_h: T.handle, p_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        cache = T.match_buffer(c_h, (B, N, C), "float32")
        new = T.match_buffer(n_h, (B, L, C), "float32")
        pos = T.match_buffer(p_h, (B,), "int64")
        for b, t in T.grid(B, L):
            with T.sblock("write"):
                vb, vt = T.axis.remap("SS", [b, t])
                T.reads(new[vb, vt, 0:C], pos[vb])
                T.writes(cache[vb, 0:N, 0:C])
                for c in range(C):
                    cache[vb, pos[vb] + vt, c] = new[vb, vt, c]

    return kernel


def latent_split(H: int, Dc: int, Dr: int, N: int, scale: float, target: str = "llvm",
                 S: int = SPLITS) -> tirx.PrimFunc:
    """q [B, L, H, Dc + Dr] (absorbed queries), ckv [B, N, Dc], krope [B, N, Dr], positions [B]
    -> acc [B, L, S, H, Dc], stats [B, L, S, H, 2] (running max, running sum) per split."""
    scale = float(scale)
    chunk = (N + S - 1) // S
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, c_h: T.handle, r_h: T.handle, p_h: T.handle, a_h: T.handle, s_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, Dc + Dr), "float32")
        ckv = T.match_buffer(c_h, (B, N, Dc), "float32")
        krope = T.match_buffer(r_h, (B, N, Dr), "float32")
        pos = T.match_buffer(p_h, (B,), "int64")
        acc_o = T.match_buffer(a_h, (B, L, S, H, Dc), "float32")
        st_o = T.match_buffer(s_h, (B, L, S, H, 2), "float32")
        for b, t, sp in T.grid(B, L, S):
            with T.sblock("split"):
                vb, vt, vs = T.axis.remap("SSS", [b, t, sp])
                T.reads(q[vb, vt, 0:H, 0:Dc + Dr], ckv[vb, 0:N, 0:Dc], krope[vb, 0:N, 0:Dr], pos[vb])
                T.writes(acc_o[vb, vt, vs, 0:H, 0:Dc], st_o[vb, vt, vs, 0:H, 0:2])
                acc = T.alloc_buffer((H, Dc), "float32", scope=scratch(target))
                st = T.alloc_buffer((H, 4), "float32", scope=scratch(target))  # max, sum, score, rescale
                for h in range(H):
                    st[h, 0] = T.float32(NEG)
                    st[h, 1] = T.float32(0)
                    for j in cols(Dc):
                        acc[h, j] = T.float32(0)
                for s in range(chunk):
                    if T.Cast("int64", vs * chunk + s) < T.min(pos[vb] + vt + T.int64(1), T.int64(N)):  # a valid row
                        for h in range(H):
                            st[h, 2] = T.float32(0)
                            for d in range(Dc):
                                st[h, 2] = st[h, 2] + q[vb, vt, h, d] * ckv[vb, vs * chunk + s, d]
                            for d in range(Dr):
                                st[h, 2] = st[h, 2] + q[vb, vt, h, Dc + d] * krope[vb, vs * chunk + s, d]
                            st[h, 2] = st[h, 2] * T.float32(scale)
                            st[h, 3] = T.max(st[h, 0], st[h, 2])  # the new max
                            st[h, 1] = st[h, 1] * T.exp(st[h, 0] - st[h, 3]) + T.exp(st[h, 2] - st[h, 3])
                            for j in cols(Dc):
                                acc[h, j] = acc[h, j] * T.exp(st[h, 0] - st[h, 3]) + T.exp(
                                    st[h, 2] - st[h, 3]) * ckv[vb, vs * chunk + s, j]
                            st[h, 0] = st[h, 3]
                for h in range(H):
                    st_o[vb, vt, vs, h, 0] = st[h, 0]
                    st_o[vb, vt, vs, h, 1] = st[h, 1]
                    for j in cols(Dc):
                        acc_o[vb, vt, vs, h, j] = acc[h, j]

    return kernel


def last_positions(Dr: int) -> tirx.PrimFunc:
    """krope [B, N, Dr] -> positions int64 [B] = N - 1: a growing cache's decode step (its new
    row is the last of the N), as the split kernels take it. Reads only krope's shape."""

    @T.prim_func
    def kernel(r_h: T.handle, p_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})  # 8: opaque
        B, N = T.int64(), T.int64()
        T.match_buffer(r_h, (B, N, Dr), "float32")
        pos = T.match_buffer(p_h, (B,), "int64")
        for b in range(B):
            pos[b] = N - T.int64(1)

    return kernel


def latent_merge(H: int, Dc: int, target: str = "llvm", S: int = SPLITS) -> tirx.PrimFunc:
    """acc [B, L, S, H, Dc], stats [B, L, S, H, 2] -> o [B, L, H, Dc]: the splits combined."""
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(a_h: T.handle, s_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        acc = T.match_buffer(a_h, (B, L, S, H, Dc), "float32")
        st = T.match_buffer(s_h, (B, L, S, H, 2), "float32")
        o = T.match_buffer(o_h, (B, L, H, Dc), "float32")
        for b, t, h in T.grid(B, L, H):
            with T.sblock("merge"):
                vb, vt, vh = T.axis.remap("SSS", [b, t, h])
                T.reads(acc[vb, vt, 0:S, vh, 0:Dc], st[vb, vt, 0:S, vh, 0:2])
                T.writes(o[vb, vt, vh, 0:Dc])
                m = T.alloc_buffer((3,), "float32", scope=scratch(target))  # max, sum, split weight
                out = T.alloc_buffer((Dc,), "float32", scope=scratch(target))
                m[0] = T.float32(NEG)
                m[1] = T.float32(0)
                for j in cols(Dc):
                    out[j] = T.float32(0)
                for s in range(S):
                    m[0] = T.max(m[0], st[vb, vt, s, vh, 0])
                for s in range(S):
                    m[2] = T.exp(st[vb, vt, s, vh, 0] - m[0])  # 0 for a split with no valid row
                    m[1] = m[1] + st[vb, vt, s, vh, 1] * m[2]
                    for j in cols(Dc):
                        out[j] = out[j] + acc[vb, vt, s, vh, j] * m[2]
                for j in cols(Dc):
                    o[vb, vt, vh, j] = out[j] / m[1]

    return kernel


def _parallel(block: str):
    def llvm(sch: s_tir.Schedule) -> None:
        sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock(block))))

    def cuda(sch: s_tir.Schedule) -> None:
        sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock(block))), "blockIdx.x")

    return {"llvm": llvm, "cuda": cuda}


WRITE_SCHEDULES = _parallel("write")
SPLIT_SCHEDULES = _parallel("split")
MERGE_SCHEDULES = _parallel("merge")
