"""Causal softmax attention over a cache as a TensorIR kernel (online softmax over key blocks).

    o[b, t, h] = sum_s softmax_s(scale q[b, t, h] . k[b, s, g]) v[b, s, g],  s <= S - L + t

with g = h // (H / G): G key/value heads serve H query heads (G = H for plain attention,
G = 1 for MLA's absorbed form, where the latent cache is the one key/value head). Keys come
transposed and padded by KB zero keys, kT [B, G, D, S + KB], so that the scores of a block
of KB keys are one contiguous vector per query feature. One block per query row keeps the
running max, the running sum and the Dv accumulators in registers and streams the visible
keys once, a key block at a time (one rescale per block). The key-block loops run as
vectors on llvm (serially on cuda) and the Dv feature loops as vectors (llvm) or threads
(cuda). Schedules: llvm runs the rows in parallel; cuda gives each row a thread block.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import exp_vec, inner_loop

KEY_BLOCK = 32  # keys per block; the transposed keys come padded by this many
NEG = -3.0e38  # a score no key reaches: masked keys get exp(NEG - max) = 0, never inf - inf


def causal_attention(H: int, G: int, D: int, Dv: int, scale: float, target: str = "llvm",
                     KB: int = KEY_BLOCK) -> tirx.PrimFunc:
    """q [B, L, H, D], kT [B, G, D, S + KB], v [B, S, G, Dv] -> o [B, L, H, Dv]; float32, S >= L."""
    if H % G:
        raise ValueError(f"{H} query heads cannot share {G} key/value heads")
    group = H // G
    scale = float(scale)
    cols = inner_loop(target)
    keys = T.vectorized if target == "llvm" else T.serial

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L, S = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, D), "float32")
        kT = T.match_buffer(k_h, (B, G, D, S + KB), "float32")
        v = T.match_buffer(v_h, (B, S, G, Dv), "float32")
        o = T.match_buffer(o_h, (B, L, H, Dv), "float32")
        for b, t, h in T.grid(B, L, H):
            with T.sblock("row"):
                vb, vt, vh = T.axis.remap("SSS", [b, t, h])
                T.reads(q[vb, vt, vh, 0:D], kT[vb, vh // group, 0:D, 0:S + KB], v[vb, 0:S, vh // group, 0:Dv])
                T.writes(o[vb, vt, vh, 0:Dv])
                acc = T.alloc_buffer((Dv,), "float32", scope="local")
                sc = T.alloc_buffer((KB,), "float32", scope="local")  # the block's scores, then weights
                # running max, running sum, block max, rescale of the old terms
                st = T.alloc_buffer((4,), "float32", scope="local")
                st[0] = T.float32(NEG)
                st[1] = T.float32(0)
                for j in cols(Dv):
                    acc[j] = T.float32(0)
                for blk in range((S - L + vt + KB) // KB):
                    for s in keys(KB):
                        sc[s] = T.float32(0)
                    for d in range(D):
                        for s in keys(KB):
                            sc[s] = sc[s] + q[vb, vt, vh, d] * kT[vb, vh // group, d, blk * KB + s]
                    for s in keys(KB):
                        sc[s] = T.Select(blk * KB + s <= S - L + vt, sc[s] * T.float32(scale), T.float32(NEG))
                    st[2] = sc[0]
                    for s in range(1, KB):
                        st[2] = T.max(st[2], sc[s])
                    st[3] = T.exp(st[0] - T.max(st[0], st[2]))
                    st[0] = T.max(st[0], st[2])
                    for s in keys(KB):  # exp_vec stays in vectors; masked keys weigh exactly 0
                        sc[s] = T.Select(sc[s] - st[0] < T.float32(-87.0), T.float32(0), exp_vec(sc[s] - st[0]))
                    st[1] = st[1] * st[3]
                    for s in range(KB):
                        st[1] = st[1] + sc[s]
                    for j in cols(Dv):
                        acc[j] = acc[j] * st[3]
                    for s in range(KB):
                        for j in cols(Dv):
                            acc[j] = acc[j] + sc[s] * v[vb, T.min(blk * KB + s, S - 1), vh // group, j]
                for j in cols(Dv):
                    o[vb, vt, vh, j] = acc[j] / st[1]

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    b, t, h = sch.get_loops(sch.get_sblock("row"))
    sch.parallel(sch.fuse(b, t, h))


def schedule_cuda(sch: s_tir.Schedule) -> None:
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("row"))), "blockIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
