"""The Block Attention Residual mix as a TensorIR kernel.

    scores[n] = rsqrt(mean_d V[n]^2 + eps) * sum_d V[n, d] n_w[d] w[d]
    y[d]      = sum_n softmax(scores)[n] V[n, d]          (N candidates, raw V, fp32)

One block per row (the flattened batch and time positions) computes the N scores, their
softmax and the mix. Schedules: llvm runs the rows in parallel (the d loops are contiguous
and LLVM vectorizes them); cuda gives each row a thread.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import scratch


def attn_res_mix(N: int, d: int, eps: float, target: str = "llvm") -> tirx.PrimFunc:
    """V [N, M, d], w [d], nw [d] -> y [M, d]; float32."""
    eps = float(eps)
    local = scratch(target)  # the scope of a row's buffers

    @T.prim_func(s_tir=True)
    def kernel(V_h: T.handle, w: T.Buffer((d,), "float32"), nw: T.Buffer((d,), "float32"), y_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        M = T.int64()
        V = T.match_buffer(V_h, (N, M, d), "float32")
        y = T.match_buffer(y_h, (M, d), "float32")
        for m in range(M):
            with T.sblock("row"):
                vm = T.axis.spatial(M, m)
                T.reads(V[0:N, vm, 0:d], w[0:d], nw[0:d])
                T.writes(y[vm, 0:d])
                score = T.alloc_buffer((N,), "float32", scope=local)
                acc = T.alloc_buffer((3,), "float32", scope=local)  # sum of squares, dot, max
                for n in range(N):
                    acc[0] = T.float32(0)
                    acc[1] = T.float32(0)
                    for i in range(d):
                        acc[0] = acc[0] + V[n, vm, i] * V[n, vm, i]
                        acc[1] = acc[1] + V[n, vm, i] * (nw[i] * w[i])
                    score[n] = acc[1] * T.rsqrt(acc[0] / T.float32(d) + T.float32(eps))
                acc[2] = score[0]
                for n in range(1, N):
                    acc[2] = T.max(acc[2], score[n])
                acc[0] = T.float32(0)
                for n in range(N):
                    score[n] = T.exp(score[n] - acc[2])
                    acc[0] = acc[0] + score[n]
                for i in range(d):
                    acc[1] = T.float32(0)
                    for n in range(N):
                        acc[1] = acc[1] + score[n] * V[n, vm, i]
                    y[vm, i] = acc[1] / acc[0]

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    (m,) = sch.get_loops(sch.get_sblock("row"))
    sch.parallel(m)


def schedule_cuda(sch: s_tir.Schedule, threads: int = 64) -> None:
    (m,) = sch.get_loops(sch.get_sblock("row"))
    bx, tx = sch.split(m, factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
