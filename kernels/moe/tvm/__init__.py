"""The routed-expert GEMMs as TensorIR kernels, with static shapes (top-k indices, no sorting).

    gate_up:  gu[n, j, :] = h[n] @ w13[idx[n, j]]^T            w13 given as [E, D, 2I]
    down:     y[n, :]     = sum_j w[n, j] a[n, j] @ w2[idx[n, j]]^T      w2 given as [E, I, Dout]

Both take the expert weights transposed (the reduction dim first), so that the output
features are contiguous: the backend's `permute_dims` of the weight is lifted into the
one-time parameter transform. Schedules: llvm runs the tokens (and slots) in parallel with
the output features in vectors; cuda puts a token on a block and the features on threads.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T


def moe_gate_up(E: int, D: int, I2: int, k: int) -> tirx.PrimFunc:
    """h [N, D], w13t [E, D, I2], idx [N, k] (int64) -> gu [N, k, I2]; float32."""

    @T.prim_func(s_tir=True)
    def kernel(h_h: T.handle, w: T.Buffer((E, D, I2), "float32"), idx_h: T.handle, gu_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        h = T.match_buffer(h_h, (N, D), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        gu = T.match_buffer(gu_h, (N, k, I2), "float32")
        for n, j, i, r in T.grid(N, k, I2, D):
            with T.sblock("gate_up"):
                vn, vj, vi, vr = T.axis.remap("SSSR", [n, j, i, r])
                with T.init():
                    gu[vn, vj, vi] = T.float32(0)
                gu[vn, vj, vi] = gu[vn, vj, vi] + h[vn, vr] * w[idx[vn, vj], vr, vi]

    return kernel


def moe_down(E: int, I: int, Dout: int, k: int) -> tirx.PrimFunc:
    """a [N, k, I], w2t [E, I, Dout], idx [N, k] (int64), w [N, k] -> y [N, Dout]; float32."""

    @T.prim_func(s_tir=True)
    def kernel(a_h: T.handle, w2: T.Buffer((E, I, Dout), "float32"), idx_h: T.handle, cw_h: T.handle,
               y_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        a = T.match_buffer(a_h, (N, k, I), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        cw = T.match_buffer(cw_h, (N, k), "float32")
        y = T.match_buffer(y_h, (N, Dout), "float32")
        for n, d, j, r in T.grid(N, Dout, k, I):
            with T.sblock("down"):
                vn, vd, vj, vr = T.axis.remap("SSRR", [n, d, j, r])
                with T.init():
                    y[vn, vd] = T.float32(0)
                y[vn, vd] = y[vn, vd] + cw[vn, vj] * a[vn, vj, vr] * w2[idx[vn, vj], vr, vd]

    return kernel


def _llvm(block: str, n_spatial: int, lanes: int = 8):
    def schedule(sch: s_tir.Schedule) -> None:
        blk = sch.get_sblock(block)
        loops = sch.get_loops(blk)
        spatial, feature, reduce = loops[: n_spatial - 1], loops[n_spatial - 1], loops[n_spatial:]
        sch.reorder(*spatial, *reduce, feature)
        sch.parallel(sch.fuse(*spatial))
        fo, fi = sch.split(feature, factors=[None, lanes])
        sch.reorder(fo, *reduce, fi)
        sch.vectorize(fi)
        sch.decompose_reduction(blk, reduce[0])

    return schedule


def _cuda(block: str, n_spatial: int, threads: int = 128):
    def schedule(sch: s_tir.Schedule) -> None:
        loops = sch.get_loops(sch.get_sblock(block))
        spatial, feature = loops[: n_spatial - 1], loops[n_spatial - 1]
        sch.bind(sch.fuse(*spatial), "blockIdx.x")
        fo, fi = sch.split(feature, factors=[None, threads])
        sch.bind(fi, "threadIdx.x")

    return schedule


GATE_UP_SCHEDULES = {"llvm": _llvm("gate_up", 3), "cuda": _cuda("gate_up", 3)}
DOWN_SCHEDULES = {"llvm": _llvm("down", 2), "cuda": _cuda("down", 2)}
