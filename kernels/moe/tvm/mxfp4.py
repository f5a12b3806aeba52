"""The routed-expert GEMMs on MXFP4 experts as TensorIR kernels: the codes are decoded in the
kernel's inner loop, so the float experts never exist in memory.

    gate_up:  gu[n, j, :] = h[n] @ decode(w13[e])^T          e = idx[n, j]
    down:     y[n, :]     = sum_j w[n, j] a[n, j] @ decode(w2[e])^T

The same grouping as the float kernels (moe/tvm/__init__.py: one block per expert over the pairs
routed to it, `rows` pairs per tile). The weights come as one E2M1 code per byte in panels of F
output features, codes [E, out / F, in, F] (uint8), with the groups' E8M0 scales as float32
[E, out / F, in / 32, F]: the backend unpacks the two codes of each stored byte and turns each
scale byte into its power of two in the one-time parameter transform, so a weight costs 1.125
bytes in memory (0.53 on disk) instead of float32's 4. A weight is lut[code] * scale: the
16 E2M1 values come as a small table, and both factors are exact in float32.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop
from ...mxfp4.naive import GROUP_SIZE
from . import SCHEDULES, panel  # noqa: F401  (the float kernels' schedules fit these)

G = GROUP_SIZE


def moe_gate_up_mxfp4(E: int, D: int, I2: int, k: int, target: str = "llvm", rows: int = 6) -> tirx.PrimFunc:
    """h [N, D], codes [E, I2/F, D, F] u8, scales [E, I2/F, D/32, F], lut [16], idx [N, k] -> gu [N, k, I2]."""
    F = panel(I2)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(h_h: T.handle, codes: T.Buffer((E, I2 // F, D, F), "uint8"),
               scales: T.Buffer((E, I2 // F, D // G, F), "float32"), lut: T.Buffer((16,), "float32"),
               idx_h: T.handle, gu_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        h = T.match_buffer(h_h, (N, D), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        gu = T.match_buffer(gu_h, (N, k, I2), "float32")
        pairs = T.alloc_buffer((E, N * k), "int64")
        for e in range(E):
            with T.sblock("expert"):
                ve = T.axis.spatial(E, e)
                T.reads(h[0:N, 0:D], codes[ve, 0:I2 // F, 0:D, 0:F], scales[ve, 0:I2 // F, 0:D // G, 0:F],
                        lut[0:16], idx[0:N, 0:k])
                T.writes(gu[0:N, 0:k, 0:I2], pairs[ve, 0:N * k])
                cnt = T.alloc_buffer((1,), "int64", scope="local")
                acc = T.alloc_buffer((rows, F), "float32", scope="local")
                wv = T.alloc_buffer((F,), "float32", scope="local")
                tok = T.alloc_buffer((rows,), "int64", scope="local")
                cnt[0] = T.int64(0)
                for p in range(N * k):
                    if idx[p // k, p % k] == T.Cast("int64", ve):
                        pairs[ve, cnt[0]] = p
                        cnt[0] = cnt[0] + 1
                for tile in range((cnt[0] + rows - 1) // rows):
                    for r in T.unroll(rows):
                        tok[r] = pairs[ve, T.min(tile * rows + r, cnt[0] - 1)] // k
                    for fo in range(I2 // F):
                        for r in T.unroll(rows):
                            for f in cols(F):
                                acc[r, f] = T.float32(0)
                        for d in range(D):
                            for f in cols(F):  # the panel row of weights, decoded once for all rows
                                wv[f] = lut[T.Cast("int32", codes[ve, fo, d, f])] * scales[ve, fo, d // G, f]
                            for r in T.unroll(rows):
                                for f in cols(F):
                                    acc[r, f] = acc[r, f] + h[tok[r], d] * wv[f]
                        for r in T.unroll(rows):
                            if tile * rows + r < cnt[0]:
                                for f in cols(F):
                                    gu[pairs[ve, tile * rows + r] // k, pairs[ve, tile * rows + r] % k,
                                       fo * F + f] = acc[r, f]

    return kernel


def moe_down_mxfp4(E: int, I: int, Dout: int, k: int, target: str = "llvm", rows: int = 6) -> tirx.PrimFunc:
    """a [N, k, I], codes [E, Dout/F, I, F] u8, scales [E, Dout/F, I/32, F], lut [16], idx [N, k],
    w [N, k] -> y [N, Dout]."""
    F = panel(Dout)
    cols = inner_loop(target)

    @T.prim_func(s_tir=True)
    def kernel(a_h: T.handle, codes: T.Buffer((E, Dout // F, I, F), "uint8"),
               scales: T.Buffer((E, Dout // F, I // G, F), "float32"), lut: T.Buffer((16,), "float32"),
               idx_h: T.handle, cw_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        a = T.match_buffer(a_h, (N, k, I), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        cw = T.match_buffer(cw_h, (N, k), "float32")
        y = T.match_buffer(y_h, (N, Dout), "float32")
        ys = T.alloc_buffer((N, k, Dout), "float32")
        pairs = T.alloc_buffer((E, N * k), "int64")
        for e in range(E):
            with T.sblock("expert"):
                ve = T.axis.spatial(E, e)
                T.reads(a[0:N, 0:k, 0:I], codes[ve, 0:Dout // F, 0:I, 0:F], scales[ve, 0:Dout // F, 0:I // G, 0:F],
                        lut[0:16], idx[0:N, 0:k], cw[0:N, 0:k])
                T.writes(ys[0:N, 0:k, 0:Dout], pairs[ve, 0:N * k])
                cnt = T.alloc_buffer((1,), "int64", scope="local")
                acc = T.alloc_buffer((rows, F), "float32", scope="local")
                wv = T.alloc_buffer((F,), "float32", scope="local")
                pr = T.alloc_buffer((rows,), "int64", scope="local")
                cnt[0] = T.int64(0)
                for p in range(N * k):
                    if idx[p // k, p % k] == T.Cast("int64", ve):
                        pairs[ve, cnt[0]] = p
                        cnt[0] = cnt[0] + 1
                for tile in range((cnt[0] + rows - 1) // rows):
                    for r in T.unroll(rows):
                        pr[r] = pairs[ve, T.min(tile * rows + r, cnt[0] - 1)]
                    for fo in range(Dout // F):
                        for r in T.unroll(rows):
                            for f in cols(F):
                                acc[r, f] = T.float32(0)
                        for i in range(I):
                            for f in cols(F):
                                wv[f] = lut[T.Cast("int32", codes[ve, fo, i, f])] * scales[ve, fo, i // G, f]
                            for r in T.unroll(rows):
                                for f in cols(F):
                                    acc[r, f] = acc[r, f] + a[pr[r] // k, pr[r] % k, i] * wv[f]
                        for r in T.unroll(rows):
                            if tile * rows + r < cnt[0]:
                                for f in cols(F):
                                    ys[pairs[ve, tile * rows + r] // k, pairs[ve, tile * rows + r] % k,
                                       fo * F + f] = acc[r, f] * cw[pairs[ve, tile * rows + r] // k,
                                                                    pairs[ve, tile * rows + r] % k]
        for n, d in T.grid(N, Dout):
            with T.sblock("combine"):
                vn, vd = T.axis.remap("SS", [n, d])
                T.reads(ys[vn, 0:k, vd])
                T.writes(y[vn, vd])
                total = T.alloc_buffer((1,), "float32", scope="local")
                total[0] = ys[vn, 0, vd]
                for j in range(1, k):
                    total[0] = total[0] + ys[vn, j, vd]
                y[vn, vd] = total[0]

    return kernel
