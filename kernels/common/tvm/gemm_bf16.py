"""`linear` with BF16 operands on the CPU's BF16 dot products (AVX-512 BF16, `vdpbf16ps`):
y[M, N] = x[M, K] @ W[N, K]^T, float32 accumulation, for the compute="bf16" policy's prefill
GEMMs on a target that has `avx512bf16` (backends/tvm/target.py decides; fp32 panels elsewhere).

`vdpbf16ps acc, a, b` takes 32 BF16 values a 512-bit operand, as 16 pairs: lane i adds
a[2i+1] b[2i+1] and then a[2i] b[2i] to its float32 accumulator (each product of two BF16
values is exact in float32). So both operands are packed in pairs along K, the even k in the
low 16 bits of a 32-bit word:

    xp[m, q]    = bf16(x[m, 2q]) | bf16(x[m, 2q + 1]) << 16          [M, ceil(K / 2)] uint32
    wp[p, q, j] = bf16(W[p c + j, 2q]) | bf16(W[p c + j, 2q + 1]) << 16    [ceil(N / c), ceil(K / 2), c]

with zeros past K and past N. One x word is broadcast to 16 lanes and multiplied with 16
columns of a panel row: a tile of `rows` x `c` outputs takes rows x c / 16 accumulators (8 x 2:
16 of AVX-512's 32 registers), as the float32 panel kernel (gemm.py) does, with half its k
steps. The weight packing is weight-only work (lifted to load, 2 bytes an element, as
stored); the activation packing is O(M K) per call. BF16 operands: x is rounded to BF16 (to
nearest, ties to even; NaN stays NaN); under compute="bf16" it already holds BF16 values.

TVM widens every bfloat16 value to float32 before LLVM (BF16ComputeLegalize), so the
instruction is reached through a small LLVM function imported into the module
(`pragma_import_llvm`) that takes the pairs as 32-bit integers. `dot="emulated"` imports the
same function written with two float32 FMAs (odd pair element first, as the instruction adds
them), so a host without AVX-512 BF16 runs the same packing and loops; it differs from the
instruction only in subnormals, which the instruction flushes to zero.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from . import scratch

LANES = 16  # float32 lanes of a 512-bit vector
PANEL = 32  # columns per panel: two vectors
ROWS = 8  # rows per tile: 8 x 2 accumulators
FN = "k3c_dpbf16ps"
DOTS = ("native", "emulated")

_NATIVE = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define linkonce_odr <16 x float> @{FN}(<16 x float> %c, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %a2 = bitcast <16 x i32> %a to <32 x bfloat>
  %b2 = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %a2, <32 x bfloat> %b2)
  ret <16 x float> %r
}}
"""

_HI = ", ".join(["i32 -65536"] * LANES)
_EMULATED = f"""
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
define linkonce_odr <16 x float> @{FN}(<16 x float> %c, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %a_lo = shl <16 x i32> %a, splat (i32 16)
  %b_lo = shl <16 x i32> %b, splat (i32 16)
  %a_hi = and <16 x i32> %a, <{_HI}>
  %b_hi = and <16 x i32> %b, <{_HI}>
  %fa_lo = bitcast <16 x i32> %a_lo to <16 x float>
  %fb_lo = bitcast <16 x i32> %b_lo to <16 x float>
  %fa_hi = bitcast <16 x i32> %a_hi to <16 x float>
  %fb_hi = bitcast <16 x i32> %b_hi to <16 x float>
  %t = call <16 x float> @llvm.fma.v16f32(<16 x float> %fa_hi, <16 x float> %fb_hi, <16 x float> %c)
  %r = call <16 x float> @llvm.fma.v16f32(<16 x float> %fa_lo, <16 x float> %fb_lo, <16 x float> %t)
  ret <16 x float> %r
}}
"""


def _half(v, dtype: str):
    """The BF16 bits of element v (float32: rounded to nearest even, NaN kept a NaN) as uint32."""
    if dtype == "bfloat16":
        return T.reinterpret("uint32", T.Cast("float32", v)) >> T.uint32(16)  # exact: bf16 -> f32 is a shift
    bits = T.reinterpret("uint32", v)
    rounded = bits + T.uint32(0x7FFF) + ((bits >> T.uint32(16)) & T.uint32(1))
    return T.if_then_else(bits & T.uint32(0x7FFFFFFF) > T.uint32(0x7F800000), T.uint32(0x7FC0),
                          rounded >> T.uint32(16))


def _pair(buf, row, q, K, dtype: str):
    """The uint32 word of BF16 pair q of row `row` of buf [rows, K]: k = 2q low, 2q + 1 high (0 past K)."""
    hi = T.if_then_else(q * 2 + 1 < K, _half(buf[row, T.min(q * 2 + 1, K - 1)], dtype), T.uint32(0))
    return _half(buf[row, q * 2], dtype) | (hi << T.uint32(16))


def pack_rows(K: int, dtype: str = "float32") -> tirx.PrimFunc:
    """x [M, K] (`dtype`) -> xp [M, ceil(K / 2)] uint32: BF16 pairs along K, M dynamic."""
    Kc, K2 = T.int64(K), T.int64((K + 1) // 2)

    @T.prim_func(s_tir=True)  # blocks: Relax's reshape analysis reads every one-input call_tir
    def pack(x_h: T.handle, xp_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        M = T.int64()
        x = T.match_buffer(x_h, (M, Kc), dtype)
        xp = T.match_buffer(xp_h, (M, K2), "uint32")
        for m in T.parallel(M):
            for q in range(K2):
                with T.sblock("pack_rows"):
                    vm, vq = T.axis.remap("SS", [m, q])
                    xp[vm, vq] = _pair(x, vm, vq, Kc, dtype)

    return pack


def pack_panels(N: int, K: int, c: int = PANEL, dtype: str = "bfloat16") -> tirx.PrimFunc:
    """W [N, K] (`dtype`) -> wp [ceil(N / c), ceil(K / 2), c] uint32: BF16 pairs along K per column."""
    Nc, Kc, cc = T.int64(N), T.int64(K), T.int64(c)
    P, K2 = T.int64((N + c - 1) // c), T.int64((K + 1) // 2)

    @T.prim_func(s_tir=True)
    def pack(w_h: T.handle, wp_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        w = T.match_buffer(w_h, (Nc, Kc), dtype)
        wp = T.match_buffer(wp_h, (P, K2, cc), "uint32")
        for p in T.parallel(P):
            for q, j in T.grid(K2, cc):
                with T.sblock("pack_panels"):
                    vp, vq, vj = T.axis.remap("SSS", [p, q, j])
                    wp[vp, vq, vj] = T.if_then_else(vp * cc + vj < Nc,
                                                    _pair(w, T.min(vp * cc + vj, Nc - 1), vq, Kc, dtype), T.uint32(0))

    return pack


def dot_linear(K: int, N: int, rows: int = ROWS, c: int = PANEL, dot: str = "native") -> tirx.PrimFunc:
    """xp [M, ceil(K / 2)] uint32, wp [ceil(N / c), ceil(K / 2), c] uint32 -> y [M, N] float32."""
    if dot not in DOTS or c % LANES:
        raise ValueError(f"dot_linear: dot {dot!r} (known: {', '.join(DOTS)}), panel {c} (a multiple of {LANES})")
    P, K2 = T.int64((N + c - 1) // c), T.int64((K + 1) // 2)
    Nc, cc, R_, V = T.int64(N), T.int64(c), T.int64(rows), c // LANES
    ragged = N % c != 0
    ll = _NATIVE if dot == "native" else _EMULATED

    @T.prim_func
    def kernel(x_h: T.handle, w_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        M = T.int64()
        x = T.match_buffer(x_h, (M, K2), "uint32")
        w = T.match_buffer(w_h, (P, K2, cc), "uint32")
        y = T.match_buffer(y_h, (M, Nc), "float32")
        with T.attr(0, "pragma_import_llvm", ll):
            tiles: T.let = (M + R_ - T.int64(1)) // R_
            for t in T.parallel(P * tiles):
                acc = T.decl_buffer((R_, cc), "float32", scope=scratch("llvm"))
                for i in T.unroll(R_):
                    for j in T.vectorized(cc):
                        acc[i, j] = T.float32(0)
                for q in range(K2):
                    for i in T.unroll(R_):
                        for v in T.unroll(V):
                            acc[i, T.ramp(v * LANES, 1, LANES)] = T.call_extern(
                                "float32x16", FN, acc[i, T.ramp(v * LANES, 1, LANES)],
                                T.Broadcast(x[T.min((t % tiles) * R_ + i, M - T.int64(1)), q], LANES),
                                w[t // tiles, q, T.ramp(v * LANES, 1, LANES)])
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


def round_bf16(chunk: int = 256) -> tirx.PrimFunc:
    """x [n] float32 -> y [n] float32: each value rounded to the nearest BF16 value (ties to even;
    NaN stays NaN), n dynamic. The compute="bf16" policy's rounding of a GEMM operand is a cast
    to bf16 and back, and TVM's TIR drops such a pair when both casts land in one expression
    (BF16ComputeLegalize): computed on the bits here, the rounding survives that. Opaque and
    scheduled here (chunks of `chunk` a task), so Relax fuses it with nothing."""
    C = T.int64(chunk)

    @T.prim_func(s_tir=True)
    def kernel(x_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        n = T.int64()
        x = T.match_buffer(x_h, (n,), "float32")
        y = T.match_buffer(y_h, (n,), "float32")
        for o in T.parallel((n + C - T.int64(1)) // C):
            for i in range(C):
                with T.sblock("round_bf16"):
                    v = T.axis.spatial(n, o * C + i)
                    T.where(o * C + i < n)
                    y[v] = T.reinterpret("float32", _half(x[v], "float32") << T.uint32(16))

    return kernel
