"""`linear` against a constant weight on the CPU: y[M, N] = x[M, K] @ W[N, K]^T with W packed
into column panels, as BLAS libraries do.

    Wp[p, k, j] = W[p * c + j, k]          [ceil(N / c), K, c], zero columns past N

The packing is weight-only work, so the build lifts it into `transform_params` and it runs
once at load. It is a re-layout only: the panels hold the weight's stored dtype (float32, or
bfloat16 that the kernel widens in registers: `widen`), so a BF16 weight stays 2 bytes in
memory. Each parallel task owns a tile of `rows` x `c` outputs: the accumulators stay in
vector registers, the k loop reads one contiguous row of the panel and broadcasts one x value
per row. With c = 16 and rows = 6 that is 12 accumulators of AVX2's 16, the classic AVX2
micro-kernel; a CPU with AVX-512 (32 registers of 16 floats) takes c = 32 and rows = 8, 16
accumulators: with 6 of them an FMA waited on the one before it (4 cycles, 2 ports), and
the 1024 x 512 x 3072 GEMM of a user's linear ran 1.4 to 2 times faster so, side by side on a
2-core AVX-512 Xeon. Rows past M read row M - 1 (clamped, so the inner loop has no branch)
and are not written back; neither are the padding columns.

A decode step (rows = 1) runs one of two loops, chosen by M at run time. One row (M = 1): a
task per panel; for a BF16 weight the k loop is split over `GEMV_SPLIT` accumulator sets,
summed at the end (with one set, two FMAs per k wait on the two before them). A batch
(M > 1): tiles of `decode_rows(c)` rows, so a panel row is read and widened once for four
rows (AVX2 panels) or eight (AVX-512), not once a row (4-row tiles ran 3 to 4 times faster
than one row at M = 8; 8-row tiles on AVX-512 another 1.1x, bf16 weights). Float32 weights
keep one accumulator set, and every output is then the same k-ordered chain of FMAs in every
loop form: an fp32 model computes bit for bit what it did.

The loops are written out here (no `s_tir` schedule): a scheduled block with a row predicate
made LLVM keep the accumulators in memory.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from . import scratch

PANEL = 16  # columns per panel: two AVX2 vectors
WIDE_PANEL = 32  # two AVX-512 vectors
GEMV_SPLIT = 4  # accumulator sets of a BF16 GEMV: 4 x 2 vectors in flight
DECODE_ROWS = {PANEL: 4, WIDE_PANEL: 8}  # rows a tile of a decode step's batch: 8 (4) x 2 accumulators
WEIGHT_DTYPES = ("float32", "bfloat16")


def packed_rows(decode: bool, c: int = PANEL) -> int:
    """Rows per tile: 6 (8 for AVX-512 panels) for prefill GEMMs, 1 when M is the batch of a
    decode step (a GEMV)."""
    return 1 if decode else (8 if c == WIDE_PANEL else 6)


def decode_rows(c: int) -> int:
    """Rows a tile of a decode step's batch (M > 1) on panels of `c` columns: 2 x rows
    accumulators, 8 of AVX2's 16 registers or 16 of AVX-512's 32."""
    return DECODE_ROWS[c]


def widen(value, dtype: str):
    """A weight element of `dtype` as float32: bfloat16 is the high half of a float32 (LLVM
    emits a zero-extend and a 16-bit shift per vector), float32 is itself."""
    return value if dtype == "float32" else T.Cast("float32", value)


def packed_linear(K: int, N: int, rows: int, c: int = PANEL, wdtype: str = "float32") -> tirx.PrimFunc:
    """x [M, K], wp [ceil(N / c), K, c] (`wdtype`) -> y [M, N]; float32 compute, M dynamic."""
    if wdtype not in WEIGHT_DTYPES:
        raise ValueError(f"packed_linear: weight dtype {wdtype!r}; known: {', '.join(WEIGHT_DTYPES)}")
    if rows == 1:
        return _gemv(K, N, c, wdtype)
    P = T.int64((N + c - 1) // c)
    Kc, Nc, cc = T.int64(K), T.int64(N), T.int64(c)
    tiled = _tiled(P, K, N, c, rows, wdtype)

    @T.prim_func
    def kernel(x_h: T.handle, w_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})  # 8: opaque
        M = T.int64()
        x = T.match_buffer(x_h, (M, Kc), "float32")
        w = T.match_buffer(w_h, (P, Kc, cc), wdtype)
        y = T.match_buffer(y_h, (M, Nc), "float32")
        tiled(x, w, y, M)

    return kernel


def _tiled(P, K: int, N: int, c: int, rows: int, wdtype: str):
    """The tile loop: `rows` x `c` outputs a task, the k loop broadcasting x into the panel."""
    Kc, Nc, cc, R_ = T.int64(K), T.int64(N), T.int64(c), T.int64(rows)
    ragged = N % c != 0

    @T.macro
    def tiled(x, w, y, M):
        tiles: T.let = (M + R_ - T.int64(1)) // R_
        for t in T.parallel(P * tiles):
            acc = T.decl_buffer((R_, cc), "float32", scope=scratch("llvm"))
            for i in T.unroll(R_):
                for j in T.vectorized(cc):
                    acc[i, j] = T.float32(0)
            for k in range(Kc):
                for i in T.unroll(R_):
                    for j in T.vectorized(cc):
                        acc[i, j] = acc[i, j] + x[T.min((t % tiles) * R_ + i, M - T.int64(1)), k] * widen(
                            w[t // tiles, k, j], wdtype)
            for i in T.unroll(R_):
                if (t % tiles) * R_ + i < M:
                    if ragged:
                        for j in T.unroll(cc):
                            if (t // tiles) * cc + j < Nc:
                                y[(t % tiles) * R_ + i, (t // tiles) * cc + j] = acc[i, j]
                    else:
                        for j in T.vectorized(cc):
                            y[(t % tiles) * R_ + i, (t // tiles) * cc + j] = acc[i, j]

    return tiled


def _gemv(K: int, N: int, c: int, wdtype: str) -> tirx.PrimFunc:
    """packed_linear of a decode step: one row (M = 1) a task with the k loop over GEMV_SPLIT
    accumulator sets; a batch (M > 1) in tiles of decode_rows(c) rows, which share each panel
    row read (one row a task read the panel and widened it M times)."""
    split = GEMV_SPLIT if wdtype != "float32" and K >= GEMV_SPLIT else 1  # float32: k in order, as before
    P = T.int64((N + c - 1) // c)
    Kc, Nc, cc, S = T.int64(K), T.int64(N), T.int64(c), T.int64(split)
    Kmain = T.int64(K - K % split)
    ragged = N % c != 0
    tiled = _tiled(P, K, N, c, decode_rows(c), wdtype)

    @T.prim_func
    def kernel(x_h: T.handle, w_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        M = T.int64()
        x = T.match_buffer(x_h, (M, Kc), "float32")
        w = T.match_buffer(w_h, (P, Kc, cc), wdtype)
        y = T.match_buffer(y_h, (M, Nc), "float32")
        if M == T.int64(1):
            for t in T.parallel(P):
                acc = T.decl_buffer((S, cc), "float32", scope=scratch("llvm"))
                for s in T.unroll(S):
                    for j in T.vectorized(cc):
                        acc[s, j] = T.float32(0)
                for ko in range(Kmain // S):
                    for s in T.unroll(S):
                        for j in T.vectorized(cc):
                            acc[s, j] = acc[s, j] + x[T.int64(0), ko * S + s] * widen(w[t, ko * S + s, j], wdtype)
                for k in range(Kmain, Kc):
                    for j in T.vectorized(cc):
                        acc[0, j] = acc[0, j] + x[T.int64(0), k] * widen(w[t, k, j], wdtype)
                for s in T.unroll(T.int64(1), S):
                    for j in T.vectorized(cc):
                        acc[0, j] = acc[0, j] + acc[s, j]
                if ragged:
                    for j in T.unroll(cc):
                        if t * cc + j < Nc:
                            y[T.int64(0), t * cc + j] = acc[0, j]
                else:
                    for j in T.vectorized(cc):
                        y[T.int64(0), t * cc + j] = acc[0, j]
        else:
            tiled(x, w, y, M)

    return kernel
