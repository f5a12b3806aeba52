"""Normalised linear attention, recurrent, as a TensorIR kernel.

    for t:  S += k_t v_t^T;  z += k_t;  o_t = (scale q_t^T S) / (scale q_t^T z)

Laid out like the delta rule (k3c.kernels.delta.tvm.recurrent): one block per (batch, head)
holds S [K, V] and z [K] in local memory and walks the T steps; the loops over value columns
run as vectors (llvm) or threads (cuda).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from .recurrent import SCHEDULES  # noqa: F401  (same (batch, head) blocks)


def linear_recurrent(H: int, K: int, V: int, scale: float, target: str = "llvm") -> tirx.PrimFunc:
    """q, k [B, L, H, K], v [B, L, H, V], s0 [B, H, K, V], z0 [B, H, K]
    -> o [B, L, H, V], s1 [B, H, K, V], z1 [B, H, K]; all float32."""
    scale = float(scale)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, s0_h: T.handle, z0_h: T.handle,
               o_h: T.handle, s1_h: T.handle, z1_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, K), "float32")
        k = T.match_buffer(k_h, (B, L, H, K), "float32")
        v = T.match_buffer(v_h, (B, L, H, V), "float32")
        s0 = T.match_buffer(s0_h, (B, H, K, V), "float32")
        z0 = T.match_buffer(z0_h, (B, H, K), "float32")
        o = T.match_buffer(o_h, (B, L, H, V), "float32")
        s1 = T.match_buffer(s1_h, (B, H, K, V), "float32")
        z1 = T.match_buffer(z1_h, (B, H, K), "float32")
        for b, h in T.grid(B, H):
            with T.sblock("head"):
                vb, vh = T.axis.remap("SS", [b, h])
                T.reads(q[vb, 0:L, vh, 0:K], k[vb, 0:L, vh, 0:K], v[vb, 0:L, vh, 0:V], s0[vb, vh, 0:K, 0:V],
                        z0[vb, vh, 0:K])
                T.writes(o[vb, 0:L, vh, 0:V], s1[vb, vh, 0:K, 0:V], z1[vb, vh, 0:K])
                S = T.alloc_buffer((K, V), "float32", scope=scratch(target))
                z = T.alloc_buffer((K,), "float32", scope=scratch(target))
                num = T.alloc_buffer((V,), "float32", scope=scratch(target))
                den = T.alloc_buffer((1,), "float32", scope=scratch(target))
                for i in range(K):
                    z[i] = z0[vb, vh, i]
                    for j in cols(V):
                        S[i, j] = s0[vb, vh, i, j]
                for t in range(L):
                    den[0] = T.float32(0)
                    for j in cols(V):
                        num[j] = T.float32(0)
                    for i in range(K):
                        z[i] = z[i] + k[vb, t, vh, i]
                        den[0] = den[0] + q[vb, t, vh, i] * T.float32(scale) * z[i]
                        for j in cols(V):
                            S[i, j] = S[i, j] + k[vb, t, vh, i] * v[vb, t, vh, j]
                            num[j] = num[j] + q[vb, t, vh, i] * T.float32(scale) * S[i, j]
                    for j in cols(V):
                        o[vb, t, vh, j] = num[j] / den[0]
                for i in range(K):
                    z1[vb, vh, i] = z[i]
                    for j in cols(V):
                        s1[vb, vh, i, j] = S[i, j]

    return kernel


__all__ = ["linear_recurrent", "SCHEDULES"]
