"""Causal softmax attention over a cache as a TensorIR kernel (online softmax over key blocks).

    o[b, t, h] = sum_s softmax_s(scale q[b, t, h] . k[b, s, g]) v[b, s, g],  s <= S - L + t

with g = h // (H / G): G key/value heads serve H query heads (G = H for plain attention,
G = 1 for MLA's absorbed form, where the latent cache is the one key/value head). Keys come
transposed and padded by KB zero keys, kT [B, G, D, S + KB], so that the scores of a block
of KB keys are one contiguous vector per query feature. One block per R query rows of a head
keeps each row's running max, running sum and Dv accumulators and streams the keys the
last of its rows sees once, a key block at a time (one rescale per block and row). On the
CPU a head's keys and values outgrow the L2 cache, so a row at a time was bound by reading
them again for every row; R = 4 rows share each load (k3-small's MLA prefill: 59 -> 32 ms
per layer). The key-block loops run as vectors on llvm (serially on cuda) and the Dv feature
loops as vectors (llvm) or threads (cuda). Schedules: llvm runs the row tiles in parallel;
cuda gives each row (R = 1) a thread block.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import exp_vec, inner_loop, scratch

KEY_BLOCK = 32  # keys per block; the transposed keys come padded by this many
ROWS = 4  # query rows per block on llvm: each key and value loaded serves this many
NEG = -3.0e38  # a score no key reaches: masked keys get exp(NEG - max) = 0, never inf - inf


def causal_attention(H: int, G: int, D: int, Dv: int, scale: float, target: str = "llvm",
                     KB: int = KEY_BLOCK, R: int | None = None, cached: bool = False) -> tirx.PrimFunc:
    """q [B, L, H, D], kT [B, G, D, S + KB], v [B, S, G, Dv] -> o [B, L, H, Dv]; float32, S >= L.

    Each block owns R consecutive query rows of one head (ROWS on llvm, 1 on cuda): every key
    and value vector it loads serves the R rows. Rows past L compute row L - 1 again and are
    not written.

    `cached`: the keys and values are a fixed-capacity cache of S rows and the kernel takes
    positions int64 [B] after v: row t of sequence b sees keys <= positions[b] + t (clamped to
    [0, S - L], so no read leaves the buffers) instead of S - L + t. Only the key blocks below
    the tile's last visible key are read, and a value row past the last one written
    (positions[b] + L - 1, which may hold anything: a NaN times a zero weight is NaN) is
    selected to 0."""
    if H % G:
        raise ValueError(f"{H} query heads cannot share {G} key/value heads")
    group = H // G
    scale = float(scale)
    cols = inner_loop(target)
    keys = T.vectorized if target == "llvm" else T.serial
    R = R or (ROWS if target == "llvm" else 1)

    @T.macro
    def rows(q, kT, v, o, vb, vh, vtile, off, L, S):
        """Row tile `vtile` of head `vh` of sequence `vb`; row t sees keys <= off + t."""
        acc = T.alloc_buffer((R, Dv), "float32", scope=scratch(target))
        sc = T.alloc_buffer((R, KB), "float32", scope=scratch(target))  # the block's scores, then weights
        # per row: running max, running sum, block max, rescale of the old terms
        st = T.alloc_buffer((R, 4), "float32", scope=scratch(target))
        for r in T.unroll(R):
            st[r, 0] = T.float32(NEG)
            st[r, 1] = T.float32(0)
            for j in cols(Dv):
                acc[r, j] = T.float32(0)
        # the keys the tile's last row sees; its other rows mask the ones past theirs
        for blk in range((off + T.min(vtile * R + R - 1, L - 1) + KB) // KB):
            for r in T.unroll(R):
                for s in keys(KB):
                    sc[r, s] = T.float32(0)
            for d in range(D):
                for r in T.unroll(R):
                    for s in keys(KB):
                        sc[r, s] = sc[r, s] + q[vb, T.min(vtile * R + r, L - 1), vh, d] * kT[
                            vb, vh // group, d, blk * KB + s]
            for r in T.unroll(R):
                for s in keys(KB):
                    sc[r, s] = T.Select(blk * KB + s <= off + T.min(vtile * R + r, L - 1),
                                        sc[r, s] * T.float32(scale), T.float32(NEG))
                st[r, 2] = sc[r, 0]
                for s in range(1, KB):
                    st[r, 2] = T.max(st[r, 2], sc[r, s])
                st[r, 3] = T.exp(st[r, 0] - T.max(st[r, 0], st[r, 2]))
                st[r, 0] = T.max(st[r, 0], st[r, 2])
                for s in keys(KB):  # exp_vec stays in vectors; masked keys weigh exactly 0
                    sc[r, s] = T.Select(sc[r, s] - st[r, 0] < T.float32(-87.0), T.float32(0),
                                        exp_vec(sc[r, s] - st[r, 0]))
                st[r, 1] = st[r, 1] * st[r, 3]
                for s in range(KB):
                    st[r, 1] = st[r, 1] + sc[r, s]
                for j in cols(Dv):
                    acc[r, j] = acc[r, j] * st[r, 3]
            for s in range(KB):
                for r in T.unroll(R):
                    for j in cols(Dv):
                        if cached:  # rows past the last written one may hold anything
                            acc[r, j] = acc[r, j] + sc[r, s] * T.Select(
                                blk * KB + s < off + L, v[vb, T.min(blk * KB + s, S - 1), vh // group, j],
                                T.float32(0))
                        else:
                            acc[r, j] = acc[r, j] + sc[r, s] * v[vb, T.min(blk * KB + s, S - 1), vh // group, j]
        for r in T.unroll(R):
            if vtile * R + r < L:
                for j in cols(Dv):
                    o[vb, vtile * R + r, vh, j] = acc[r, j] / st[r, 1]

    if cached:
        @T.prim_func(s_tir=True)
        def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, p_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            B, L, S = T.int64(), T.int64(), T.int64()
            q = T.match_buffer(q_h, (B, L, H, D), "float32")
            kT = T.match_buffer(k_h, (B, G, D, S + KB), "float32")
            v = T.match_buffer(v_h, (B, S, G, Dv), "float32")
            p = T.match_buffer(p_h, (B,), "int64")
            o = T.match_buffer(o_h, (B, L, H, Dv), "float32")
            for b, h, tile in T.grid(B, H, (L + R - 1) // R):
                with T.sblock("rows"):
                    vb, vh, vtile = T.axis.remap("SSS", [b, h, tile])
                    T.reads(q[vb, 0:L, vh, 0:D], kT[vb, vh // group, 0:D, 0:S + KB], v[vb, 0:S, vh // group, 0:Dv],
                            p[vb])
                    T.writes(o[vb, 0:L, vh, 0:Dv])
                    rows(q, kT, v, o, vb, vh, vtile, T.max(T.min(p[vb], S - L), T.int64(0)), L, S)
    else:
        @T.prim_func(s_tir=True)
        def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            B, L, S = T.int64(), T.int64(), T.int64()
            q = T.match_buffer(q_h, (B, L, H, D), "float32")
            kT = T.match_buffer(k_h, (B, G, D, S + KB), "float32")
            v = T.match_buffer(v_h, (B, S, G, Dv), "float32")
            o = T.match_buffer(o_h, (B, L, H, Dv), "float32")
            for b, h, tile in T.grid(B, H, (L + R - 1) // R):
                with T.sblock("rows"):
                    vb, vh, vtile = T.axis.remap("SSS", [b, h, tile])
                    T.reads(q[vb, 0:L, vh, 0:D], kT[vb, vh // group, 0:D, 0:S + KB], v[vb, 0:S, vh // group, 0:Dv])
                    T.writes(o[vb, 0:L, vh, 0:Dv])
                    rows(q, kT, v, o, vb, vh, vtile, S - L, L, S)

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("rows"))))


def schedule_cuda(sch: s_tir.Schedule) -> None:
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("rows"))), "blockIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
