"""`linear` against a constant weight on the CPU: y[M, N] = x[M, K] @ W[N, K]^T with W packed
into column panels, as BLAS libraries do.

    Wp[p, k, j] = W[p * c + j, k]          [ceil(N / c), K, c], zero columns past N

The packing is weight-only work, so the build lifts it into `transform_params` and it runs
once at load. Each parallel task owns a tile of `rows` x `c` outputs: the accumulators stay in
vector registers, the k loop reads one contiguous row of the panel and broadcasts one x value
per row. With c = 16 and rows = 6 that is 12 accumulators of AVX2's 16, the classic AVX2
micro-kernel; a CPU with AVX-512 (32 registers of 16 floats) takes c = 32 and rows = 8, 16
accumulators: with 6 of them an FMA waited on the one before it (4 cycles, 2 ports), and
the 1024 x 512 x 3072 GEMM of a user's linear ran 1.4 to 2 times faster so, side by side on a
2-core AVX-512 Xeon. Rows past M read row M - 1 (clamped, so the inner loop has no branch)
and are not written back; neither are the padding columns.

The loops are written out here (no `s_tir` schedule): a scheduled block with a row predicate
made LLVM keep the accumulators in memory.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

PANEL = 16  # columns per panel: two AVX2 vectors
WIDE_PANEL = 32  # two AVX-512 vectors


def packed_rows(decode: bool, c: int = PANEL) -> int:
    """Rows per tile: 6 (8 for AVX-512 panels) for prefill GEMMs, 1 when M is the batch of a
    decode step (a GEMV)."""
    return 1 if decode else (8 if c == WIDE_PANEL else 6)


def packed_linear(K: int, N: int, rows: int, c: int = PANEL) -> tirx.PrimFunc:
    """x [M, K], wp [ceil(N / c), K, c] -> y [M, N]; float32, M dynamic."""
    P = T.int64((N + c - 1) // c)
    Kc, Nc, cc, R_ = T.int64(K), T.int64(N), T.int64(c), T.int64(rows)
    ragged = N % c != 0

    @T.prim_func
    def kernel(x_h: T.handle, w_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})  # 8: opaque
        M = T.int64()
        x = T.match_buffer(x_h, (M, Kc), "float32")
        w = T.match_buffer(w_h, (P, Kc, cc), "float32")
        y = T.match_buffer(y_h, (M, Nc), "float32")
        tiles = (M + R_ - T.int64(1)) // R_
        for t in T.parallel(P * tiles):
            acc = T.decl_buffer((R_, cc), "float32", scope="local")
            for i in T.unroll(R_):
                for j in T.vectorized(cc):
                    acc[i, j] = T.float32(0)
            for k in range(Kc):
                for i in T.unroll(R_):
                    for j in T.vectorized(cc):
                        acc[i, j] = acc[i, j] + x[T.min((t % tiles) * R_ + i, M - T.int64(1)), k] * w[t // tiles, k, j]
            for i in T.unroll(R_):
                if (t % tiles) * R_ + i < M:
                    if ragged:
                        for j in T.unroll(cc):
                            if (t // tiles) * cc + j < Nc:
                                y[(t % tiles) * R_ + i, (t // tiles) * cc + j] = acc[i, j]
                    else:
                        for j in T.vectorized(cc):
                            y[(t % tiles) * R_ + i, (t // tiles) * cc + j] = acc[i, j]

    return kernel
