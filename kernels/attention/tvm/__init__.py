"""Causal softmax attention over a cache as a TensorIR kernel (online softmax).

    o[b, t, h] = sum_s softmax_s(scale q[b, t, h] . k[b, s, g]) v[b, s, g],  s <= S - L + t

with g = h // (H / G): G key/value heads serve H query heads (G = H for plain attention,
G = 1 for MLA's absorbed form, where the latent cache is the one key/value head). One block
per query row keeps the running max, the running sum and the Dv accumulators in registers
and streams the visible keys once; its loops over the Dv output features run as a vector
(llvm) or as threads (cuda). Schedules: llvm runs the rows in parallel; cuda gives each row a
thread block.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop


def causal_attention(H: int, G: int, D: int, Dv: int, scale: float, target: str = "llvm") -> tirx.PrimFunc:
    """q [B, L, H, D], k [B, S, G, D], v [B, S, G, Dv] -> o [B, L, H, Dv]; float32, S >= L."""
    if H % G:
        raise ValueError(f"{H} query heads cannot share {G} key/value heads")
    group = H // G
    scale = float(scale)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L, S = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, D), "float32")
        k = T.match_buffer(k_h, (B, S, G, D), "float32")
        v = T.match_buffer(v_h, (B, S, G, Dv), "float32")
        o = T.match_buffer(o_h, (B, L, H, Dv), "float32")
        for b, t, h in T.grid(B, L, H):
            with T.sblock("row"):
                vb, vt, vh = T.axis.remap("SSS", [b, t, h])
                T.reads(q[vb, vt, vh, 0:D], k[vb, 0:S, vh // group, 0:D], v[vb, 0:S, vh // group, 0:Dv])
                T.writes(o[vb, vt, vh, 0:Dv])
                acc = T.alloc_buffer((Dv,), "float32", scope="local")
                # running max, running sum, this key's score, rescale of the old terms, its weight
                st = T.alloc_buffer((5,), "float32", scope="local")
                st[0] = T.float32(-3.0e38)
                st[1] = T.float32(0)
                for j in cols(Dv):
                    acc[j] = T.float32(0)
                for s in range(S - L + vt + 1):
                    st[2] = T.float32(0)
                    for d in range(D):
                        st[2] = st[2] + q[vb, vt, vh, d] * k[vb, s, vh // group, d]
                    st[2] = st[2] * T.float32(scale)
                    st[3] = T.exp(st[0] - T.max(st[0], st[2]))
                    st[4] = T.exp(st[2] - T.max(st[0], st[2]))
                    st[0] = T.max(st[0], st[2])
                    st[1] = st[1] * st[3] + st[4]
                    for j in cols(Dv):
                        acc[j] = acc[j] * st[3] + st[4] * v[vb, s, vh // group, j]
                for j in cols(Dv):
                    o[vb, vt, vh, j] = acc[j] / st[1]

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    b, t, h = sch.get_loops(sch.get_sblock("row"))
    sch.parallel(sch.fuse(b, t, h))


def schedule_cuda(sch: s_tir.Schedule) -> None:
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("row"))), "blockIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
