"""The causal depthwise short convolution with carried state, as a TensorIR kernel.

    xp = [state ++ x] along time;  y_t[c] = act(sum_j w[c, j] xp[t + j, c]);  state' = last W-1 of xp

One block per output (batch, step, channel), its W-term sum written out in full (W is
static), and one block per new state entry. A load of `xp` reads the state or x, only the
one its step falls in (`_xp`), its index clamped in range besides. Schedules: llvm runs
(batch, step) in parallel with the channels in vectors; cuda puts the flattened outputs on
blocks of 256 threads.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T


def _xp(s0, x, b, c, pos, P: int):
    """Entry `pos` of [state ++ x] along time, for channel c of batch b.

    An if_then_else, not a Select: a Select evaluates both loads, and the simplifier drops
    each clamp under the Select's condition (min(pos, P-1) -> pos where pos < P), so the
    untaken load read s0 past its end and x up to P rows before its start (a segfault when
    the page before x is unmapped: k3-small's prefill of 16384 tokens). if_then_else reads
    only the taken side; the clamps stay as a second guard."""
    return T.if_then_else(pos < P, s0[b, c, T.min(pos, T.int64(P - 1))], x[b, T.max(pos - P, T.int64(0)), c])


def _window(w, s0, x, b, t, c, W: int):
    total = w[c, 0] * _xp(s0, x, b, c, t, W - 1)
    for j in range(1, W):
        total = total + w[c, j] * _xp(s0, x, b, c, t + j, W - 1)
    return total


def short_conv(C: int, W: int, activation: str) -> tirx.PrimFunc:
    """x [B, L, C], w [C, W], state [B, C, W-1] -> y [B, L, C], state' [B, C, W-1]; float32."""
    if activation not in ("silu", "none"):
        raise ValueError(f"short_conv activation must be 'silu' or 'none', got {activation!r}")
    silu = activation == "silu"
    P = W - 1

    @T.prim_func(s_tir=True)
    def kernel(x_h: T.handle, w: T.Buffer((C, W), "float32"), s0_h: T.handle, y_h: T.handle, s1_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, L = T.int64(), T.int64()
        x = T.match_buffer(x_h, (B, L, C), "float32")
        s0 = T.match_buffer(s0_h, (B, C, P), "float32")
        y = T.match_buffer(y_h, (B, L, C), "float32")
        s1 = T.match_buffer(s1_h, (B, C, P), "float32")
        for b, t, c in T.grid(B, L, C):
            with T.sblock("conv"):
                vb, vt, vc = T.axis.remap("SSS", [b, t, c])
                T.reads(x[vb, 0:L, vc], s0[vb, vc, 0:P], w[vc, 0:W])
                T.writes(y[vb, vt, vc])
                if silu:
                    y[vb, vt, vc] = _window(w, s0, x, vb, vt, vc, W) * T.sigmoid(_window(w, s0, x, vb, vt, vc, W))
                else:
                    y[vb, vt, vc] = _window(w, s0, x, vb, vt, vc, W)
        for b, c, i in T.grid(B, C, P):
            with T.sblock("state"):
                vb, vc, vi = T.axis.remap("SSS", [b, c, i])
                T.reads(x[vb, 0:L, vc], s0[vb, vc, 0:P])
                T.writes(s1[vb, vc, vi])
                s1[vb, vc, vi] = _xp(s0, x, vb, vc, L + vi, P)

    return kernel


def schedule_llvm(sch: s_tir.Schedule, lanes: int = 8) -> None:
    b, t, c = sch.get_loops(sch.get_sblock("conv"))
    sch.parallel(sch.fuse(b, t))
    _, ci = sch.split(c, factors=[None, lanes])
    sch.vectorize(ci)
    b, c, i = sch.get_loops(sch.get_sblock("state"))
    sch.parallel(b)


def schedule_cuda(sch: s_tir.Schedule, threads: int = 256) -> None:
    for block in ("conv", "state"):
        fused = sch.fuse(*sch.get_loops(sch.get_sblock(block)))
        bx, tx = sch.split(fused, factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
