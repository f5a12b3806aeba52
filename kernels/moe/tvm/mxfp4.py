"""How the routed-expert kernels (moe/tvm/__init__.py) read MXFP4 experts: the stored bytes,
re-laid out in panels, decoded in registers (kernels/mxfp4/naive.py defines the format).

    panels [E, out / F, in / 32, 17, F] uint8    per group of 32 inputs and output feature f:
        bytes 0..15   the group's 32 codes as stored, two a byte (low nibble = even k)
        byte 16       the group's E8M0 scale byte

So a weight costs what it costs on disk (4.25 bits), and the panel of F features is read
contiguously, group by group. The backend builds the panels with reshapes, a permute and a
concat, weight-only work that the build lifts into the one-time parameter transform.
A weight is e2m1(code) * e8m0(scale), both built from bits (exact, as the definition is).
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
