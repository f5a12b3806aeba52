"""The recurrent delta rule as a TensorIR kernel: KDA, the gated delta rule and DeltaNet.

    for t:  S = decay_t[:, None] * S;  S += beta_t k_t (v_t - k_t^T S)^T;  o_t = scale q_t^T S

One block per (batch, head) keeps its state in local memory and walks the T steps: that is
the decode step (T = 1) and, for a prefill that was not chunked, the whole sequence. A step
makes one pass over the state, not two: it keeps P = decay_t * S_{t-1} and adds step t-1's
rank-1 write k w^T (w = beta (v - k^T P)) in the next step's pass, which so holds S_{t-1}
row by row: it sums step t-1's output q_{t-1}^T S_{t-1} (written a step late, the last one
in the final pass that writes the state) as it decays the rows for step t and sums k_t^T P.
Every statement over the state is a loop over the value columns j (column j of S only ever
meets column j), which run as one vector on llvm and as one thread each on cuda
(`inner_loop`). The same arithmetic as two passes, in half the loads and stores: 1.5x
faster at H = 4 and 16, T = 2048 (BENCHMARKS.md).

The decay is passed as `decay = exp(g)` (computed once outside), [B, T, H, KD] with KD = K per
channel (KDA) or 1 per head (gated delta rule); gate "none" (DeltaNet) never reads it.
Schedules: llvm runs the (batch, head) blocks in parallel; cuda gives each a thread block.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from .. import GATES as FAMILY_GATES

GATES = tuple(g for g in FAMILY_GATES if g != "linear")  # linear attention: linear.py


def delta_recurrent(H: int, K: int, V: int, gate: str, scale: float, target: str = "llvm") -> tirx.PrimFunc:
    """q, k [B, L, H, K], v [B, L, H, V], decay [B, L, H, KD], beta [B, L, H], s0 [B, H, K, V]
    -> o [B, L, H, V], s1 [B, H, K, V]; all float32."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    KD = K if gate == "channel" else 1
    per_channel = 1 if gate == "channel" else 0
    decayed = gate != "none"
    scale = float(scale)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, decay_h: T.handle, beta_h: T.handle,
               s0_h: T.handle, o_h: T.handle, s1_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        q = T.match_buffer(q_h, (B, L, H, K), "float32")
        k = T.match_buffer(k_h, (B, L, H, K), "float32")
        v = T.match_buffer(v_h, (B, L, H, V), "float32")
        decay = T.match_buffer(decay_h, (B, L, H, KD), "float32")
        beta = T.match_buffer(beta_h, (B, L, H), "float32")
        s0 = T.match_buffer(s0_h, (B, H, K, V), "float32")
        o = T.match_buffer(o_h, (B, L, H, V), "float32")
        s1 = T.match_buffer(s1_h, (B, H, K, V), "float32")
        for b, h in T.grid(B, H):
            with T.sblock("head"):
                vb, vh = T.axis.remap("SS", [b, h])
                T.reads(q[vb, 0:L, vh, 0:K], k[vb, 0:L, vh, 0:K], v[vb, 0:L, vh, 0:V],
                        decay[vb, 0:L, vh, 0:KD], beta[vb, 0:L, vh], s0[vb, vh, 0:K, 0:V])
                T.writes(o[vb, 0:L, vh, 0:V], s1[vb, vh, 0:K, 0:V])
                # P holds d_t * S_{t-1}: the state decayed for step t, still without step t-1's
                # rank-1 write k_{t-1} w_{t-1}^T (kept in kp, wp and added in the next pass, which
                # so sees S_{t-1} whole and reads step t-1's output from it)
                P = T.alloc_buffer((K, V), "float32", scope=scratch(target))
                kp = T.alloc_buffer((K,), "float32", scope=scratch(target))
                qp = T.alloc_buffer((K,), "float32", scope=scratch(target))
                wp = T.alloc_buffer((V,), "float32", scope=scratch(target))
                u = T.alloc_buffer((V,), "float32", scope=scratch(target))  # k_t^T P
                r = T.alloc_buffer((V,), "float32", scope=scratch(target))  # q_{t-1}^T S_{t-1}
                full = T.alloc_buffer((V,), "float32", scope=scratch(target))
                for i in range(K):
                    kp[i] = T.float32(0)
                    qp[i] = T.float32(0)
                    for j in cols(V):
                        P[i, j] = s0[vb, vh, i, j]
                for j in cols(V):
                    wp[j] = T.float32(0)
                for t in range(L):
                    for j in cols(V):
                        u[j] = T.float32(0)
                        r[j] = T.float32(0)
                    for i in range(K):  # the one pass over the state a step makes
                        for j in cols(V):
                            full[j] = P[i, j] + kp[i] * wp[j]  # S_{t-1}
                            r[j] = r[j] + qp[i] * full[j]
                            if decayed:
                                P[i, j] = full[j] * decay[vb, t, vh, i * per_channel]
                            else:
                                P[i, j] = full[j]
                            u[j] = u[j] + k[vb, t, vh, i] * P[i, j]
                    if t > 0:
                        for j in cols(V):
                            o[vb, t - 1, vh, j] = r[j] * T.float32(scale)
                    for j in cols(V):
                        wp[j] = beta[vb, t, vh] * (v[vb, t, vh, j] - u[j])
                    for i in range(K):
                        kp[i] = k[vb, t, vh, i]
                        qp[i] = q[vb, t, vh, i]
                for j in cols(V):
                    r[j] = T.float32(0)
                for i in range(K):
                    for j in cols(V):
                        s1[vb, vh, i, j] = P[i, j] + kp[i] * wp[j]
                        r[j] = r[j] + qp[i] * s1[vb, vh, i, j]
                if L > 0:
                    for j in cols(V):
                        o[vb, L - 1, vh, j] = r[j] * T.float32(scale)

    return kernel


def schedule_llvm(sch: s_tir.Schedule, block: str = "head") -> None:
    """The (batch, head) blocks in parallel."""
    b, h = sch.get_loops(sch.get_sblock(block))
    sch.parallel(sch.fuse(b, h))


def schedule_cuda(sch: s_tir.Schedule, block: str = "head") -> None:
    """A thread block per (batch, head)."""
    b, h = sch.get_loops(sch.get_sblock(block))
    sch.bind(sch.fuse(b, h), "blockIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
