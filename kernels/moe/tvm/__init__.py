"""The routed-expert GEMMs as TensorIR kernels, grouped by expert, with static shapes.

    gate_up:  gu[n, j, :] = h[n] @ w13[e]^T             e = idx[n, j];  w13 given as [E, 2I/F, D, F]
    down:     y[n, :]     = sum_j w[n, j] a[n, j] @ w2[e]^T           w2 given as [E, Dout/F, I, F]

One block per expert lists the (token, slot) pairs routed to it (a scan of idx: no sort, no
data-dependent shapes) and runs them as a small GEMM, `rows` pairs at a time against the
expert's weight, so each weight row is loaded once per tile of pairs rather than once per
pair. `down` writes each pair's row and a second block adds a token's k rows, so experts
never write the same output. The weights come packed in panels of F = `panel(out)` output
features, so that the reduction loop reads each panel contiguously; the backend's reshape
and `permute_dims` that pack them are lifted into the one-time parameter transform. The
feature loops run as vectors (llvm) or threads (cuda); the schedules run the experts in
parallel (llvm: each expert's panels cut in `parts`, so the threads' shares are equal) or one
per thread block (cuda). A tile holds `rows` routed rows: 6 x 16
accumulators fill AVX2's registers in prefill, one row suits a decode step.

`weights` says how the kernels hold the experts: "float32" panels as above, or "mxfp4": the
stored codes and scale bytes in panels (moe/tvm/mxfp4.py). An expert with one routed row
decodes them in registers, one panel row of F features at a time. On a CPU, an expert with two
rows or more decodes each panel once into a float32 buffer of in x F (32 KB at in = 512: the
task's cache) that all its row tiles read; decoding per tile of 6 rows bound the prefill
(k3-small's experts took 1.5 to 2.2 times the time). No float expert is ever held whole. The
rest of a kernel is the same for both formats, and so are the bits of every output, but for
a decode step's kernel on a CPU (one row a tile), whose MXFP4 form sums each output over
`chains` accumulators (k mod 4) where the float32 form keeps one chain in k order.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T

from ...common.tvm import inner_loop, scratch
from . import mxfp4 as mx

FORMATS = ("float32", "mxfp4")
PARTS = 2  # llvm: tasks an expert's output panels are cut into (`parts`)
CHAINS = 4  # llvm, MXFP4, one-row tiles: accumulator chains an output is summed over (`chains`)


def _tile(n: int, full: int) -> int:
    """The largest power of two up to `full` that divides n."""
    t = full
    while t > 1 and n % t:
        t //= 2
    return t


def panel(n: int) -> int:
    """Output features per weight panel: the largest power of two up to 16 that divides n."""
    return _tile(n, 16)


def chains(rows: int, mxfp4: bool, target: str) -> int:
    """Accumulator chains each output of a tile row sums over, input k going to chain k mod C,
    folded (c0 + c1) + (c2 + c3) at the end: CHAINS for a decode step's MXFP4 kernel on a CPU
    (one row a tile), else 1. With one chain every FMA of an output waits on the one before it
    (4 cycles), and a one-row tile has nothing else to run: the decode in registers then ran at
    about 4 weights a cycle a core. A tile of 6 rows has 6 chains already; float32 experts keep
    one, so an fp32 model computes what it did. The in-register and the decoded-panel forms
    split alike, so a token's outputs do not depend on which other tokens share its experts."""
    return CHAINS if mxfp4 and rows == 1 and target == "llvm" else 1


def _fold(C: int, rows: int, F: int, cols):
    """acc[r, 0, f] = the sum of row r's C chains, (c0 + c1) + (c2 + c3)."""
    if C not in (1, 2, 4):
        raise ValueError(f"routed-expert kernels: {C} accumulator chains; they fold 1, 2 or 4")

    @T.macro
    def fold(acc):
        if C > 1:
            for r in T.unroll(rows):
                for f in cols(F):
                    if C == 4:
                        acc[r, 0, f] = (acc[r, 0, f] + acc[r, 1, f]) + (acc[r, 2, f] + acc[r, 3, f])
                    else:
                        acc[r, 0, f] = acc[r, 0, f] + acc[r, 1, f]

    return fold


def parts(target: str) -> int:
    """Tasks an expert's output panels are cut into: the kernels run (part, expert) tasks, part
    outermost, so that a CPU's threads, each taking a contiguous run of tasks, take equal shares
    of every expert's panels whichever experts the tokens reach. One task an expert left the
    threads of a decode step unequal: of its 4 routed experts, 3 or all 4 fall in one thread's
    half of the 32 in 3 routings of 5. A GPU takes an expert a block."""
    return PARTS if target == "llvm" else 1


def weight_panels(fmt: str, E: int, n_out: int, n_in: int) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of an expert weight [E, n_out, n_in] in panels of `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f"routed-expert weights: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    F = panel(n_out)
    if fmt == "mxfp4":
        return (E, n_out // F, n_in // mx.G, mx.ROW, F), "uint8"
    return (E, n_out // F, n_in, F), "float32"


def table_form(lut: bool | str, mxfp4: bool, target: str, F: int) -> str | None:
    """The MXFP4 table decode a kernel takes: None (arithmetic), "avx2" or "avx512"."""
    if not (mxfp4 and lut and target == "llvm" and F in mx.LUT_LANES):
        return None
    return mx.lut_isa(F, "avx2" if lut is True else lut)


def moe_gate_up(E: int, D: int, I2: int, k: int, target: str = "llvm", rows: int = 6,
                weights: str = "float32", lut: bool | str = False) -> tirx.PrimFunc:
    """h [N, D], w13 panels (`weight_panels`), idx [N, k] (int64) -> gu [N, k, I2]; float32
    compute, F = panel(I2). `lut`: MXFP4 decoded by table on an x86 target, "avx2" (or True)
    or "avx512" (mxfp4.py)."""
    F = panel(I2)
    cols = inner_loop(target)
    local = scratch(target)  # the scope of the small per-task buffers
    wshape, wdtype = weight_panels(weights, E, I2, D)
    mxfp4 = weights == "mxfp4"
    form = table_form(lut, mxfp4, target, F)
    by_table = form is not None  # a Python bool: the macros branch on it as they are parsed
    table_row = mx.lut_row(F, form) if by_table else None
    NG, CB = D // mx.G, mx.CODE_BYTES
    buffered = mxfp4 and target == "llvm"  # a decoded panel in memory: a CPU's cache
    decode_panel = mx.panel_decoder(NG, F, form, cols)
    S, P = parts(target), I2 // F
    C = chains(rows, mxfp4, target)
    U, fold = max(1, C // 2), _fold(C, rows, F, cols)  # U: code bytes a step of the in-register loop

    @T.macro
    def in_registers(w, h, tok, ve, fo, acc, sc, lo, hi, cd):  # each panel row decoded once for a tile
        for g in range(NG):
            for f in cols(F):
                sc[f] = mx.e8m0(T.Cast("int32", w[ve, fo, g, CB, f]))
            for jo in range(CB // U):
                for u in T.unroll(U):  # k = 2 j and 2 j + 1 go to chains (2 u) mod C and (2 u + 1) mod C
                    if by_table:
                        table_row(w, ve, fo, g, jo * U + u, sc, lo, hi, cd)
                    else:
                        for f in cols(F):
                            lo[f] = mx.e2m1(mx.low(w[ve, fo, g, jo * U + u, f])) * sc[f]
                            hi[f] = mx.e2m1(mx.high(w[ve, fo, g, jo * U + u, f])) * sc[f]
                    for r in T.unroll(rows):
                        for f in cols(F):
                            acc[r, 2 * u % C, f] = (acc[r, 2 * u % C, f]
                                                    + h[tok[r], g * mx.G + 2 * (jo * U + u)] * lo[f])
                            acc[r, (2 * u + 1) % C, f] = (acc[r, (2 * u + 1) % C, f]
                                                          + h[tok[r], g * mx.G + 2 * (jo * U + u) + 1] * hi[f])

    @T.prim_func(s_tir=True)
    def kernel(h_h: T.handle, w: T.Buffer(wshape, wdtype), idx_h: T.handle, gu_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        h = T.match_buffer(h_h, (N, D), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        gu = T.match_buffer(gu_h, (N, k, I2), "float32")
        pairs = T.alloc_buffer((S * E, N * k), "int64")  # per task: the (token, slot) pairs routed to its expert
        for t in range(S * E):
            with T.sblock("expert"):
                vt = T.axis.spatial(S * E, t)
                T.reads(h[0:N, 0:D], w[vt % E, 0:P, 0:D, 0:F] if not mxfp4 else w[vt % E, 0:P, 0:NG, 0:mx.ROW, 0:F],
                        idx[0:N, 0:k])
                T.writes(gu[0:N, 0:k, 0:I2], pairs[vt, 0:N * k])
                cnt = T.alloc_buffer((1,), "int64", scope=local)
                acc = T.alloc_buffer((rows, C, F), "float32", scope=local)
                tok = T.alloc_buffer((rows,), "int64", scope=local)
                sc = T.alloc_buffer((F,), "float32", scope=local)
                lo = T.alloc_buffer((F,), "float32", scope=local)
                hi = T.alloc_buffer((F,), "float32", scope=local)
                cd = T.alloc_buffer((F,), "int32", scope=local)
                wb = T.alloc_buffer((D if buffered else 1, F), "float32", scope=local)  # a decoded panel
                ve: T.let = vt % E
                cnt[0] = T.int64(0)
                for p in range(N * k):
                    if idx[p // k, p % k] == T.Cast("int64", ve):
                        pairs[vt, cnt[0]] = p
                        cnt[0] = cnt[0] + 1
                if mxfp4:
                    for fo in range(vt // E * P // S, (vt // E + 1) * P // S):
                        if buffered:
                            if cnt[0] >= 2:  # two rows or more: decode the panel once for all of them
                                decode_panel(w, ve, fo, wb, sc, lo, hi, cd)
                        for tile in range((cnt[0] + rows - 1) // rows):
                            for r in T.unroll(rows):
                                tok[r] = pairs[vt, T.min(tile * rows + r, cnt[0] - 1)] // k
                            for r, c in T.grid(rows, C):
                                for f in cols(F):
                                    acc[r, c, f] = T.float32(0)
                            if buffered:
                                if cnt[0] >= 2:
                                    for do in range(D // C):
                                        for c in T.unroll(C):
                                            for r in T.unroll(rows):
                                                for f in cols(F):
                                                    acc[r, c, f] = (acc[r, c, f]
                                                                    + h[tok[r], do * C + c] * wb[do * C + c, f])
                                else:
                                    in_registers(w, h, tok, ve, fo, acc, sc, lo, hi, cd)
                            else:
                                in_registers(w, h, tok, ve, fo, acc, sc, lo, hi, cd)
                            fold(acc)
                            for r in T.unroll(rows):
                                if tile * rows + r < cnt[0]:
                                    for f in cols(F):
                                        gu[pairs[vt, tile * rows + r] // k, pairs[vt, tile * rows + r] % k,
                                           fo * F + f] = acc[r, 0, f]
                else:
                    for tile in range((cnt[0] + rows - 1) // rows):
                        for r in T.unroll(rows):
                            tok[r] = pairs[vt, T.min(tile * rows + r, cnt[0] - 1)] // k
                        for fo in range(vt // E * P // S, (vt // E + 1) * P // S):
                            for r in T.unroll(rows):
                                for f in cols(F):
                                    acc[r, 0, f] = T.float32(0)
                            for d in range(D):
                                for r in T.unroll(rows):
                                    for f in cols(F):
                                        acc[r, 0, f] = acc[r, 0, f] + h[tok[r], d] * w[ve, fo, d, f]
                            for r in T.unroll(rows):
                                if tile * rows + r < cnt[0]:
                                    for f in cols(F):
                                        gu[pairs[vt, tile * rows + r] // k, pairs[vt, tile * rows + r] % k,
                                           fo * F + f] = acc[r, 0, f]

    return kernel


def moe_down(E: int, I: int, Dout: int, k: int, target: str = "llvm", rows: int = 6,
             weights: str = "float32", lut: bool | str = False) -> tirx.PrimFunc:
    """a [N, k, I], w2 panels (`weight_panels`), idx [N, k] (int64), w [N, k] -> y [N, Dout];
    float32 compute, F = panel(Dout). `lut` as for moe_gate_up."""
    F = panel(Dout)
    cols = inner_loop(target)
    local = scratch(target)  # the scope of the small per-task buffers
    wshape, wdtype = weight_panels(weights, E, Dout, I)
    mxfp4 = weights == "mxfp4"
    form = table_form(lut, mxfp4, target, F)
    by_table = form is not None  # a Python bool: the macros branch on it as they are parsed
    table_row = mx.lut_row(F, form) if by_table else None
    NG, CB = I // mx.G, mx.CODE_BYTES
    buffered = mxfp4 and target == "llvm"  # a decoded panel in memory: a CPU's cache
    decode_panel = mx.panel_decoder(NG, F, form, cols)
    S, P = parts(target), Dout // F
    C = chains(rows, mxfp4, target)
    U, fold = max(1, C // 2), _fold(C, rows, F, cols)  # U: code bytes a step of the in-register loop

    @T.macro
    def in_registers(w2, a, pr, ve, fo, acc, sc, lo, hi, cd):  # each panel row decoded once for a tile
        for g in range(NG):
            for f in cols(F):
                sc[f] = mx.e8m0(T.Cast("int32", w2[ve, fo, g, CB, f]))
            for jo in range(CB // U):
                for u in T.unroll(U):  # k = 2 j and 2 j + 1 go to chains (2 u) mod C and (2 u + 1) mod C
                    if by_table:
                        table_row(w2, ve, fo, g, jo * U + u, sc, lo, hi, cd)
                    else:
                        for f in cols(F):
                            lo[f] = mx.e2m1(mx.low(w2[ve, fo, g, jo * U + u, f])) * sc[f]
                            hi[f] = mx.e2m1(mx.high(w2[ve, fo, g, jo * U + u, f])) * sc[f]
                    for r in T.unroll(rows):
                        for f in cols(F):
                            acc[r, 2 * u % C, f] = (acc[r, 2 * u % C, f]
                                                    + a[pr[r] // k, pr[r] % k, g * mx.G + 2 * (jo * U + u)] * lo[f])
                            acc[r, (2 * u + 1) % C, f] = (acc[r, (2 * u + 1) % C, f]
                                                          + a[pr[r] // k, pr[r] % k, g * mx.G + 2 * (jo * U + u) + 1]
                                                          * hi[f])

    @T.prim_func(s_tir=True)
    def kernel(a_h: T.handle, w2: T.Buffer(wshape, wdtype), idx_h: T.handle, cw_h: T.handle, y_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int64()
        a = T.match_buffer(a_h, (N, k, I), "float32")
        idx = T.match_buffer(idx_h, (N, k), "int64")
        cw = T.match_buffer(cw_h, (N, k), "float32")
        y = T.match_buffer(y_h, (N, Dout), "float32")
        ys = T.alloc_buffer((N, k, Dout), "float32")  # each (token, slot)'s weighted expert output
        pairs = T.alloc_buffer((S * E, N * k), "int64")  # per task: the (token, slot) pairs routed to its expert
        for t in range(S * E):
            with T.sblock("expert"):
                vt = T.axis.spatial(S * E, t)
                T.reads(a[0:N, 0:k, 0:I], w2[vt % E, 0:P, 0:I, 0:F] if not mxfp4
                        else w2[vt % E, 0:P, 0:NG, 0:mx.ROW, 0:F], idx[0:N, 0:k], cw[0:N, 0:k])
                T.writes(ys[0:N, 0:k, 0:Dout], pairs[vt, 0:N * k])
                cnt = T.alloc_buffer((1,), "int64", scope=local)
                acc = T.alloc_buffer((rows, C, F), "float32", scope=local)
                pr = T.alloc_buffer((rows,), "int64", scope=local)
                sc = T.alloc_buffer((F,), "float32", scope=local)
                lo = T.alloc_buffer((F,), "float32", scope=local)
                hi = T.alloc_buffer((F,), "float32", scope=local)
                cd = T.alloc_buffer((F,), "int32", scope=local)
                wb = T.alloc_buffer((I if buffered else 1, F), "float32", scope=local)  # a decoded panel
                ve: T.let = vt % E
                cnt[0] = T.int64(0)
                for p in range(N * k):
                    if idx[p // k, p % k] == T.Cast("int64", ve):
                        pairs[vt, cnt[0]] = p
                        cnt[0] = cnt[0] + 1
                if mxfp4:
                    for fo in range(vt // E * P // S, (vt // E + 1) * P // S):
                        if buffered:
                            if cnt[0] >= 2:  # two rows or more: decode the panel once for all of them
                                decode_panel(w2, ve, fo, wb, sc, lo, hi, cd)
                        for tile in range((cnt[0] + rows - 1) // rows):
                            for r in T.unroll(rows):
                                pr[r] = pairs[vt, T.min(tile * rows + r, cnt[0] - 1)]
                            for r, c in T.grid(rows, C):
                                for f in cols(F):
                                    acc[r, c, f] = T.float32(0)
                            if buffered:
                                if cnt[0] >= 2:
                                    for io in range(I // C):
                                        for c in T.unroll(C):
                                            for r in T.unroll(rows):
                                                for f in cols(F):
                                                    acc[r, c, f] = (acc[r, c, f] + a[pr[r] // k, pr[r] % k, io * C + c]
                                                                    * wb[io * C + c, f])
                                else:
                                    in_registers(w2, a, pr, ve, fo, acc, sc, lo, hi, cd)
                            else:
                                in_registers(w2, a, pr, ve, fo, acc, sc, lo, hi, cd)
                            fold(acc)
                            for r in T.unroll(rows):
                                if tile * rows + r < cnt[0]:
                                    for f in cols(F):
                                        ys[pairs[vt, tile * rows + r] // k, pairs[vt, tile * rows + r] % k,
                                           fo * F + f] = acc[r, 0, f] * cw[pairs[vt, tile * rows + r] // k,
                                                                        pairs[vt, tile * rows + r] % k]
                else:
                    for tile in range((cnt[0] + rows - 1) // rows):
                        for r in T.unroll(rows):
                            pr[r] = pairs[vt, T.min(tile * rows + r, cnt[0] - 1)]
                        for fo in range(vt // E * P // S, (vt // E + 1) * P // S):
                            for r in T.unroll(rows):
                                for f in cols(F):
                                    acc[r, 0, f] = T.float32(0)
                            for i in range(I):
                                for r in T.unroll(rows):
                                    for f in cols(F):
                                        acc[r, 0, f] = acc[r, 0, f] + a[pr[r] // k, pr[r] % k, i] * w2[ve, fo, i, f]
                            for r in T.unroll(rows):
                                if tile * rows + r < cnt[0]:
                                    for f in cols(F):
                                        ys[pairs[vt, tile * rows + r] // k, pairs[vt, tile * rows + r] % k,
                                           fo * F + f] = acc[r, 0, f] * cw[pairs[vt, tile * rows + r] // k,
                                                                        pairs[vt, tile * rows + r] % k]
        for n, d in T.grid(N, Dout):
            with T.sblock("combine"):
                vn, vd = T.axis.remap("SS", [n, d])
                T.reads(ys[vn, 0:k, vd])
                T.writes(y[vn, vd])
                total = T.alloc_buffer((1,), "float32", scope=local)
                total[0] = ys[vn, 0, vd]
                for j in range(1, k):
                    total[0] = total[0] + ys[vn, j, vd]
                y[vn, vd] = total[0]

    return kernel


def schedule_llvm(sch: s_tir.Schedule) -> None:
    """The experts in parallel; the combine over tokens in parallel."""
    (e,) = sch.get_loops(sch.get_sblock("expert"))
    sch.parallel(e)
    try:
        combine = sch.get_sblock("combine")
    except s_tir.ScheduleError:
        return
    n, _ = sch.get_loops(combine)
    sch.parallel(n)


def schedule_cuda(sch: s_tir.Schedule, threads: int = 128) -> None:
    """An expert per thread block (its feature loops on the threads); the combine flattened."""
    (e,) = sch.get_loops(sch.get_sblock("expert"))
    sch.bind(e, "blockIdx.x")
    try:
        combine = sch.get_sblock("combine")
    except s_tir.ScheduleError:
        return
    bx, tx = sch.split(sch.fuse(*sch.get_loops(combine)), factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


SCHEDULES = {"llvm": schedule_llvm, "cuda": schedule_cuda}
GATE_UP_SCHEDULES = DOWN_SCHEDULES = SCHEDULES
