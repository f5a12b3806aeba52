"""How the routed-expert kernels (moe/tvm/__init__.py) read MXFP4 experts: the stored bytes,
re-laid out in panels, decoded in registers (kernels/mxfp4/naive.py defines the format).

    panels [E, out / F, in / 32, 17, F] uint8    per group of 32 inputs and output feature f:
        bytes 0..15   the group's 32 codes as stored, two a byte (low nibble = even k)
        byte 16       the group's E8M0 scale byte

So a weight costs what it costs on disk (4.25 bits), and the panel of F features is read
contiguously, group by group. The backend builds the panels with reshapes, a permute and a
concat, weight-only work that the build lifts into the one-time parameter transform.
A weight is e2m1(code) * e8m0(scale), both built from bits (exact, as the definition is), or, on
an x86 target with AVX2 or AVX-512, the E2M1 value looked up in a vector table (`lut_row`): the
same bits.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ...mxfp4.naive import E8M0_NAN, GROUP_SIZE

G = GROUP_SIZE
CODE_BYTES = GROUP_SIZE // 2  # bytes of codes a group (index of its scale byte in a panel row)
ROW = CODE_BYTES + 1


def e2m1(code):
    """The value of a 4-bit code (int32, 0..15): magnitudes 2..7 are the float32 with exponent
    (code >> 1) - 1 and mantissa bit (code & 1), i.e. bits (mag << 22) + 0x3F000000;
    0 and 1 are 0 and 0.5; bit 3 the sign (code 8 is -0.0, as in the table)."""
    mag = T.bitwise_and(code, 7)
    normal = T.reinterpret("float32", T.shift_left(mag, 22) + 0x3F000000)
    value = T.Select(mag >= 2, normal, T.Cast("float32", mag) * T.float32(0.5))
    return T.Select(T.bitwise_and(code, 8) != 0, -value, value)


def e8m0(byte):
    """2^(byte - 127) of a scale byte (int32) as float32: the exponent field for 1..254, the
    subnormal 2^-127 for 0, NaN for 255."""
    bits = T.Select(byte == 0, 0x00400000, T.Select(byte == E8M0_NAN, 0x7FC00000, T.shift_left(byte, 23)))
    return T.reinterpret("float32", bits)


def low(byte):
    """The code of the even k of a stored byte (uint8) as int32."""
    return T.bitwise_and(T.Cast("int32", byte), 15)


def high(byte):
    """The code of the odd k of a stored byte (uint8) as int32."""
    return T.shift_right(T.Cast("int32", byte), 4)


# The decode by table on x86 (`lut` of the expert kernels, chosen from the target's features
# when the module is lowered). With AVX2, `vpermps` picks each code's magnitude from the 8 E2M1
# magnitudes by its low 3 bits, and bit 3 becomes the sign bit: 4 or 5 vector operations for 8
# weights, where the arithmetic decode above takes 11 or 12. With AVX-512, one 16-lane `vpermps`
# reads the whole signed value from a 16-entry table by the code's 4 bits (the bits above are
# ignored, so the odd k's code needs only the shift): 2 operations for 16 weights. The same
# values bit for bit either way (-0.0 for code 8 too). The table is a vector register, so it is
# an LLVM function imported into the module (TVM's vector gather would not reach the instruction).
LUT_LANES = (8, 16)  # panel widths the table decode takes (two AVX2 vectors, or one AVX-512 vector, at 16)
LUT_ISAS = ("avx2", "avx512")
LUT_FN = "k3c_e2m1_x{lanes}"
_MAGNITUDES = "<8 x float> <float 0.0, float 0.5, float 1.0, float 1.5, float 2.0, float 3.0, float 4.0, float 6.0>"
_SIGNED = ("<16 x float> <float 0.0, float 0.5, float 1.0, float 1.5, float 2.0, float 3.0, float 4.0, float 6.0, "
           "float -0.0, float -0.5, float -1.0, float -1.5, float -2.0, float -3.0, float -4.0, float -6.0>")


def lut_isa(lanes: int, isa: str) -> str:
    """The table form a panel of `lanes` takes on `isa`: the 16-lane table needs 16 lanes."""
    if isa not in LUT_ISAS:
        raise ValueError(f"MXFP4 table decode: isa {isa!r}; known: {', '.join(LUT_ISAS)}")
    return isa if lanes == 16 else "avx2"


def lut_fn(lanes: int, isa: str = "avx2") -> str:
    """The LLVM function's name: one per lane count and form, as both may meet in a module."""
    return LUT_FN.format(lanes=lanes) + ("_avx512" if lut_isa(lanes, isa) == "avx512" else "")


def lut_ll(lanes: int, isa: str = "avx2") -> str:
    """LLVM IR of `lut_fn(lanes, isa)`: int32 lanes holding a code in bits 0-3 (bits 4 and up
    ignored) -> their E2M1 values as float32."""
    fn = lut_fn(lanes, isa)
    if lut_isa(lanes, isa) == "avx512":
        return "\n".join([
            "declare <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float>, <16 x i32>)",
            f"define linkonce_odr <16 x float> @{fn}(<16 x i32> %c) alwaysinline {{",
            f"  %r = call <16 x float> @llvm.x86.avx512.permvar.sf.512({_SIGNED}, <16 x i32> %c)",
            "  ret <16 x float> %r", "}"]) + "\n"
    halves = lanes // 8
    lines = ["declare <8 x float> @llvm.x86.avx2.permps(<8 x float>, <8 x i32>)",
             f"define linkonce_odr <{lanes} x float> @{fn}(<{lanes} x i32> %c) alwaysinline {{"]
    for h in range(halves):
        idx = ", ".join(f"i32 {8 * h + i}" for i in range(8))
        lines.append(f"  %i{h} = shufflevector <{lanes} x i32> %c, <{lanes} x i32> poison, <8 x i32> <{idx}>")
        lines.append(f"  %m{h} = call <8 x float> @llvm.x86.avx2.permps({_MAGNITUDES}, <8 x i32> %i{h})")
    if halves == 2:
        idx = ", ".join(f"i32 {i}" for i in range(16))
        lines.append(f"  %m = shufflevector <8 x float> %m0, <8 x float> %m1, <16 x i32> <{idx}>")
    mag = "%m" if halves == 2 else "%m0"
    lines += [f"  %s = shl <{lanes} x i32> %c, splat (i32 28)",  # bit 3 -> the sign bit; the rest falls off
              f"  %sign = and <{lanes} x i32> %s, splat (i32 -2147483648)",
              f"  %bits = bitcast <{lanes} x float> {mag} to <{lanes} x i32>",
              f"  %v = or <{lanes} x i32> %bits, %sign",
              f"  %r = bitcast <{lanes} x i32> %v to <{lanes} x float>",
              f"  ret <{lanes} x float> %r", "}"]
    return "\n".join(lines) + "\n"


def lut_row(F: int, isa: str = "avx2"):
    """The decode of one panel row by table: lo, hi [F] = the even and odd k's weights of row j
    of group g (codes of w[e, fo, g, j, :], widened into cd [F] int32) times the group's scales sc [F]."""
    ll, fn = lut_ll(F, isa), lut_fn(F, isa)

    @T.macro
    def row(w, ve, fo, g, j, sc, lo, hi, cd):
        with T.attr(0, "pragma_import_llvm", ll):
            for f in T.vectorized(F):  # one contiguous load of the row's bytes
                cd[f] = T.Cast("int32", w[ve, fo, g, j, f])
            lanes = T.meta_var(T.ramp(T.int64(0), T.int64(1), F))  # an index, not a scalar
            lo[lanes] = T.call_extern(f"float32x{F}", fn, cd[lanes]) * sc[lanes]
            hi[lanes] = T.call_extern(f"float32x{F}", fn, T.shift_right(cd[lanes], T.Broadcast(4, F))) * sc[lanes]

    return row


def panel_decoder(NG: int, F: int, form: str | None, cols):
    """The decode of one expert's panel fo, all NG groups, into wb [NG * 32, F] float32: what a
    kernel reads when an expert holds two routed rows or more, so each weight is decoded once
    for all of them (once per tile of rows, the arithmetic cost of the decode bound a prefill;
    once per row, a decode step's experts routed to twice). The same values as the in-register
    decode, so a row sums the same products in the same k order."""
    by_table = form is not None  # a Python bool: the macro branches on it as it is parsed
    table_row = lut_row(F, form) if by_table else None

    @T.macro
    def decode_panel(w, ve, fo, wb, sc, lo, hi, cd):
        for g in range(NG):
            for f in cols(F):
                sc[f] = e8m0(T.Cast("int32", w[ve, fo, g, CODE_BYTES, f]))
            for j in range(CODE_BYTES):
                if by_table:
                    table_row(w, ve, fo, g, j, sc, lo, hi, cd)
                else:
                    for f in cols(F):
                        lo[f] = e2m1(low(w[ve, fo, g, j, f])) * sc[f]
                        hi[f] = e2m1(high(w[ve, fo, g, j, f])) * sc[f]
                for f in cols(F):
                    wb[g * G + 2 * j, f] = lo[f]
                    wb[g * G + 2 * j + 1, f] = hi[f]

    return decode_panel
