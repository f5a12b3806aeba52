"""KDA's decode step as one TensorIR kernel (the math: ../README.md, the definition: ../naive.py).

One block per (batch, head) does the whole layer step for its head: the three short convs of
its K, K and V channels (and their new tails), the l2norms, the forget gate and beta, one
delta step, and the gated RMSNorm of its output row. The state is read once and written once:

    P = exp(g)[:, None] * S            (a local [K, V] buffer, in the same pass as:)
    u = k^T P,  r = q^T P
    w = beta (v - u);  o = scale (r + (q . k) w)       # q^T (P + k w^T) without a second pass
    S' = P + k w^T                     (the one store)

Loops over the value columns run as vectors on llvm (`inner_loop`); the sums over columns
(the norm) are serial. Schedules: llvm runs the (batch, head) blocks in parallel; cuda gives
each a thread block with one thread (compiles and is correct; not tuned).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from ...delta.tvm.recurrent import schedule_cuda, schedule_llvm
from ..naive import GATES


def _log1p_exp_neg_abs(y):
    """log(1 + exp(-|y|)) without the cancellation of 1 + exp(.) (2 atanh(e / (2 + e)) as a series)."""
    e = T.exp(-T.fabs(y))
    s = e / (T.float32(2.0) + e)
    s2 = s * s
    p = T.float32(1.0 / 17)
    for n in range(15, 0, -2):
        p = p * s2 + T.float32(1.0 / n)
    return T.float32(2.0) * s * p


def kda_decode_step(H: int, K: int, V: int, W: int, scale: float, gate: str, lower_bound: float, activation: str,
                    qk_eps: float, eps: float, target: str = "llvm") -> tirx.PrimFunc:
    """q_x, k_x [B, 1, H*K], v_x [B, 1, H*V], q_w, k_w [H*K, W], v_w [H*V, W], q_conv, k_conv
    [B, H*K, W-1], v_conv [B, H*V, W-1], f [B, 1, H, K], a [H, 1], dt_bias [H, K], b [B, 1, H],
    state [B, H, K, V], o_gate [B, 1, H, V], norm_w [V] -> o [B, 1, H, V], state', the three
    conv tails; all float32."""
    if gate not in GATES:
        raise ValueError(f"kda_decode_step gate must be one of {GATES}, got {gate!r}")
    if activation not in ("silu", "none") or W < 2:
        raise ValueError(f"kda_decode_step: activation {activation!r}, W {W}: needs silu/none and W >= 2")
    P = W - 1
    silu, sig_gate = activation == "silu", gate == "sigmoid"
    scale, lb, qk_eps, eps = float(scale), float(lower_bound), float(qk_eps), float(eps)
    cols = inner_loop(target) if target == "llvm" else T.serial
    local = scratch(target)  # the scope of the per-head buffers

    @T.prim_func(s_tir=True)
    def kernel(qx_h: T.handle, kx_h: T.handle, vx_h: T.handle, q_w: T.Buffer((H * K, W), "float32"),
               k_w: T.Buffer((H * K, W), "float32"), v_w: T.Buffer((H * V, W), "float32"), qc_h: T.handle,
               kc_h: T.handle, vc_h: T.handle, f_h: T.handle, a: T.Buffer((H, 1), "float32"),
               dt: T.Buffer((H, K), "float32"), b_h: T.handle, s0_h: T.handle, og_h: T.handle,
               nw: T.Buffer((V,), "float32"), o_h: T.handle, s1_h: T.handle, qc1_h: T.handle, kc1_h: T.handle,
               vc1_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B = T.int64()
        qx = T.match_buffer(qx_h, (B, 1, H * K), "float32")
        kx = T.match_buffer(kx_h, (B, 1, H * K), "float32")
        vx = T.match_buffer(vx_h, (B, 1, H * V), "float32")
        qc = T.match_buffer(qc_h, (B, H * K, P), "float32")
        kc = T.match_buffer(kc_h, (B, H * K, P), "float32")
        vc = T.match_buffer(vc_h, (B, H * V, P), "float32")
        f = T.match_buffer(f_h, (B, 1, H, K), "float32")
        bl = T.match_buffer(b_h, (B, 1, H), "float32")
        s0 = T.match_buffer(s0_h, (B, H, K, V), "float32")
        og = T.match_buffer(og_h, (B, 1, H, V), "float32")
        o = T.match_buffer(o_h, (B, 1, H, V), "float32")
        s1 = T.match_buffer(s1_h, (B, H, K, V), "float32")
        qc1 = T.match_buffer(qc1_h, (B, H * K, P), "float32")
        kc1 = T.match_buffer(kc1_h, (B, H * K, P), "float32")
        vc1 = T.match_buffer(vc1_h, (B, H * V, P), "float32")
        for bi, hi in T.grid(B, H):
            with T.sblock("head"):
                vb, vh = T.axis.remap("SS", [bi, hi])
                T.reads(qx[vb, 0, vh * K:vh * K + K], kx[vb, 0, vh * K:vh * K + K], vx[vb, 0, vh * V:vh * V + V],
                        q_w[vh * K:vh * K + K, 0:W], k_w[vh * K:vh * K + K, 0:W], v_w[vh * V:vh * V + V, 0:W],
                        qc[vb, vh * K:vh * K + K, 0:P], kc[vb, vh * K:vh * K + K, 0:P],
                        vc[vb, vh * V:vh * V + V, 0:P], f[vb, 0, vh, 0:K], a[vh, 0], dt[vh, 0:K], bl[vb, 0, vh],
                        s0[vb, vh, 0:K, 0:V], og[vb, 0, vh, 0:V], nw[0:V])
                T.writes(o[vb, 0, vh, 0:V], s1[vb, vh, 0:K, 0:V], qc1[vb, vh * K:vh * K + K, 0:P],
                         kc1[vb, vh * K:vh * K + K, 0:P], vc1[vb, vh * V:vh * V + V, 0:P])
                qv = T.alloc_buffer((K,), "float32", scope=local)
                kv = T.alloc_buffer((K,), "float32", scope=local)
                dv = T.alloc_buffer((K,), "float32", scope=local)  # exp(g): the decay of each key row
                vv = T.alloc_buffer((V,), "float32", scope=local)
                Pd = T.alloc_buffer((K, V), "float32", scope=local)  # the decayed state
                u = T.alloc_buffer((V,), "float32", scope=local)
                r = T.alloc_buffer((V,), "float32", scope=local)
                wv = T.alloc_buffer((V,), "float32", scope=local)
                acc = T.alloc_buffer((4,), "float32", scope=local)  # |q|^2, |k|^2, q . k, |o|^2
                cc = T.alloc_buffer((3,), "float32", scope=local)  # a channel's conv: q, k, v
                # the short convs of this head's channels and their new tails
                for i in range(K):
                    cc[0] = q_w[vh * K + i, P] * qx[vb, 0, vh * K + i]
                    cc[1] = k_w[vh * K + i, P] * kx[vb, 0, vh * K + i]
                    for j in range(P):
                        cc[0] = cc[0] + q_w[vh * K + i, j] * qc[vb, vh * K + i, j]
                        cc[1] = cc[1] + k_w[vh * K + i, j] * kc[vb, vh * K + i, j]
                    if silu:
                        qv[i] = cc[0] * T.sigmoid(cc[0])
                        kv[i] = cc[1] * T.sigmoid(cc[1])
                    else:
                        qv[i] = cc[0]
                        kv[i] = cc[1]
                    for j in range(P - 1):
                        qc1[vb, vh * K + i, j] = qc[vb, vh * K + i, j + 1]
                        kc1[vb, vh * K + i, j] = kc[vb, vh * K + i, j + 1]
                    qc1[vb, vh * K + i, P - 1] = qx[vb, 0, vh * K + i]
                    kc1[vb, vh * K + i, P - 1] = kx[vb, 0, vh * K + i]
                for c in range(V):
                    cc[2] = v_w[vh * V + c, P] * vx[vb, 0, vh * V + c]
                    for j in range(P):
                        cc[2] = cc[2] + v_w[vh * V + c, j] * vc[vb, vh * V + c, j]
                    if silu:
                        vv[c] = cc[2] * T.sigmoid(cc[2])
                    else:
                        vv[c] = cc[2]
                    for j in range(P - 1):
                        vc1[vb, vh * V + c, j] = vc[vb, vh * V + c, j + 1]
                    vc1[vb, vh * V + c, P - 1] = vx[vb, 0, vh * V + c]
                # l2norm of q and k over K; the forget gate's decay
                for n in range(4):
                    acc[n] = T.float32(0)
                for i in range(K):
                    acc[0] = acc[0] + qv[i] * qv[i]
                    acc[1] = acc[1] + kv[i] * kv[i]
                for i in range(K):
                    qv[i] = qv[i] * T.rsqrt(acc[0] + T.float32(qk_eps))
                    kv[i] = kv[i] * T.rsqrt(acc[1] + T.float32(qk_eps))
                    acc[2] = acc[2] + qv[i] * kv[i]
                    if sig_gate:
                        dv[i] = T.exp(T.float32(lb) * T.sigmoid(a[vh, 0] * (f[vb, 0, vh, i] + dt[vh, i])))
                    else:
                        dv[i] = T.exp(a[vh, 0] * T.if_then_else(
                            f[vb, 0, vh, i] + dt[vh, i] > T.float32(20.0), f[vb, 0, vh, i] + dt[vh, i],
                            T.max(f[vb, 0, vh, i] + dt[vh, i], T.float32(0))
                            + _log1p_exp_neg_abs(f[vb, 0, vh, i] + dt[vh, i])))
                # the one pass over the state: decay, k^T P and q^T P
                for j in cols(V):
                    u[j] = T.float32(0)
                    r[j] = T.float32(0)
                for i in range(K):
                    for j in cols(V):
                        Pd[i, j] = s0[vb, vh, i, j] * dv[i]
                        u[j] = u[j] + kv[i] * Pd[i, j]
                        r[j] = r[j] + qv[i] * Pd[i, j]
                for j in cols(V):
                    wv[j] = T.sigmoid(bl[vb, 0, vh]) * (vv[j] - u[j])
                    r[j] = (r[j] + acc[2] * wv[j]) * T.float32(scale)
                for i in range(K):
                    for j in cols(V):
                        s1[vb, vh, i, j] = Pd[i, j] + kv[i] * wv[j]
                # the gated RMSNorm of the output row
                for j in range(V):
                    acc[3] = acc[3] + r[j] * r[j]
                for j in cols(V):
                    o[vb, 0, vh, j] = (r[j] * T.rsqrt(acc[3] / T.float32(V) + T.float32(eps)) * nw[j]
                                       * T.sigmoid(og[vb, 0, vh, j]))

    return kernel


# one block per (batch, head), as the delta family's recurrent kernel: its schedules
SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
